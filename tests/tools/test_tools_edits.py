from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from chat.tools import ToolContext, ToolError, edit, multiedit, write
from sessions_app.hygiene.outcomes import EditOutcome, FileChange


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def only(outcome: object) -> FileChange:
    assert isinstance(outcome, EditOutcome)
    assert not outcome.several
    (change,) = outcome.changes
    return change


def test_edit_answers_the_diff(ws: Path, ctx: ToolContext) -> None:
    before = "".join(f"line {number}\n" for number in range(1, 11)).encode()
    (ws / "a.txt").write_bytes(before)
    change = only(edit({"path": "a.txt", "old_string": "line 5\n", "new_string": "five\nand a half\n"}, ctx))
    after = (ws / "a.txt").read_bytes()
    assert after == before.replace(b"line 5\n", b"five\nand a half\n")
    assert change == FileChange(
        path="a.txt",
        abs_path=str(ws / "a.txt"),
        action="update",
        sha256=sha(after),
        diff="@@ -2,7 +2,8 @@\n line 2\n line 3\n line 4\n-line 5\n+five\n+and a half\n line 6\n line 7\n line 8",
        previous_sha256=sha(before),
        previous_text=before.decode(),
    )


def test_edit_keeps_every_other_byte(ws: Path, ctx: ToolContext) -> None:
    before = b"keep \xff\xfe latin\r\nmixed\nno final newline"
    (ws / "b.txt").write_bytes(before)
    change = only(edit({"path": "b.txt", "old_string": "mixed", "new_string": "MIXED"}, ctx))
    assert (ws / "b.txt").read_bytes() == b"keep \xff\xfe latin\r\nMIXED\nno final newline"
    assert change.diff == "@@ -1,3 +1,3 @@\n keep \ufffd\ufffd latin\n-mixed\n+MIXED\n no final newline"
    assert change.previous_text is None


def test_edit_in_a_crlf_file_takes_lf_strings(ws: Path, ctx: ToolContext) -> None:
    (ws / "dos.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    only(edit({"path": "dos.txt", "old_string": "one\ntwo", "new_string": "uno\ndos"}, ctx))
    assert (ws / "dos.txt").read_bytes() == b"uno\r\ndos\r\nthree\r\n"


def test_a_crlf_file_stays_crlf_throughout_new_lines_included(ws: Path, ctx: ToolContext) -> None:
    """A one-line old_string replaced by several lines, a new_string with CRLF or mixed breaks, several edits
    in a row, an old_string ending in the \\r of a line end: the bytes read back are CRLF throughout, and the
    diff (where \\r before \\n is not shown) is the change of those bytes."""
    path = ws / "dos.txt"
    path.write_bytes(b"a\r\nb\r\n")
    change = only(edit({"path": "dos.txt", "old_string": "b", "new_string": "c\nd"}, ctx))
    assert path.read_bytes() == b"a\r\nc\r\nd\r\n"
    assert change.diff == "@@ -1,2 +1,3 @@\n a\n-b\n+c\n+d"
    assert change.sha256 == sha(path.read_bytes())
    only(edit({"path": "dos.txt", "old_string": "a", "new_string": "x\r\ny\nz\n"}, ctx))
    assert path.read_bytes() == b"x\r\ny\r\nz\r\n\r\nc\r\nd\r\n"
    only(
        multiedit(
            {
                "path": "dos.txt",
                "edits": [
                    {"old_string": "c", "new_string": "c1\nc2"},
                    {"old_string": "d\r", "new_string": "D"},
                    {"old_string": "\n\n", "new_string": "\n"},
                ],
            },
            ctx,
        )
    )
    assert path.read_bytes() == b"x\r\ny\r\nz\r\nc1\r\nc2\r\nD\r\n"


def test_a_file_that_is_not_crlf_throughout_keeps_what_new_string_says(ws: Path, ctx: ToolContext) -> None:
    path = ws / "mixed.txt"
    path.write_bytes(b"a\r\nb\nc\r\n")
    only(edit({"path": "mixed.txt", "old_string": "b", "new_string": "b1\nb2"}, ctx))
    assert path.read_bytes() == b"a\r\nb1\nb2\nc\r\n"
    only(edit({"path": "mixed.txt", "old_string": "c\n", "new_string": "c\nd\n"}, ctx))
    assert path.read_bytes() == b"a\r\nb1\nb2\nc\r\nd\r\n", "found only as CRLF lines: their new lines CRLF"
    (ws / "lf.txt").write_bytes(b"a\nb\n")
    only(edit({"path": "lf.txt", "old_string": "b", "new_string": "c\r\nd"}, ctx))
    assert (ws / "lf.txt").read_bytes() == b"a\nc\r\nd\n"


def test_write_writes_exactly_the_content_it_is_given(ws: Path, ctx: ToolContext) -> None:
    path = ws / "dos.txt"
    path.write_bytes(b"a\r\nb\r\n")
    change = only(write({"path": "dos.txt", "content": "a\r\nb\nc\n"}, ctx))
    assert path.read_bytes() == b"a\r\nb\nc\n"
    assert change.diff == "@@ -1,2 +1,3 @@\n a\n-b\n+b\n+c", "the changed line end shows as a changed line"


def test_edit_replace_all_and_errors(ws: Path, ctx: ToolContext) -> None:
    (ws / "c.txt").write_text("x = 1\nx = 1\n")
    path = ws / "c.txt"
    with pytest.raises(ToolError) as caught:
        edit({"path": "c.txt", "old_string": "x = 1", "new_string": "x = 2"}, ctx)
    assert caught.value.message == (f"The old_string occurs 2 times in {path}; give more context or set replace_all.")
    with pytest.raises(ToolError) as caught:
        edit({"path": "c.txt", "old_string": "y", "new_string": "z"}, ctx)
    assert caught.value.message == (
        f"The old_string was not found in {path}; read the file again and copy the text exactly."
    )
    with pytest.raises(ToolError) as caught:
        edit({"path": "c.txt", "old_string": "x", "new_string": "x"}, ctx)
    assert caught.value.message == f"old_string and new_string are the same; nothing to change in {path}."
    with pytest.raises(ToolError) as caught:
        edit({"path": "c.txt", "old_string": "", "new_string": "z"}, ctx)
    assert caught.value.message.startswith(f"old_string is empty but {path} exists")
    with pytest.raises(ToolError) as caught:
        edit({"path": "c.txt", "old_string": "x", "new_string": 2}, ctx)
    assert caught.value.message == "The argument new_string of edit must be a string."
    with pytest.raises(ToolError) as caught:
        edit({"path": "missing.txt", "old_string": "x", "new_string": "y"}, ctx)
    assert caught.value.message == f"No such file or folder: {ws}/missing.txt"
    assert path.read_text() == "x = 1\nx = 1\n"
    change = only(edit({"path": "c.txt", "old_string": "x = 1", "new_string": "x = 2", "replace_all": True}, ctx))
    assert path.read_text() == "x = 2\nx = 2\n"
    assert change.diff == "@@ -1,2 +1,2 @@\n-x = 1\n-x = 1\n+x = 2\n+x = 2"


def test_edit_with_empty_old_string_creates_a_file(ws: Path, ctx: ToolContext) -> None:
    change = only(edit({"path": "new/dir/n.txt", "old_string": "", "new_string": "a\nb\n"}, ctx))
    assert (ws / "new" / "dir" / "n.txt").read_text() == "a\nb\n"
    assert change == FileChange(
        path="new/dir/n.txt", abs_path=str(ws / "new/dir/n.txt"), action="create", sha256=sha(b"a\nb\n"), lines=2
    )


def test_guard_refuses_a_file_changed_since_seen(ws: Path, make_ctx: Callable[..., ToolContext]) -> None:
    path = ws / "g.txt"
    path.write_text("old\n")
    seen = sha(b"old\n")
    path.write_text("changed from outside\n")
    now = sha(b"changed from outside\n")
    ctx = make_ctx(last_seen_sha=lambda abs_path: seen if abs_path == str(path) else None)
    for call, arguments in (
        (edit, {"path": "g.txt", "old_string": "changed", "new_string": "x"}),
        (multiedit, {"path": "g.txt", "edits": [{"old_string": "changed", "new_string": "x"}]}),
        (write, {"path": "g.txt", "content": "x"}),
    ):
        with pytest.raises(ToolError) as caught:
            call(arguments, ctx)
        assert caught.value.message == (
            f"Refused: {path} changed since you last saw it (sha {seen[:8]} then, {now[:8]} now); "
            "read it again before editing."
        )
    assert path.read_text() == "changed from outside\n"
    fresh = make_ctx(last_seen_sha=lambda abs_path: now)
    only(edit({"path": "g.txt", "old_string": "changed", "new_string": "x"}, fresh))
    deleted = make_ctx(last_seen_sha=lambda abs_path: "")
    with pytest.raises(ToolError, match=r"did not exist when you last saw it and exists now \(sha [0-9a-f]{8}\)"):
        write({"path": "g.txt", "content": "y"}, deleted)


def test_binary_and_too_large_are_refused(ws: Path, make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(edit_max_bytes=100)
    (ws / "bin.dat").write_bytes(b"ab\x00cd")
    (ws / "big.txt").write_bytes(b"y" * 101)
    with pytest.raises(ToolError) as caught:
        edit({"path": "bin.dat", "old_string": "ab", "new_string": "x"}, ctx)
    assert caught.value.message == f"Refused: {ws}/bin.dat is a binary file."
    with pytest.raises(ToolError) as caught:
        edit({"path": "big.txt", "old_string": "y", "new_string": "x", "replace_all": True}, ctx)
    assert caught.value.message == (f"Refused: {ws}/big.txt is 101 bytes, more than the 100 bytes an edit can take.")
    with pytest.raises(ToolError, match="is 200 bytes, more than the 100 bytes"):
        write({"path": "new.txt", "content": "z" * 200}, ctx)
    assert not (ws / "new.txt").exists()


def test_multiedit_is_all_or_nothing(ws: Path, ctx: ToolContext) -> None:
    path = ws / "m.py"
    path.write_text("a = 1\nb = 2\nc = 3\n")
    with pytest.raises(ToolError) as caught:
        multiedit(
            {
                "path": "m.py",
                "edits": [
                    {"old_string": "a = 1", "new_string": "a = 10"},
                    {"old_string": "nope", "new_string": "x"},
                ],
            },
            ctx,
        )
    assert caught.value.message == (
        f"Edit 2 of 2 failed, nothing was changed: The old_string was not found in {path}; "
        "read the file again and copy the text exactly."
    )
    assert path.read_text() == "a = 1\nb = 2\nc = 3\n"
    change = only(
        multiedit(
            {
                "path": "m.py",
                "edits": [
                    {"old_string": "a = 1", "new_string": "a = 10"},
                    {"old_string": "a = 10\nb", "new_string": "a = 10\nbb"},
                    {"old_string": "3", "new_string": "30", "replace_all": "true"},
                ],
            },
            ctx,
        )
    )
    assert path.read_text() == "a = 10\nbb = 2\nc = 30\n"
    assert change.diff == "@@ -1,3 +1,3 @@\n-a = 1\n-b = 2\n-c = 3\n+a = 10\n+bb = 2\n+c = 30"


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        ([], "multiedit needs at least one edit."),
        ("x", "The argument edits of multiedit must be a list of objects, each with old_string and new_string."),
        (
            [{"old_string": "a"}],
            "The argument edits of multiedit must be a list of objects, each with old_string and new_string.",
        ),
        (None, "The call to multiedit lacks the argument edits."),
    ],
)
def test_multiedit_argument_errors(ws: Path, ctx: ToolContext, edits: object, message: str) -> None:
    (ws / "m.txt").write_text("a\n")
    with pytest.raises(ToolError) as caught:
        multiedit({"path": "m.txt", "edits": edits}, ctx)
    assert caught.value.message == message


def test_write_creates_and_replaces(ws: Path, ctx: ToolContext) -> None:
    change = only(write({"path": "deep/er/w.md", "content": "one\ntwo\nthree"}, ctx))
    assert (ws / "deep" / "er" / "w.md").read_text() == "one\ntwo\nthree"
    assert (change.action, change.lines, change.sha256) == ("create", 3, sha(b"one\ntwo\nthree"))
    os.chmod(ws / "deep" / "er" / "w.md", 0o640)
    change = only(write({"path": "deep/er/w.md", "content": "one\n2\nthree"}, ctx))
    assert change.action == "update"
    assert change.diff == "@@ -1,3 +1,3 @@\n one\n-two\n+2\n three"
    assert stat.S_IMODE((ws / "deep" / "er" / "w.md").stat().st_mode) == 0o640
    same = only(write({"path": "deep/er/w.md", "content": "one\n2\nthree"}, ctx))
    assert (same.action, same.diff) == ("update", "")
    empty = only(write({"path": "e.txt", "content": ""}, ctx))
    assert (empty.action, empty.lines, empty.sha256) == ("create", 0, sha(b""))
    assert [name for name in os.listdir(ws / "deep" / "er") if name.endswith(".cachet")] == []


def test_write_refuses_a_folder_or_a_file_as_parent(ws: Path, ctx: ToolContext) -> None:
    (ws / "d").mkdir()
    (ws / "f").write_text("x")
    with pytest.raises(ToolError) as caught:
        write({"path": "d", "content": "x"}, ctx)
    assert caught.value.message == f"{ws}/d is a folder, not a file; use list to see what it holds."
    with pytest.raises(ToolError) as caught:
        write({"path": "f/inner/x.txt", "content": "x"}, ctx)
    assert caught.value.message == f"{ws}/f is not a folder."
