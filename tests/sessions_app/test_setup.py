from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from sessions_app.models import ModelEndpoint, Workspace
from sessions_app.selectors.sessions import endpoint_default
from sessions_app.services.setup import admin_seed, endpoint_seed, parse_workspaces, workspaces_seed


def test_parse_workspaces(tmp_path: Path) -> None:
    assert parse_workspaces(f"a={tmp_path}, b = {tmp_path}/b ") == [("a", tmp_path), ("b", tmp_path / "b")]
    assert parse_workspaces("") == []
    with pytest.raises(ValueError, match="not name=/folder"):
        parse_workspaces("nofolder")


@pytest.mark.django_db
def test_seeding_is_idempotent(tmp_path: Path, settings: Any) -> None:
    settings.CACHET_WORKSPACE_ROOTS = [tmp_path]
    workspaces_seed(spec=f"team={tmp_path}/team", default_folder=tmp_path / "scratch")
    workspaces_seed(spec=f"team={tmp_path}/team", default_folder=tmp_path / "scratch")
    assert list(Workspace.objects.values_list("name", flat=True)) == ["team"]
    assert (tmp_path / "team").is_dir()
    first = endpoint_seed(base_url="http://127.0.0.1:8080/v1/", model="")
    again = endpoint_seed(base_url="http://127.0.0.1:8080/v1", model="qwen")
    assert first.pk == again.pk and ModelEndpoint.objects.get().model == "qwen"


@pytest.mark.django_db
def test_seeding_refuses_folders_outside_the_roots_or_forbidden_and_seeds_the_others(
    tmp_path: Path, settings: Any
) -> None:
    root = tmp_path / "workspaces"
    settings.CACHET_WORKSPACE_ROOTS = [root]
    before = Workspace.objects.create(name="old", folder=str(root / "old"))
    spec = f"team={root}/team, etc=/etc, old=/, code={settings.BASE_DIR}, away={tmp_path}/away, docs={root}/docs"
    seeded = workspaces_seed(spec=spec, default_folder=root / "scratch")
    assert [workspace.name for workspace in seeded.workspaces] == ["team", "docs"]
    assert [(refused.name, refused.folder, refused.reason) for refused in seeded.refused] == [
        ("etc", "/etc", "/etc is a system folder"),
        ("old", "/", "/ is the root of the file system"),
        ("code", str(settings.BASE_DIR), f"{settings.BASE_DIR} is Cachet's code"),
        (
            "away",
            f"{tmp_path}/away",
            f"{tmp_path}/away is not under the workspace roots ({root}); CACHET_WORKSPACE_ROOTS sets them",
        ),
    ]
    assert sorted(Workspace.objects.values_list("name", "folder")) == [
        ("docs", f"{root}/docs"),
        ("old", f"{root}/old"),  # a refused seed leaves the stored row as it was
        ("team", f"{root}/team"),
    ]
    assert Workspace.objects.get(name="old").pk == before.pk
    assert (root / "team").is_dir() and not (tmp_path / "away").exists(), "no folder is made for a refused seed"


@pytest.mark.django_db
def test_the_default_endpoint_follows_the_environment_at_every_start() -> None:
    first = endpoint_seed(base_url="http://127.0.0.1:8080/v1", model="")
    assert (first.name, first.base_url, first.model) == ("default", "http://127.0.0.1:8080/v1", "")
    staff_made = ModelEndpoint.objects.create(name="gpu", base_url="http://gpu-box:8000/v1", model="qwen3")
    ModelEndpoint.objects.filter(pk=first.pk).update(model="set-in-the-admin", context_window=32768, api_key="k")
    same_url = endpoint_seed(base_url="http://127.0.0.1:8080/v1", model="")
    assert same_url.model == "set-in-the-admin", "an unset CACHET_MODEL keeps the admin's model while the URL stays"
    moved = endpoint_seed(base_url="http://model-box:8080/v1/", model="")
    assert moved.pk == first.pk and moved.base_url == "http://model-box:8080/v1"
    assert moved.model == "", "the old server's model goes with its URL"
    named = endpoint_seed(base_url="http://model-box:8080/v1", model="llama")
    assert named.pk == first.pk and named.model == "llama"
    assert sorted(ModelEndpoint.objects.values_list("name", "base_url", "model", "context_window", "api_key")) == [
        ("default", "http://model-box:8080/v1", "llama", 32768, "k"),
        ("gpu", "http://gpu-box:8000/v1", "qwen3", 8192, ""),
    ]
    assert ModelEndpoint.objects.get(pk=staff_made.pk).base_url == "http://gpu-box:8000/v1"


@pytest.mark.django_db
def test_without_the_environments_url_the_default_endpoint_keeps_what_staff_set() -> None:
    """The audit's admin changed the default endpoint's URL; every start set it back to :8080, and the next message
    in an open tab failed. Unset, ``CACHET_MODEL_URL`` makes the endpoint once (at the first URL) and leaves it."""
    made = endpoint_seed(base_url="", model="", first_url="http://127.0.0.1:8080/v1/")
    assert (made.name, made.base_url, made.model) == ("default", "http://127.0.0.1:8080/v1", "")
    ModelEndpoint.objects.filter(pk=made.pk).update(base_url="http://gpu-box:8080/v1", model="qwen3")
    again = endpoint_seed(base_url="", model="", first_url="http://127.0.0.1:8080/v1")
    assert (again.pk, again.base_url, again.model) == (made.pk, "http://gpu-box:8080/v1", "qwen3")
    named = endpoint_seed(base_url="", model="llama", first_url="http://127.0.0.1:8080/v1")
    assert (named.base_url, named.model) == ("http://gpu-box:8080/v1", "llama"), "CACHET_MODEL alone sets the model"
    told = endpoint_seed(base_url="http://model-box:8080/v1", model="", first_url="http://127.0.0.1:8080/v1")
    assert (told.pk, told.base_url, told.model) == (made.pk, "http://model-box:8080/v1", "")


@pytest.mark.django_db
def test_the_default_endpoint_is_the_one_named_default_else_the_oldest() -> None:
    assert endpoint_default() is None
    oldest = ModelEndpoint.objects.create(name="a-first", base_url="http://a:1/v1")
    ModelEndpoint.objects.create(name="b-second", base_url="http://b:1/v1")
    assert endpoint_default() == oldest
    default = endpoint_seed(base_url="http://c:1/v1", model="")
    assert endpoint_default() == default


@pytest.mark.django_db
def test_first_admin_gets_a_random_password_once() -> None:
    password = admin_seed()
    assert password and len(password) >= 12
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password(password)
    assert admin_seed() is None


def test_secret_key_is_not_in_the_code() -> None:
    settings_source = (Path(__file__).resolve().parents[2] / "cachet" / "settings.py").read_text()
    assert 'SECRET_KEY = "' not in settings_source and "django-insecure" not in settings_source
