"""The folder rules of workspaces, on a layout like the default one: the data folder inside the code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from sessions_app.folders import folder_check


@pytest.fixture
def layout(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Cachet's code at ``tmp_path/cachet``, its data at ``cachet/.cachet`` (as by default), the default root,
    and its virtual environment and Python beside the code."""
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path / "python"))
    code = tmp_path / "cachet"
    data = code / ".cachet"
    (data / "workspaces").mkdir(parents=True)
    (data / "pg").mkdir()
    settings.BASE_DIR = code
    settings.CACHET_DATA = data
    settings.STATIC_ROOT = data / "static"
    settings.CACHET_PROMPTS = code / "prompts"
    settings.CACHET_WORKSPACE_ROOTS = [data / "workspaces"]
    return tmp_path


def refusal(folder: str | Path, *, anywhere: bool = False) -> str:
    return folder_check(folder, anywhere=anywhere).refusal


def test_folders_under_the_default_root_are_allowed_though_it_lies_inside_the_code(layout: Path) -> None:
    workspaces = layout / "cachet" / ".cachet" / "workspaces"
    assert refusal(workspaces / "team") == ""
    assert refusal(workspaces / "team" / "not-made-yet") == ""
    assert refusal(workspaces) == ""
    checked = folder_check(f"{workspaces}/team/../team")
    assert checked.allowed and checked.folder == workspaces / "team"


@pytest.mark.parametrize(
    ("folder", "expected"),
    [
        ("/", "/ is the root of the file system"),
        ("/etc", "/etc is a system folder"),
        ("/etc/ssh", "/etc/ssh lies inside the system folder /etc"),
        ("/proc/1", "/proc/1 lies inside the system folder /proc"),
        ("/sys", "/sys is a system folder"),
        ("/usr/local/src", "/usr/local/src lies inside the system folder /usr"),
        ("/var/lib/postgresql", "/var/lib/postgresql lies inside the system folder /var/lib"),
        ("/var", "/var holds other people's or the system's folders: a workspace may lie inside it, not be it"),
        ("/home", "/home holds other people's or the system's folders: a workspace may lie inside it, not be it"),
        ("/root", "/root holds other people's or the system's folders: a workspace may lie inside it, not be it"),
        ("/tmp", "/tmp holds other people's or the system's folders: a workspace may lie inside it, not be it"),
        ("relative/ws", "'relative/ws' is not an absolute path"),
        ("", "'' is not an absolute path"),
    ],
)
def test_the_root_system_folders_and_shared_ones_are_refused_everywhere(
    layout: Path, folder: str, expected: str
) -> None:
    assert refusal(folder) == expected
    assert refusal(folder, anywhere=True) == expected


def test_cachets_own_code_data_and_environment_are_refused_inside_and_around(layout: Path) -> None:
    code = layout / "cachet"
    data = code / ".cachet"
    venv = layout / "venv"
    assert refusal(code, anywhere=True) == f"{code} is Cachet's code"
    assert refusal(code / "chat", anywhere=True) == f"{code}/chat lies inside Cachet's code ({code})"
    assert refusal(layout, anywhere=True) == f"{layout} holds Cachet's code ({code})"
    assert refusal(data, anywhere=True) == f"{data} is Cachet's data"
    assert refusal(data / "pg", anywhere=True) == f"{data}/pg lies inside Cachet's data ({data})"
    assert refusal(data / "static", anywhere=True) == f"{data}/static is Cachet's static files"
    assert refusal(venv, anywhere=True) == f"{venv} is Cachet's virtual environment"
    assert refusal(venv / "lib", anywhere=True) == f"{venv}/lib lies inside Cachet's virtual environment ({venv})"
    python = layout / "python"
    assert refusal(python / "lib", anywhere=True) == f"{python}/lib lies inside the Python Cachet runs on ({python})"


def test_a_data_folder_outside_the_code_is_refused_and_its_workspaces_stay_allowed(settings: Any, layout: Path) -> None:
    data = layout / "data"
    settings.CACHET_DATA = data
    settings.STATIC_ROOT = data / "static"
    settings.CACHET_WORKSPACE_ROOTS = [data / "workspaces"]
    assert refusal(data / "workspaces" / "team") == ""
    assert refusal(data / "secret_key", anywhere=True) == f"{data}/secret_key lies inside Cachet's data ({data})"
    assert refusal(data, anywhere=True) == f"{data} is Cachet's data"


def test_outside_the_roots_is_refused_unless_anywhere(settings: Any, layout: Path) -> None:
    elsewhere = layout / "projects" / "app"
    roots = ", ".join(str(root) for root in settings.CACHET_WORKSPACE_ROOTS)
    assert refusal(elsewhere) == (
        f"{elsewhere} is not under the workspace roots ({roots}); CACHET_WORKSPACE_ROOTS sets them"
    )
    assert refusal(elsewhere, anywhere=True) == ""
    settings.CACHET_WORKSPACE_ROOTS = [layout / "projects", layout / "other"]
    assert refusal(elsewhere) == ""


def test_a_root_that_holds_forbidden_folders_allows_none_of_them(settings: Any, layout: Path) -> None:
    settings.CACHET_WORKSPACE_ROOTS = [Path("/")]
    assert refusal("/etc") == "/etc is a system folder"
    assert refusal(layout / "cachet" / ".cachet" / "pg").endswith(
        "lies inside Cachet's data (" + str(layout) + "/cachet/.cachet)"
    )
    assert refusal(layout / "anything") == ""


def test_symlinks_are_resolved_before_the_rules(layout: Path) -> None:
    workspaces = layout / "cachet" / ".cachet" / "workspaces"
    (workspaces / "etc").symlink_to("/etc")
    (workspaces / "code").symlink_to(layout / "cachet")
    (workspaces / "real").mkdir()
    (workspaces / "alias").symlink_to(workspaces / "real")
    assert refusal(workspaces / "etc") == f"{workspaces}/etc leads to /etc: /etc is a system folder"
    assert refusal(workspaces / "code" / "chat") == (
        f"{workspaces}/code/chat leads to {layout}/cachet/chat: {layout}/cachet/chat lies inside Cachet's code "
        f"({layout}/cachet)"
    )
    checked = folder_check(workspaces / "alias")
    assert checked.allowed and checked.folder == workspaces / "real"
