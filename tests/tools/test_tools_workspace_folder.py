"""Each action opens its workspace's folder once, from ``/`` without following a link, and only under the roots:
a folder swapped for a symbolic link is refused, never followed (the audit's nested-workspace route)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from chat.tools import ToolContext, call_tool
from chat.tools.paths import open_workspace
from sessions_app.hygiene.outcomes import ErrorOutcome
from tests.sandbox_kit import for_commands


def answer(ctx: ToolContext, tool: str, **arguments: object) -> str:
    _, outcome = call_tool(tool, json.dumps(arguments), ctx)
    return outcome.message if isinstance(outcome, ErrorOutcome) else "done"


@pytest.fixture
def root_only(tmp_path: Path) -> Path:
    """A folder outside every root, closed to others (as root the audit used ``/root``)."""
    folder = tmp_path / "secret"
    folder.mkdir(mode=0o700)
    (folder / "key.txt").write_text("secret\n")
    return folder


def test_the_audits_probe_a_workspace_folder_swapped_for_a_link_is_refused(
    tmp_path: Path, make_ctx: Callable[..., ToolContext], root_only: Path
) -> None:
    """A command in workspace A replaced A's ``sub`` (the folder of workspace B) with a symlink to a root-only folder;
    B's session then read a root-only file and wrote one there."""
    outer = tmp_path / "a"
    inner = outer / "sub"
    inner.mkdir(parents=True)
    for_commands(outer)
    ctx = make_ctx(root=inner, roots=(str(tmp_path),))
    assert answer(ctx, "write", path="mine.txt", content="x\n") == "done"
    (inner / "mine.txt").unlink()
    inner.rmdir()
    inner.symlink_to(root_only)
    refused = (
        f"Refused: the workspace folder {inner} cannot be opened: {inner} is a symbolic link now, and a workspace is "
        "never reached through one. Staff must put the folder back or change the workspace."
    )
    assert answer(ctx, "read", path="key.txt") == refused
    assert answer(ctx, "write", path="planted.txt", content="x\n") == refused
    assert answer(ctx, "list") == refused
    assert answer(ctx, "grep", pattern="secret") == refused
    assert answer(ctx, "run", command="cat key.txt; touch planted.txt") == refused
    assert sorted(os.listdir(root_only)) == ["key.txt"]


def test_a_folder_on_the_way_swapped_for_a_link_is_refused(
    tmp_path: Path, make_ctx: Callable[..., ToolContext]
) -> None:
    real = tmp_path / "real" / "ws"
    real.mkdir(parents=True)
    ctx = make_ctx(root=tmp_path / "via" / "ws", roots=None)
    (tmp_path / "via").symlink_to(tmp_path / "real")
    assert answer(ctx, "list") == (
        f"Refused: the workspace folder {tmp_path}/via/ws cannot be opened: {tmp_path}/via is a symbolic link now, "
        "and a workspace is never reached through one. Staff must put the folder back or change the workspace."
    )


def test_a_folder_no_longer_under_the_roots_is_refused(tmp_path: Path, make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(roots=(str(tmp_path / "projects"), str(tmp_path / "more")))
    assert answer(ctx, "list") == (
        f"Refused: the workspace folder {ctx.root} is not under the workspace roots ({tmp_path}/projects, "
        f"{tmp_path}/more) any more. Staff must move the workspace or change CACHET_WORKSPACE_ROOTS."
    )
    assert answer(make_ctx(roots=(str(tmp_path),)), "list") == "done"


def test_open_workspace_gives_the_folder_itself(ws: Path) -> None:
    fd = open_workspace(str(ws), roots=None)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(ws))
    finally:
        os.close(fd)
    with pytest.raises(FileNotFoundError):
        open_workspace(str(ws / "missing"), roots=None)
