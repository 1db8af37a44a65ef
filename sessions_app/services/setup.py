"""Seeding what the environment configures: workspaces, the default model endpoint, the first admin."""

from __future__ import annotations

import secrets
from pathlib import Path

from django.contrib.auth import get_user_model
from django.db import transaction

from sessions_app.models import ModelEndpoint, Workspace


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


@transaction.atomic
def workspaces_seed(*, spec: str, default_folder: Path) -> list[Workspace]:
    """Create or update the configured workspaces; with none configured and none stored, one default."""
    pairs = parse_workspaces(spec)
    if not pairs and not Workspace.objects.exists():
        pairs = [("scratch", default_folder)]
    seeded = []
    for name, folder in pairs:
        folder.mkdir(parents=True, exist_ok=True)
        workspace, _ = Workspace.objects.update_or_create(name=name, defaults={"folder": str(folder)})
        seeded.append(workspace)
    return seeded


@transaction.atomic
def endpoint_seed(*, base_url: str, model: str) -> ModelEndpoint:
    """The endpoint the environment names, created once; staff edit it in the admin after that."""
    existing = ModelEndpoint.objects.filter(base_url=base_url.rstrip("/")).first()
    if existing is not None:
        if model and existing.model != model:
            existing.model = model
            existing.save(update_fields=["model"])
        return existing
    name = "default" if not ModelEndpoint.objects.filter(name="default").exists() else base_url
    return ModelEndpoint.objects.create(name=name[:100], base_url=base_url.rstrip("/"), model=model)


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
