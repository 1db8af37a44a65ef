"""``manage.py serve --no-serve``: what it sets up and the lines it prints, which people script against."""

from __future__ import annotations

import errno
import io
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from chat.tools import acl
from sessions_app.models import ModelEndpoint, Workspace
from sessions_app.services.workspaces import workspace_private
from testing.scripted_server import ScriptedServer
from tests.sandbox_kit import sandbox_ids

pytestmark = pytest.mark.django_db


def closed_port() -> int:
    """A loopback port nothing listens on: connecting to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve(settings: Any, tmp_path: Path, *, url: str, model: str = "", workspaces: str = "") -> list[str]:
    settings.CACHET_WORKSPACES = workspaces
    settings.CACHET_DATA = tmp_path
    settings.STATIC_ROOT = tmp_path / "static"
    settings.CACHET_WORKSPACE_ROOTS = [tmp_path / "workspaces", tmp_path / "srv"]
    settings.CACHET_MODEL_URL = url
    settings.CACHET_MODEL = model
    out = io.StringIO()
    call_command("serve", "--no-serve", stdout=out, stderr=out)
    return out.getvalue().splitlines()


def test_serve_sets_up_and_prints_how_to_log_in(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(Path.cwd() / ".venv" / "bin" / "python"))
    lines = serve(settings, tmp_path, url=f"http://127.0.0.1:{closed_port()}/v1")
    assert any("Log in at http://127.0.0.1:8000/ as admin with password " in line for line in lines)
    assert "Change it with: .venv/bin/python manage.py changepassword admin" in lines, "a command that works as typed"
    assert Workspace.objects.get().name == "scratch"
    assert (tmp_path / "static" / "cachet" / "cachet.css").exists()


def test_serve_says_which_seeded_workspace_it_refused_and_goes_on(settings: Any, tmp_path: Path) -> None:
    spec = f"team={tmp_path}/workspaces/team,etc=/etc,data={tmp_path}/pg"
    lines = serve(settings, tmp_path, url=f"http://127.0.0.1:{closed_port()}/v1", workspaces=spec)
    assert "Workspace etc: not seeded, Cachet may not use /etc (/etc is a system folder)." in lines
    assert (
        f"Workspace data: not seeded, Cachet may not use {tmp_path}/pg ({tmp_path}/pg lies inside Cachet's data "
        f"({tmp_path}))."
    ) in lines
    assert f"Workspace team: {tmp_path}/workspaces/team" in lines
    assert any("Log in at http://127.0.0.1:8000/" in line for line in lines), "serve goes on"
    assert list(Workspace.objects.values_list("name", flat=True)) == ["team"]


def test_every_start_says_which_workspaces_it_has_not_only_the_first(settings: Any, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    scratch = f"Workspace scratch: {tmp_path}/workspaces/scratch"
    assert scratch in serve(settings, tmp_path, url=url)
    workspace_private(user=User.objects.create_user("ada"))
    again = serve(settings, tmp_path, url=url)
    assert scratch in again, "a start after the first lists the shared workspaces too"
    assert "Private workspaces: 1, one for each person who has used Cachet." in again
    assert not any(line.startswith("Workspace ada's files: /") for line in again), "counted, not each listed"


def test_start_up_says_which_endpoints_answer_and_the_default_follows_the_environment(
    settings: Any, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    with ScriptedServer(model="alpha", listed=["alpha", "beta"]) as model:
        ModelEndpoint.objects.create(name="gpu", base_url=dead, model="qwen3")
        ModelEndpoint.objects.create(name="wrong-path", base_url=f"http://127.0.0.1:{model.port}/nothing")
        first = serve(settings, tmp_path, url=model.base_url)
        assert f"Model endpoint default: {model.base_url} (from /v1/models)" in first, "the line of before stays"
        assert f"Model endpoint default: {model.base_url} answers, models: alpha, beta" in first
        assert (
            f"Model endpoint gpu: {dead} does not answer (connection refused); sessions on it will fail until it "
            "does. Change it in the admin."
        ) in first
        assert (
            f"Model endpoint wrong-path: http://127.0.0.1:{model.port}/nothing answers but lists no models "
            "(HTTP 404: File Not Found: /nothing/models); sessions on it may fail. Change it in the admin."
        ) in first
        assert first.index(f"Model endpoint default: {model.base_url} answers, models: alpha, beta") < first.index(
            f"Model endpoint gpu: {dead} does not answer (connection refused); sessions on it will fail until it "
            "does. Change it in the admin."
        ), "the default endpoint first"
        second = serve(settings, tmp_path, url=dead, model="qwen3")
    assert f"Model endpoint default: {dead} qwen3" in second
    assert sorted(ModelEndpoint.objects.values_list("name", "base_url", "model")) == [
        ("default", dead, "qwen3"),
        ("gpu", dead, "qwen3"),
        ("wrong-path", f"http://127.0.0.1:{model.port}/nothing", ""),
    ]
    ModelEndpoint.objects.filter(name="default").update(model="")
    third = serve(settings, tmp_path, url=dead, model="")
    assert f"Model endpoint default: {dead} (from /v1/models once it answers)" in third, "it claims no listing"
    assert (
        f"Model endpoint default: {dead} does not answer (connection refused); sessions on it will fail until it "
        "does. Set CACHET_MODEL_URL or change it in the admin."
    ) in second


def test_start_up_says_each_endpoints_window_and_where_it_comes_from(settings: Any, tmp_path: Path) -> None:
    with ScriptedServer(n_ctx=4096) as small, ScriptedServer(model="quiet") as quiet:
        ModelEndpoint.objects.create(name="quiet", base_url=quiet.base_url, context_window=16384)
        lines = serve(settings, tmp_path, url=small.base_url)
    assert (
        "Model endpoint default: context window 4,096 tokens, read from the server (llama.cpp /props n_ctx; configured "
        "8,192)" in lines
    )
    assert (
        "Model endpoint quiet: context window 16,384 tokens, as configured (the server does not say its own)" in lines
    )


def test_as_root_serve_gives_the_workspaces_it_keeps_to_the_sandbox_user(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = sandbox_ids()
    if ids is None:
        pytest.skip("only root gives folders to the user commands run as")
    lines = serve(settings, tmp_path, url=f"http://127.0.0.1:{closed_port()}/v1")
    scratch = tmp_path / "workspaces" / "scratch"
    assert f"Workspace scratch: gave {scratch} to cachet-sandbox, the user its commands run as." in lines
    outside = tmp_path / "workspaces" / "team"
    outside.mkdir(parents=True)
    (outside / "notes.md").write_text("kept\n")
    team = Workspace.objects.create(name="team", folder=str(outside), allow_commands=True)
    again = serve(settings, tmp_path, url=f"http://127.0.0.1:{closed_port()}/v1")
    assert [line for line in again if " gave " in line] == [
        f"Workspace team: gave {outside} to cachet-sandbox, the user its commands run as."
    ]
    assert (outside / "notes.md").stat().st_uid == ids[0] and scratch.stat().st_uid == ids[0]
    mine = tmp_path / "srv" / "mine"
    mine.mkdir(parents=True)
    team.folder = str(mine)
    team.save()
    lines = serve(settings, tmp_path, url=f"http://127.0.0.1:{closed_port()}/v1")
    closed = next(parent for parent in reversed(mine.parents) if not parent.stat().st_mode & 0o001)
    assert f"Workspace team: commands run as cachet-sandbox, who may not enter {closed}." in lines
    for parent in mine.parents:
        parent.chmod(parent.stat().st_mode | 0o001)
    (mine / "notes.md").write_text("root's\n")
    lines = serve(settings, tmp_path, url=f"http://127.0.0.1:{closed_port()}/v1")
    assert (
        f"Workspace team: commands run as cachet-sandbox; gave it access to {mine} with ACLs (ownership unchanged)."
    ) in lines
    assert mine.stat().st_uid == 0 and (mine / "notes.md").stat().st_uid == 0
    assert (acl.USER, 6, ids[0]) in (acl.read(str(mine / "notes.md")) or [])
    lines = serve(settings, tmp_path, url=f"http://127.0.0.1:{closed_port()}/v1")
    assert [line for line in lines if "Workspace team: commands" in line] == [], "said once: it may write it now"
    bare = tmp_path / "srv" / "bare"
    bare.mkdir()
    team.folder = str(bare)
    team.save()
    real_getxattr = os.getxattr

    def unsupported(target: Any, name: str, *args: Any) -> Any:
        if name.startswith("system.posix_acl"):
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        return real_getxattr(target, name, *args)

    monkeypatch.setattr(os, "getxattr", unsupported)
    monkeypatch.setattr(os, "setxattr", unsupported)
    lines = serve(settings, tmp_path, url=f"http://127.0.0.1:{closed_port()}/v1")
    assert (
        f"Workspace team: Commands cannot run in this workspace: they run as the user cachet-sandbox, who may not "
        f"write {bare}, and its file system keeps no ACLs to give that user access with. Give it the folder "
        f"(chown -R cachet-sandbox: {bare}), or remount the file system with ACLs (mount -o remount,acl) and try "
        "again."
    ) in lines


def test_as_root_serve_never_opens_a_workspace_folder_swapped_for_a_link(settings: Any, tmp_path: Path) -> None:
    """The audit swapped a workspace's folder for a link to a root-only folder outside every root; the next start
    of serve gave the sandbox user access to the link's target with ACLs. It opens the folder as an action does:
    never through a link, and only under the roots."""
    if sandbox_ids() is None:
        pytest.skip("only root opens folders to the user commands run as")
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    (secret / "key").write_text("root's\n")
    folder = tmp_path / "srv" / "team"
    folder.mkdir(parents=True)
    Workspace.objects.create(name="team", folder=str(folder), allow_commands=True)
    folder.rmdir()
    folder.symlink_to(secret)
    lines = serve(settings, tmp_path, url=f"http://127.0.0.1:{closed_port()}/v1")
    assert (
        f"Workspace team: Refused: the workspace folder {folder} cannot be opened: {folder} is a symbolic link now, "
        "and a workspace is never reached through one. Staff must put the folder back or change the workspace."
    ) in lines
    assert acl.read(str(secret)) in (None, []) and acl.read(str(secret / "key")) in (None, [])
    Workspace.objects.filter(name="team").update(folder=str(secret))
    lines = serve(settings, tmp_path, url=f"http://127.0.0.1:{closed_port()}/v1")
    assert any(
        line.startswith(f"Workspace team: Refused: the workspace folder {secret} is not under") for line in lines
    )
    assert acl.read(str(secret)) in (None, [])


def test_a_start_without_cachet_model_url_keeps_the_endpoint_staff_set(settings: Any, tmp_path: Path) -> None:
    """The audit's admin pointed the default endpoint at another server; the next start (``./run``, a second web
    process) set it back to :8080. Without ``CACHET_MODEL_URL`` a start makes it once and leaves it."""
    settings.CACHET_DEFAULT_MODEL_URL = f"http://127.0.0.1:{closed_port()}/v1"
    first = serve(settings, tmp_path, url="")
    assert f"Model endpoint default: {settings.CACHET_DEFAULT_MODEL_URL} (from /v1/models once it answers)" in first
    with ScriptedServer([]) as model_server:
        ModelEndpoint.objects.filter(name="default").update(base_url=model_server.base_url, model="staff-chose")
        again = serve(settings, tmp_path, url="")
        assert f"Model endpoint default: {model_server.base_url} staff-chose" in again, again
        assert ModelEndpoint.objects.get(name="default").base_url == model_server.base_url
    told = serve(settings, tmp_path, url=settings.CACHET_DEFAULT_MODEL_URL)
    assert ModelEndpoint.objects.get(name="default").base_url == settings.CACHET_DEFAULT_MODEL_URL, told


def test_serving_every_address_answers_the_machines_own_names(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's ``--host 0.0.0.0`` "to serve the LAN" answered 400 to every page until ALLOWED_HOSTS and
    CSRF_TRUSTED_ORIGINS were set as well: it now answers the machine's own names and addresses, and says them."""
    from django.test import Client

    from chat.web.lan import machine_names

    names = machine_names()
    assert names, "this machine has a name others reach it by"
    monkeypatch.delenv("ALLOWED_HOSTS", raising=False)
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
    settings.CACHET_WORKSPACES = ""
    settings.CACHET_DATA = tmp_path
    settings.STATIC_ROOT = tmp_path / "static"
    settings.CACHET_MODEL_URL = f"http://127.0.0.1:{closed_port()}/v1"
    out = io.StringIO()
    call_command("serve", "--no-serve", "--host", "0.0.0.0", "--port", "8123", stdout=out, stderr=out)
    lines = out.getvalue().splitlines()
    urls = ", ".join(f"http://{name}:8123/" for name in names)
    assert any(line.startswith(f"Serving every address of this machine: {urls}. It answers these") for line in lines)
    assert any(f"Log in at http://{names[0]}:8123/ as admin" in line for line in lines), lines
    for name in names:
        assert Client().get("/login/", HTTP_HOST=f"{name}:8123").status_code == 200, name
    assert Client().get("/login/", HTTP_HOST="elsewhere.example:8123").status_code == 400


def test_run_help_names_cachets_settings() -> None:
    """``./run --help`` was Django's alone and named none of Cachet's settings."""
    from chat.management.commands.serve import Command

    shown = Command().create_parser("manage.py", "serve").format_help()
    for name in ("CACHET_MODEL_URL", "CACHET_DATA", "DATABASE_URL", "REDIS_URL", "ALLOWED_HOSTS", "CACHET_HOST"):
        assert name in shown, name
    assert "docs/deployment.md" in shown
