from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.path_race import can_exchange, exchange
from chat.tools import ToolContext, ToolError, call_tool, resolve_in_workspace
from chat.tools.paths import OPENAT2, Resolved, Root, open_file, open_folder
from sessions_app.hygiene.outcomes import EditOutcome, ErrorOutcome, ListingOutcome, ReadOutcome

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


def resolution(given: str, ctx: ToolContext) -> str:
    """The resolved path of ``given``, or the message refusing it."""
    try:
        return str(resolve_in_workspace(given, ctx))
    except ToolError as error:
        return error.message


def is_loop(path: str) -> bool:
    try:
        os.stat(path)
    except OSError as error:
        return error.errno == errno.ELOOP
    return False


def realpath_resolution(given: str, ctx: ToolContext) -> str:
    """What the confinement by ``realpath`` (before the walk) answered, paths and error texts alike.

    One deliberate difference: ``realpath`` folded a symlink loop followed by ``..`` away lexically
    (``loop_a/..`` was the workspace folder); the walk refuses it, as the kernel does.
    """
    if not given:
        return f"Refused: the path {given!r} is not valid."
    root = str(ctx.root)
    joined = os.path.join(root, given)
    resolved = os.path.realpath(joined)
    if os.path.realpath(resolved) != resolved or is_loop(resolved) or is_loop(joined):
        return f"Refused: {joined} is a symbolic link loop."
    if resolved != root and not resolved.startswith(root + os.sep):
        return f"Refused: {resolved} is outside the workspace."
    return resolved


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
    answer = resolution(given_path, ctx)
    with walk_only():
        assert resolution(given_path, ctx) == answer
    assert answer == realpath_resolution(given_path, ctx)
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


@contextmanager
def walk_only() -> Iterator[None]:
    """Resolve by the component walk alone, as on a kernel without ``openat2``."""
    saved = OPENAT2.usable
    OPENAT2.usable = False
    try:
        yield
    finally:
        OPENAT2.usable = saved


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "openat2" and not OPENAT2.usable:
        pytest.skip("this kernel has no openat2")
    if request.param == "walk":
        with walk_only():
            yield request.param
    else:
        yield request.param


def where(given: str, ctx: ToolContext) -> tuple[str, str, str, tuple[str, ...], bool, str | None]:
    """What ``Root.resolve`` found, without its descriptor numbers."""
    with Root(ctx) as root:
        found = root.resolve(given)
        return found.path, found.kind, found.dir_path, found.names, found.fd is not None, found.blocker


def test_symlinks_inside_are_followed(linked: Path, ctx: ToolContext, resolver: str) -> None:
    (linked / "abs_note").symlink_to(linked / "inner" / "note.txt")
    note = (f"{linked}/inner/note.txt", "file", f"{linked}/inner", ("note.txt",), False, None)
    assert where("note_link", ctx) == note
    assert where("abs_note", ctx) == note
    assert where("link_in/note.txt", ctx) == note
    assert where("link_in", ctx) == (f"{linked}/inner", "folder", str(linked), ("inner",), True, None)
    assert where(".", ctx) == (str(linked), "folder", str(linked), (), True, None)
    with open_file(ctx, "abs_note") as (path, handle):
        assert (path, handle.read()) == (f"{linked}/inner/note.txt", b"inside\n")


def test_a_chain_of_symlinks_is_followed_up_to_forty_hops(linked: Path, ctx: ToolContext, resolver: str) -> None:
    (linked / "c1").symlink_to("c2")
    (linked / "c2").symlink_to(linked / "c3")
    (linked / "c3").symlink_to("inner/../link_in")
    assert where("c1/note.txt", ctx)[0] == f"{linked}/inner/note.txt"
    for number in range(1, 41):
        (linked / f"h{number}").symlink_to(f"h{number + 1}" if number < 40 else "inner/note.txt")
    assert where("h1", ctx)[0] == f"{linked}/inner/note.txt"
    (linked / "h0").symlink_to("h1")
    with pytest.raises(ToolError) as caught:
        where("h0", ctx)
    assert caught.value.message == f"Refused: {linked}/h0 is a symbolic link loop."


def test_dot_dot_goes_up_from_where_a_symlink_led(linked: Path, ctx: ToolContext, resolver: str) -> None:
    (linked / "inner" / "sub").mkdir()
    (linked / "deep_link").symlink_to("inner/sub")
    assert where("deep_link/../note.txt", ctx)[0] == f"{linked}/inner/note.txt"
    assert where("inner/sub/../../inner/./note.txt", ctx)[0] == f"{linked}/inner/note.txt"
    assert where("missing/../inner/note.txt", ctx)[0] == f"{linked}/inner/note.txt"
    assert where("inner/note.txt/..", ctx) == (f"{linked}/inner", "folder", str(linked), ("inner",), True, None)
    assert where("link_out/../ws/inner", ctx)[:2] == (f"{linked}/inner", "folder")
    for path in ("deep_link/../note.txt", "missing/../inner/note.txt", "link_out/../ws/inner/note.txt"):
        assert os.path.realpath(linked / path) == where(path, ctx)[0]


def test_absolute_paths_inside_and_outside(linked: Path, outside: Path, ctx: ToolContext, resolver: str) -> None:
    (linked.parent / "alias").symlink_to(linked)
    assert where(f"{linked}/inner/note.txt", ctx)[0] == f"{linked}/inner/note.txt"
    assert where(f"{linked.parent}/alias/inner/note.txt", ctx)[0] == f"{linked}/inner/note.txt"
    assert where(f"{linked}/../ws/link_in", ctx)[:2] == (f"{linked}/inner", "folder")
    for path, named in ((f"{outside}/secret.txt", "secret.txt"), (f"{linked}/link_out/x/../y", "y")):
        with pytest.raises(ToolError) as caught:
            where(path, ctx)
        assert caught.value.message == f"Refused: {outside}/{named} is outside the workspace."


def test_a_file_where_a_folder_is_expected(linked: Path, ctx: ToolContext, resolver: str) -> None:
    note = f"{linked}/inner/note.txt"
    assert where("inner/note.txt/x/y.txt", ctx) == (
        f"{note}/x/y.txt",
        "missing",
        f"{linked}/inner",
        ("note.txt", "x", "y.txt"),
        False,
        note,
    )
    assert call("read", {"path": "inner/note.txt/x"}, ctx) == ErrorOutcome(f"No such file or folder: {note}/x")
    assert call("list", {"path": "link_in/note.txt"}, ctx) == ErrorOutcome(f"{note} is not a folder.")
    assert call("glob", {"pattern": "*", "path": "note_link"}, ctx) == ErrorOutcome(f"{note} is not a folder.")
    written = call("write", {"path": "note_link/x/y.txt", "content": "x"}, ctx)
    assert written == ErrorOutcome(f"{note} is not a folder.")
    assert (linked / "inner" / "note.txt").read_text() == "inside\n"


def test_new_files_get_their_missing_folders_inside(linked: Path, ctx: ToolContext, resolver: str) -> None:
    assert where("new/a/b.txt", ctx) == (
        f"{linked}/new/a/b.txt",
        "missing",
        str(linked),
        ("new", "a", "b.txt"),
        False,
        None,
    )
    assert isinstance(call("write", {"path": "new/a/b.txt", "content": "b\n"}, ctx), EditOutcome)
    assert (linked / "new" / "a" / "b.txt").read_text() == "b\n"
    (linked / "to_make").symlink_to("made/here")
    created = call("write", {"path": "to_make/file.txt", "content": "f\n"}, ctx)
    assert isinstance(created, EditOutcome)
    assert created.changes[0].abs_path == f"{linked}/made/here/file.txt"
    assert (linked / "made" / "here" / "file.txt").read_text() == "f\n"
    patch = "*** Begin Patch\n*** Add File: p/q/r.txt\n+r\n*** Add File: p/q/s.txt\n+s\n*** End Patch"
    assert isinstance(call("apply_patch", {"patch": patch}, ctx), EditOutcome)
    assert sorted(os.listdir(linked / "p" / "q")) == ["r.txt", "s.txt"]


def test_a_failed_write_removes_the_folders_it_made(linked: Path, ctx: ToolContext) -> None:
    patch = "*** Begin Patch\n*** Add File: fresh/one/a.txt\n+a\n*** Add File: fresh/one\n+clash\n*** End Patch"
    outcome = call("apply_patch", {"patch": patch}, ctx)
    assert isinstance(outcome, ErrorOutcome)
    assert not (linked / "fresh").exists()


def test_open_folder_gives_a_readable_descriptor_inside_only(linked: Path, ctx: ToolContext, resolver: str) -> None:
    fd = open_folder(ctx, "link_in")
    try:
        assert os.listdir(fd) == ["note.txt"]
    finally:
        os.close(fd)
    for path, message in (
        ("link_out", f"Refused: {linked.parent}/outside is outside the workspace."),
        ("note_link", f"{linked}/inner/note.txt is not a folder."),
        ("nothing", f"No such file or folder: {linked}/nothing"),
    ):
        with pytest.raises(ToolError) as caught:
            open_folder(ctx, path)
        assert caught.value.message == message


def test_every_descriptor_is_closed(linked: Path, ctx: ToolContext) -> None:
    calls: list[tuple[str, dict[str, object]]] = [
        ("read", {"path": "note_link"}),
        ("read", {"path": "link_out/secret.txt"}),
        ("read", {"path": "loop_a"}),
        ("read", {"path": "inner"}),
        ("list", {"path": "."}),
        ("list", {"path": "inner/note.txt"}),
        ("glob", {"pattern": "**/*"}),
        ("grep", {"pattern": "in"}),
        ("write", {"path": "made/deep/w.txt", "content": "w\n"}),
        ("write", {"path": "inner/note.txt/x", "content": "w\n"}),
        ("edit", {"path": "note_link", "old_string": "inside", "new_string": "in"}),
        ("apply_patch", {"patch": "*** Begin Patch\n*** Delete File: made/deep/w.txt\n*** End Patch"}),
        ("apply_patch", {"patch": "*** Begin Patch\n*** Delete File: nothing\n*** End Patch"}),
    ]
    before = sorted(os.listdir("/proc/self/fd"))
    for name, arguments in calls:
        call(name, arguments, ctx)
    assert sorted(os.listdir("/proc/self/fd")) == before


@pytest.fixture
def swappable(ws: Path, outside: Path) -> Path:
    """A workspace folder ``sub`` and a symlink ``.parked`` to the outside folder, which mirrors ``sub``."""
    if not can_exchange(ws.parent):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available")
    (ws / "sub" / "deep").mkdir(parents=True)
    (outside / "deep").mkdir()
    for folder, text in ((ws / "sub", "inside"), (outside, SECRET)):
        (folder / "r.txt").write_text(f"{text}\n")
        (folder / "e.txt").write_text(f"value\n{text}\n")
    (ws / ".parked").symlink_to(outside)
    return ws


@pytest.mark.parametrize(
    ("name", "arguments", "inside"),
    [
        ("read", {"path": "sub/r.txt"}, None),
        ("list", {"path": "sub"}, None),
        ("glob", {"pattern": "**/*.txt", "path": "sub"}, None),
        ("write", {"path": "sub/new.txt", "content": "new\n"}, ("new.txt", "new\n")),
        ("write", {"path": "sub/made/here/new.txt", "content": "new\n"}, ("made/here/new.txt", "new\n")),
        ("write", {"path": "sub/r.txt", "content": "over\n"}, ("r.txt", "over\n")),
        ("edit", {"path": "sub/e.txt", "old_string": "value", "new_string": "changed"}, ("e.txt", "changed\ninside\n")),
        (
            "apply_patch",
            {"patch": "*** Begin Patch\n*** Add File: sub/deep/p.txt\n+p\n*** End Patch"},
            ("deep/p.txt", "p\n"),
        ),
        (
            "apply_patch",
            {"patch": "*** Begin Patch\n*** Update File: sub/e.txt\n@@\n-value\n+patched\n*** End Patch"},
            ("e.txt", "patched\ninside\n"),
        ),
        ("apply_patch", {"patch": "*** Begin Patch\n*** Delete File: sub/r.txt\n*** End Patch"}, ("r.txt", None)),
    ],
)
def test_a_folder_swapped_for_a_symlink_after_resolution_leads_nowhere_outside(
    swappable: Path,
    outside: Path,
    ctx: ToolContext,
    monkeypatch: pytest.MonkeyPatch,
    resolver: str,
    name: str,
    arguments: dict[str, object],
    inside: tuple[str, str | None] | None,
) -> None:
    """The swap happens between resolving ``sub`` and using it: the call goes on in the real folder."""
    folder, parked = swappable / "sub", swappable / ".parked"
    resolve = Root.resolve

    def resolve_then_swap(root: Root, given: str) -> Resolved:
        found = resolve(root, given)
        if given.startswith("sub") and not folder.is_symlink():
            exchange(folder, parked)
        return found

    monkeypatch.setattr(Root, "resolve", resolve_then_swap)
    before = snapshot(outside)
    outcome = call(name, arguments, ctx)
    assert folder.is_symlink()
    assert SECRET not in repr(outcome)
    assert not isinstance(outcome, ErrorOutcome)
    assert snapshot(outside) == before
    if inside is not None:
        relative, content = inside
        if content is None:
            assert not (parked / relative).exists()
        else:
            assert (parked / relative).read_text() == content


def test_a_refusal_names_the_path_as_it_left_never_the_servers_process(ws: Path, ctx: ToolContext) -> None:
    """``/proc/self`` resolves to the server's own pid: the refusal names the path the call led out to."""
    (ws / "env").symlink_to("/proc/self/environ")
    for path in ("/proc/self/environ", "env", "../" * 20 + "proc/self/environ"):
        _, outcome = call_tool("read", json.dumps({"path": path}), ctx)
        assert isinstance(outcome, ErrorOutcome)
        assert outcome.message == "Refused: /proc/self/environ is outside the workspace."
        assert str(os.getpid()) not in outcome.message
