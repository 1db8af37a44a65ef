from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from chat.tools import ToolContext, ToolError, apply_patch
from sessions_app.hygiene.outcomes import EditOutcome, FileChange


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def patch(*lines: str) -> dict[str, object]:
    return {"patch": "\n".join(["*** Begin Patch", *lines, "*** End Patch"]) + "\n"}


def changes(outcome: object) -> tuple[FileChange, ...]:
    assert isinstance(outcome, EditOutcome)
    assert outcome.several == (len(outcome.changes) > 1)
    return outcome.changes


@pytest.fixture
def files(ws: Path) -> Path:
    (ws / "src").mkdir()
    (ws / "src" / "a.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    (ws / "old.md").write_text("bye\n")
    return ws


def test_update_one_file_answers_like_an_edit(files: Path, ctx: ToolContext) -> None:
    before = (files / "src" / "a.py").read_bytes()
    (change,) = changes(
        apply_patch(patch("*** Update File: src/a.py", "@@ def g():", "-    return 2", "+    return 3"), ctx)
    )
    after = (files / "src" / "a.py").read_bytes()
    assert after == b"def f():\n    return 1\n\n\ndef g():\n    return 3\n"
    assert change == FileChange(
        path="src/a.py",
        abs_path=str(files / "src" / "a.py"),
        action="update",
        sha256=sha(after),
        diff="@@ -3,4 +3,4 @@\n \n \n def g():\n-    return 2\n+    return 3",
        previous_sha256=sha(before),
        previous_text=before.decode(),
    )


def test_add_update_delete_several_files_in_order(files: Path, ctx: ToolContext) -> None:
    outcome = apply_patch(
        patch(
            "*** Add File: docs/new.md",
            "+# New",
            "+",
            "+text",
            "*** Update File: src/a.py",
            "@@",
            " def f():",
            "-    return 1",
            "+    return 10",
            "@@ def g():",
            "-    return 2",
            "+    return 20",
            "*** Delete File: old.md",
        ),
        ctx,
    )
    new, updated, deleted = changes(outcome)
    assert (files / "docs" / "new.md").read_text() == "# New\n\ntext\n"
    assert new == FileChange("docs/new.md", str(files / "docs/new.md"), "create", sha(b"# New\n\ntext\n"), lines=3)
    assert updated.action == "update"
    assert updated.diff == (
        "@@ -1,6 +1,6 @@\n def f():\n-    return 1\n+    return 10\n \n \n def g():\n-    return 2\n+    return 20"
    )
    assert deleted == FileChange(
        "old.md", str(files / "old.md"), "delete", "", previous_sha256=sha(b"bye\n"), previous_text="bye\n"
    )
    assert not (files / "old.md").exists()


def test_move_to(files: Path, ctx: ToolContext) -> None:
    moved, deleted = changes(
        apply_patch(patch("*** Update File: old.md", "*** Move to: archive/gone.md", "@@", "-bye", "+farewell"), ctx)
    )
    assert (files / "archive" / "gone.md").read_text() == "farewell\n"
    assert not (files / "old.md").exists()
    assert (moved.path, moved.action, moved.lines) == ("archive/gone.md", "create", 1)
    assert (deleted.path, deleted.action) == ("old.md", "delete")


def test_lenient_readings(files: Path, ctx: ToolContext) -> None:
    (files / "dos.txt").write_bytes(b"one\r\ntwo  \r\nthree")
    text = "\n".join(
        [
            "<<'EOF'",
            "*** Begin Patch",
            "*** Update File: dos.txt",
            " one",
            "-two",
            "+2",
            "*** End of File",
            "*** Update File: src/a.py",
            "@@ -4,3 +4,3 @@",
            "",
            "def g():",
        ]
    )
    with pytest.raises(ToolError, match="line 11 is not part of the format"):
        apply_patch({"patch": text + "\n*** End Patch\nEOF"}, ctx)
    outcome = apply_patch(
        {"patch": "<<'EOF'\n*** Begin Patch\n*** Update File: dos.txt\n one\n-two\n+2\n*** End Patch\nEOF"}, ctx
    )
    assert (files / "dos.txt").read_bytes() == b"one\r\n2\r\nthree"
    (change,) = changes(outcome)
    assert change.diff == "@@ -1,3 +1,3 @@\n one\n-two  \n+2\n three"


def test_a_crlf_file_stays_crlf_throughout_new_lines_included(files: Path, ctx: ToolContext) -> None:
    (files / "dos.txt").write_bytes(b"a\r\nb\r\nc")
    (change,) = changes(apply_patch(patch("*** Update File: dos.txt", " a", "-b", "+b1", "+b2", "+b3"), ctx))
    assert (files / "dos.txt").read_bytes() == b"a\r\nb1\r\nb2\r\nb3\r\nc"
    assert change.diff == "@@ -1,3 +1,5 @@\n a\n-b\n+b1\n+b2\n+b3\n c"
    changes(apply_patch(patch("*** Update File: dos.txt", " b3", " c", "+d", "*** End of File"), ctx))
    assert (files / "dos.txt").read_bytes() == b"a\r\nb1\r\nb2\r\nb3\r\nc\r\nd"


def test_context_line_repeated_as_first_context(files: Path, ctx: ToolContext) -> None:
    changes(
        apply_patch(
            patch("*** Update File: src/a.py", "@@ def g():", " def g():", "-    return 2", "+    return 5"), ctx
        )
    )
    assert (files / "src" / "a.py").read_text().endswith("def g():\n    return 5\n")


def test_pure_insertion_after_context_and_at_end(files: Path, ctx: ToolContext) -> None:
    changes(apply_patch(patch("*** Update File: old.md", "@@", "+appended"), ctx))
    assert (files / "old.md").read_text() == "bye\nappended\n"
    changes(apply_patch(patch("*** Update File: old.md", "@@ bye", "+between"), ctx))
    assert (files / "old.md").read_text() == "bye\nbetween\nappended\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("*** Update File: src/a.py\n@@\n-x\n+y\n*** End Patch", "its first line must be *** Begin Patch"),
        ("*** Begin Patch\n*** Delete File: old.md", "its last line must be *** End Patch"),
        ("*** Begin Patch\n*** End Patch", "it names no file to add, update or delete"),
        ("*** Begin Patch\n*** Frobnicate: x\n*** End Patch", "line 2 is not part of the format: '*** Frobnicate: x'"),
        (
            "*** Begin Patch\n*** Update File: src/a.py\n@@\n\tbad\n*** End Patch",
            "line 4 is not part of the format: '\\tbad'",
        ),
        ("*** Begin Patch\n*** Update File: src/a.py\n*** End Patch", "the update of {ws}/src/a.py has no @@ hunk"),
        (
            "*** Begin Patch\n*** Update File: src/a.py\n@@\n-    return 99\n+    return 0\n*** End Patch",
            "the lines of hunk 1 were not found in {ws}/src/a.py; read it again and copy the context lines exactly",
        ),
        (
            "*** Begin Patch\n*** Update File: src/a.py\n@@ def nowhere():\n-    return 1\n+x\n*** End Patch",
            "the lines of hunk 1 were not found in {ws}/src/a.py; read it again and copy the context lines exactly",
        ),
        (
            "*** Begin Patch\n*** Delete File: old.md\n*** Delete File: ./old.md\n*** End Patch",
            "it changes {ws}/old.md more than once",
        ),
    ],
)
def test_invalid_patches_change_nothing(files: Path, ctx: ToolContext, text: str, message: str) -> None:
    before = {path: path.read_bytes() for path in files.rglob("*") if path.is_file()}
    with pytest.raises(ToolError) as caught:
        apply_patch({"patch": text}, ctx)
    assert caught.value.message == "The patch is not valid: " + message.format(ws=files)
    assert {path: path.read_bytes() for path in files.rglob("*") if path.is_file()} == before


def test_a_later_failure_leaves_earlier_files_untouched(files: Path, ctx: ToolContext) -> None:
    before = (files / "src" / "a.py").read_text()
    cases = [
        ("*** Add File: src/a.py\n+x", f"Refused: {files}/src/a.py already exists."),
        ("*** Delete File: nothing.md", f"No such file or folder: {files}/nothing.md"),
        ("*** Update File: old.md\n*** Move to: src/a.py\n@@\n-bye\n+x", f"Refused: {files}/src/a.py already exists."),
    ]
    for tail, message in cases:
        text = f"*** Begin Patch\n*** Add File: fresh.txt\n+new\n*** Delete File: old.md\n{tail}\n*** End Patch"
        if "Move to" in tail:
            text = f"*** Begin Patch\n*** Add File: fresh.txt\n+new\n{tail}\n*** End Patch"
        with pytest.raises(ToolError) as caught:
            apply_patch({"patch": text}, ctx)
        assert caught.value.message == message
        assert not (files / "fresh.txt").exists()
        assert (files / "old.md").read_text() == "bye\n"
        assert (files / "src" / "a.py").read_text() == before


def test_guard_applies_to_every_file(files: Path, make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(last_seen_sha=lambda abs_path: "0" * 64 if abs_path.endswith("old.md") else None)
    with pytest.raises(ToolError) as caught:
        apply_patch(
            patch("*** Update File: src/a.py", "@@", "-    return 1", "+    return 7", "*** Delete File: old.md"), ctx
        )
    now = sha(b"bye\n")[:8]
    assert caught.value.message == (
        f"Refused: {files}/old.md changed since you last saw it (sha 00000000 then, {now} now); "
        "read it again before editing."
    )
    assert "return 1" in (files / "src" / "a.py").read_text()


def test_final_newline_or_its_absence_is_kept(files: Path, ctx: ToolContext) -> None:
    (files / "dos.txt").write_bytes(b"one\r\ntwo")
    (files / "unix.txt").write_bytes(b"one\ntwo")
    changes(
        apply_patch(
            patch(
                "*** Update File: dos.txt",
                " one",
                "-two",
                "+TWO",
                "*** End of File",
                "*** Update File: unix.txt",
                "@@",
                "-one",
                "+ONE",
            ),
            ctx,
        )
    )
    assert (files / "dos.txt").read_bytes() == b"one\r\nTWO"
    assert (files / "unix.txt").read_bytes() == b"ONE\ntwo"
