from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.tools import ToolContext, ToolError, call_tool, resolve_in_workspace
from sessions_app.hygiene.outcomes import ErrorOutcome, ListingOutcome, ReadOutcome

SECRET = "TOP-SECRET-OUTSIDE"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the workspace, holding a secret file that no tool may read, list or change."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text(SECRET + "\n")
    return folder.resolve()


@pytest.fixture
def linked(ws: Path, outside: Path) -> Path:
    (ws / "inner").mkdir()
    (ws / "inner" / "note.txt").write_text("inside\n")
    (ws / "link_out").symlink_to(outside)
    (ws / "secret_link").symlink_to(outside / "secret.txt")
    (ws / "link_in").symlink_to(ws / "inner")
    (ws / "note_link").symlink_to("inner/note.txt")
    (ws / "loop_a").symlink_to(ws / "loop_b")
    (ws / "loop_b").symlink_to(ws / "loop_a")
    (ws / "dangling_out").symlink_to(outside / "missing" / "new.txt")
    return ws


def call(name: str, arguments: Mapping[str, object], ctx: ToolContext) -> object:
    return call_tool(name, json.dumps(arguments), ctx)[1]


def test_relative_and_absolute_inside(linked: Path, ctx: ToolContext) -> None:
    assert resolve_in_workspace("inner/note.txt", ctx) == linked / "inner" / "note.txt"
    assert resolve_in_workspace(str(linked / "inner"), ctx) == linked / "inner"
    assert resolve_in_workspace(".", ctx) == linked
    assert resolve_in_workspace("inner/../inner/./note.txt", ctx) == linked / "inner" / "note.txt"
    assert resolve_in_workspace("link_in/note.txt", ctx) == linked / "inner" / "note.txt"
    assert resolve_in_workspace("link_out/../ws/inner", ctx) == linked / "inner"
    assert resolve_in_workspace("new/folder/file.txt", ctx) == linked / "new" / "folder" / "file.txt"


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ("../outside/secret.txt", "outside/secret.txt"),
        ("..", ""),
        ("inner/../../outside", "outside"),
        ("link_out/secret.txt", "outside/secret.txt"),
        ("link_out", "outside"),
        ("secret_link", "outside/secret.txt"),
        ("link_out/new.txt", "outside/new.txt"),
        ("dangling_out", "outside/missing/new.txt"),
    ],
)
def test_escapes_are_refused_naming_the_resolved_path(linked: Path, ctx: ToolContext, given: str, named: str) -> None:
    expected = os.path.join(linked.parent, named) if named else str(linked.parent)
    with pytest.raises(ToolError) as caught:
        resolve_in_workspace(given, ctx)
    assert caught.value.message == f"Refused: {expected} is outside the workspace."


def test_absolute_outside_is_refused(outside: Path, ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="is outside the workspace"):
        resolve_in_workspace(str(outside / "secret.txt"), ctx)
    with pytest.raises(ToolError, match="is outside the workspace"):
        resolve_in_workspace("/etc/passwd", ctx)


@pytest.mark.parametrize("given", ["", "a\x00b", "\ud800"])
def test_invalid_paths_are_refused(ctx: ToolContext, given: str) -> None:
    with pytest.raises(ToolError) as caught:
        resolve_in_workspace(given, ctx)
    assert caught.value.message == f"Refused: the path {given!r} is not valid."


def test_symlink_loop_is_refused(linked: Path, ctx: ToolContext) -> None:
    with pytest.raises(ToolError) as caught:
        resolve_in_workspace("loop_a", ctx)
    assert caught.value.message == f"Refused: {linked}/loop_a is a symbolic link loop."
    with pytest.raises(ToolError, match="symbolic link loop"):
        resolve_in_workspace("loop_b/x/y", ctx)
    with pytest.raises(ToolError) as caught:
        resolve_in_workspace("loop_a/../link_out/secret.txt", ctx)
    assert caught.value.message == f"Refused: {linked}/loop_a/../link_out/secret.txt is a symbolic link loop."


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("read", {"path": "link_out/secret.txt"}),
        ("read", {"path": "secret_link"}),
        ("read", {"path": "../outside/secret.txt"}),
        ("list", {"path": "link_out"}),
        ("list", {"path": ".."}),
        ("glob", {"pattern": "*", "path": "link_out"}),
        ("glob", {"pattern": "../outside/*"}),
        ("grep", {"pattern": "SECRET", "path": "link_out"}),
        ("grep", {"pattern": "SECRET", "path": "secret_link"}),
        ("edit", {"path": "link_out/secret.txt", "old_string": "TOP", "new_string": "X"}),
        ("edit", {"path": "secret_link", "old_string": "TOP", "new_string": "X"}),
        ("multiedit", {"path": "secret_link", "edits": [{"old_string": "TOP", "new_string": "X"}]}),
        ("write", {"path": "secret_link", "content": "gone"}),
        ("write", {"path": "link_out/new.txt", "content": "new"}),
        ("write", {"path": "dangling_out", "content": "new"}),
        ("write", {"path": "../outside/new.txt", "content": "new"}),
        ("apply_patch", {"patch": "*** Begin Patch\n*** Delete File: secret_link\n*** End Patch"}),
        ("apply_patch", {"patch": "*** Begin Patch\n*** Add File: link_out/x.txt\n+x\n*** End Patch"}),
        (
            "apply_patch",
            {"patch": "*** Begin Patch\n*** Update File: link_out/secret.txt\n@@\n-" + SECRET + "\n+x\n*** End Patch"},
        ),
        (
            "apply_patch",
            {
                "patch": "*** Begin Patch\n*** Update File: inner/note.txt\n*** Move to: link_out/moved.txt\n"
                "@@\n-inside\n+moved\n*** End Patch"
            },
        ),
    ],
)
def test_no_tool_reaches_outside(
    linked: Path, outside: Path, ctx: ToolContext, name: str, arguments: dict[str, object]
) -> None:
    before_outside, before_inside = snapshot(outside), snapshot(linked / "inner")
    outcome = call(name, arguments, ctx)
    assert isinstance(outcome, ErrorOutcome)
    assert "outside the workspace" in outcome.message
    assert SECRET not in outcome.message
    assert snapshot(outside) == before_outside
    assert snapshot(linked / "inner") == before_inside
    assert sorted(os.listdir(outside)) == ["secret.txt"]


def test_walks_do_not_follow_links_out(linked: Path, ctx: ToolContext) -> None:
    listing = call("list", {}, ctx)
    assert isinstance(listing, ListingOutcome)
    assert listing.body.split("\n") == [
        f"{linked}/dangling_out",
        f"{linked}/inner/",
        f"{linked}/link_in/",
        f"{linked}/link_out",
        f"{linked}/loop_a",
        f"{linked}/loop_b",
        f"{linked}/note_link",
        f"{linked}/secret_link",
    ]
    found = call("glob", {"pattern": "**/*"}, ctx)
    assert isinstance(found, ListingOutcome)
    assert found.body == f"{linked}/inner/note.txt\n{linked}/note_link"
    matches = call("grep", {"pattern": "."}, ctx)
    assert isinstance(matches, ListingOutcome)
    assert matches.body == f"{linked}/inner/note.txt:1: inside", "grep (ripgrep) follows no symlink, not even inside"
    assert call("grep", {"pattern": ".", "path": "note_link"}, ctx) == ListingOutcome(
        f"{linked}/inner/note.txt:1: inside"
    )
    assert SECRET not in call("grep", {"pattern": "SECRET"}, ctx).body  # type: ignore[attr-defined]


SEGMENTS = st.sampled_from(
    [
        "..",
        ".",
        "",
        "inner",
        "note.txt",
        "secret.txt",
        "link_out",
        "link_in",
        "secret_link",
        "note_link",
        "dangling_out",
        "loop_a",
        "loop_b",
        "ws",
        "outside",
        "x",
    ]
)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(parts=st.lists(SEGMENTS, min_size=1, max_size=7), absolute=st.booleans())
def test_generated_paths_never_leave_the_workspace(
    linked: Path, outside: Path, ctx: ToolContext, parts: list[str], absolute: bool
) -> None:
    before = snapshot(outside)
    given_path = "/".join(parts)
    if absolute:
        given_path = str(linked) + "/" + given_path
    try:
        resolved = resolve_in_workspace(given_path, ctx)
    except ToolError:
        pass
    else:
        real = os.path.realpath(resolved)
        assert real == str(linked) or real.startswith(str(linked) + os.sep)
    for name, arguments in (
        ("read", {"path": given_path}),
        ("list", {"path": given_path}),
        ("grep", {"pattern": "SECRET|inside", "path": given_path}),
        ("glob", {"pattern": given_path}),
    ):
        outcome = call(name, arguments, ctx)
        text = outcome.body if isinstance(outcome, ReadOutcome | ListingOutcome) else str(outcome)
        assert SECRET not in text
        if isinstance(outcome, ListingOutcome) and outcome.body != "No matches.":
            for line in outcome.body.split("\n"):
                assert line.startswith(str(linked) + "/")
    for name, arguments in (
        ("write", {"path": given_path, "content": "written"}),
        ("edit", {"path": given_path, "old_string": "TOP", "new_string": "changed"}),
        ("apply_patch", {"patch": f"*** Begin Patch\n*** Delete File: {given_path}\n*** End Patch"}),
    ):
        call(name, arguments, ctx)
    assert snapshot(outside) == before
    assert sorted(os.listdir(outside)) == ["secret.txt"]
