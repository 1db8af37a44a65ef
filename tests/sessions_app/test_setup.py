from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from sessions_app.models import ModelEndpoint, Workspace
from sessions_app.services.setup import admin_seed, endpoint_seed, parse_workspaces, workspaces_seed


def test_parse_workspaces(tmp_path: Path) -> None:
    assert parse_workspaces(f"a={tmp_path}, b = {tmp_path}/b ") == [("a", tmp_path), ("b", tmp_path / "b")]
    assert parse_workspaces("") == []
    with pytest.raises(ValueError, match="not name=/folder"):
        parse_workspaces("nofolder")


@pytest.mark.django_db
def test_seeding_is_idempotent(tmp_path: Path) -> None:
    workspaces_seed(spec=f"team={tmp_path}/team", default_folder=tmp_path / "scratch")
    workspaces_seed(spec=f"team={tmp_path}/team", default_folder=tmp_path / "scratch")
    assert list(Workspace.objects.values_list("name", flat=True)) == ["team"]
    assert (tmp_path / "team").is_dir()
    first = endpoint_seed(base_url="http://127.0.0.1:8080/v1/", model="")
    again = endpoint_seed(base_url="http://127.0.0.1:8080/v1", model="qwen")
    assert first.pk == again.pk and ModelEndpoint.objects.get().model == "qwen"


@pytest.mark.django_db
def test_first_admin_gets_a_random_password_once() -> None:
    password = admin_seed()
    assert password and len(password) >= 12
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password(password)
    assert admin_seed() is None


@pytest.mark.django_db
def test_serve_sets_up_and_prints_how_to_log_in(settings: Any, tmp_path: Path) -> None:
    settings.CACHET_WORKSPACES = ""
    settings.CACHET_DATA = tmp_path
    settings.STATIC_ROOT = tmp_path / "static"
    out = io.StringIO()
    call_command("serve", "--no-serve", stdout=out)
    text = out.getvalue()
    assert "Log in at http://127.0.0.1:8000/ as admin with password " in text
    assert Workspace.objects.get().name == "scratch"
    assert (tmp_path / "static" / "cachet" / "cachet.css").exists()


def test_secret_key_is_not_in_the_code() -> None:
    settings_source = (Path(__file__).resolve().parents[2] / "cachet" / "settings.py").read_text()
    assert 'SECRET_KEY = "' not in settings_source and "django-insecure" not in settings_source
