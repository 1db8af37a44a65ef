"""Seeding what the environment configures: workspaces, the default model endpoint, the first admin."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from sessions_app.folders import folder_check
from sessions_app.models import DEFAULT_ENDPOINT_NAME, ModelEndpoint, Workspace
from sessions_app.selectors.sessions import workspace_nesting
from sessions_app.services.workspaces import workspace_folders_lock


def parse_workspaces(spec: str) -> list[tuple[str, Path]]:
    """``name=/folder,name2=/folder2`` as pairs; a malformed item raises ``ValueError`` naming it."""
    pairs: list[tuple[str, Path]] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, sep, folder = item.partition("=")
        if not sep or not name.strip() or not folder.strip():
            raise ValueError(f"CACHET_WORKSPACES item {item!r} is not name=/folder")
        pairs.append((name.strip(), Path(folder.strip()).expanduser().resolve()))
    return pairs


@dataclass(frozen=True)
class SeedRefused:
    """A configured workspace left as it was (or not made): its folder is one Cachet may not use."""

    name: str
    folder: str
    reason: str


@dataclass(frozen=True)
class Seeded:
    workspaces: list[Workspace] = field(default_factory=list)
    refused: list[SeedRefused] = field(default_factory=list)


@transaction.atomic
def workspaces_seed(*, spec: str, default_folder: Path) -> Seeded:
    """Create or update the configured workspaces; with none configured and none stored, one default. A new one
    is open to everyone (staff close it in the admin; later starts leave that as staff set it). A folder outside
    ``CACHET_WORKSPACE_ROOTS``, refused by the folder rules or nesting with another workspace's is not seeded, and
    said."""
    pairs = parse_workspaces(spec)
    if not pairs and not Workspace.objects.exists():
        pairs = [("scratch", default_folder)]
    seeded = Seeded()
    workspace_folders_lock()
    for name, folder in pairs:
        checked = folder_check(folder)
        same = Workspace.objects.filter(name=name).values_list("pk", flat=True).first()
        refusal = checked.refusal or workspace_nesting(folder=checked.folder, excluding=same)
        if refusal:
            seeded.refused.append(SeedRefused(name=name, folder=str(folder), reason=refusal))
            continue
        checked.folder.mkdir(parents=True, exist_ok=True)
        workspace, _ = Workspace.objects.update_or_create(
            name=name,
            defaults={"folder": str(checked.folder)},
            create_defaults={"folder": str(checked.folder), "open_to_everyone": True},
        )
        seeded.workspaces.append(workspace)
    return seeded


@transaction.atomic
def endpoint_seed(*, base_url: str, model: str, first_url: str = "") -> ModelEndpoint:
    """The endpoint named ``default``, made where missing (at ``base_url``, else ``first_url``). A ``base_url``
    given is the environment's and is set at every start (its server's model going with an old URL); an empty one
    leaves the URL as staff set it. A ``model`` given is set too; an empty one keeps the admin's. Other endpoints are
    left as they are."""
    base_url = base_url.rstrip("/")
    endpoint = ModelEndpoint.objects.select_for_update().filter(name=DEFAULT_ENDPOINT_NAME).first()
    if endpoint is None:
        url = base_url or first_url.rstrip("/")
        return ModelEndpoint.objects.create(name=DEFAULT_ENDPOINT_NAME, base_url=url, model=model)
    if base_url and endpoint.base_url != base_url:
        endpoint.base_url = base_url
        endpoint.model = model
    elif model:
        endpoint.model = model
    endpoint.save(update_fields=["base_url", "model"])
    return endpoint


@transaction.atomic
def admin_seed(*, username: str = "admin") -> str | None:
    """Create the first admin with a random password when no superuser exists; return the password."""
    users = get_user_model()
    if users.objects.filter(is_superuser=True).exists():
        return None
    password = secrets.token_urlsafe(12)
    user = users.objects.filter(username=username).first()
    if user is None:
        users.objects.create_superuser(username=username, email="", password=password)
    else:
        user.is_staff = True
        user.is_superuser = True
        user.set_password(password)
        user.save()
    return password


@transaction.atomic
def endpoint_window_record(
    *, endpoint: ModelEndpoint, url: str, tokens: int | None, how: str = "", vision: bool | None = None
) -> ModelEndpoint:
    """Keep what the server at ``url`` says its context window is (``None``: it does not say), where it said it,
    and when; and whether it said its model reads images (``vision``, ``None``: it did not say)."""
    endpoint.server_context_window = tokens
    endpoint.server_window_url = url
    endpoint.server_window_how = how if tokens else ""
    endpoint.server_window_read_at = timezone.now()
    endpoint.server_reads_images = vision
    ModelEndpoint.objects.filter(pk=endpoint.pk).update(
        server_context_window=tokens,
        server_window_url=url,
        server_window_how=endpoint.server_window_how,
        server_window_read_at=endpoint.server_window_read_at,
        server_reads_images=vision,
    )
    return endpoint


def endpoint_window_forget(*, endpoint: ModelEndpoint) -> ModelEndpoint:
    """Have the window asked again before its next use (the server went away: it may come back with another)."""
    endpoint.server_window_read_at = None
    ModelEndpoint.objects.filter(pk=endpoint.pk).update(server_window_read_at=None)
    return endpoint
