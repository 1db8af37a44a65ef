from __future__ import annotations

import os
from pathlib import Path

import pytest

from chat.agent.uploads import UploadExists, UploadRefused, safe_folder, safe_name, upload_unwrite, upload_write
from sessions_app.models import ChatSession

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("given", "made"),
    [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("C:\\Users\\ada\\notes.txt", "notes.txt"),
        (".bashrc", "bashrc"),
        ("-rf", "rf"),
        ("a\x00b\nc.txt", "a_b_c.txt"),
        ('what?*<>|".md', "what_.md"),
        ("CON.txt", "CON_.txt"),
        ("trailing. ", "trailing"),
        ("", "file"),
        ("...", "file"),
        ("Résumé déjà vu.md", "Résumé déjà vu.md"),
        ("e\u0301.txt", "\u00e9.txt"),
        ("x" * 300 + ".txt", "x" * 116 + ".txt"),
    ],
)
def test_names_are_made_safe(given: str, made: str) -> None:
    assert safe_name(given) == made


def test_a_folder_typed_stays_inside() -> None:
    assert safe_folder("docs/./specs/") == "docs/specs"
    with pytest.raises(UploadRefused, match=r"no '\.\.'"):
        safe_folder("docs/../../up")


def test_a_file_is_written_never_over_another_unless_asked(chat_session: ChatSession, workspace_dir: Path) -> None:
    written = upload_write(chat_session, name="../notes.md", data=b"one\n")
    assert (written.path, written.size, written.replaced) == ("notes.md", 4, False)
    assert (workspace_dir / "notes.md").read_bytes() == b"one\n"
    with pytest.raises(UploadExists) as taken:
        upload_write(chat_session, name="notes.md", data=b"two\n")
    assert (taken.value.path, taken.value.free) == ("notes.md", "notes (2).md")
    assert (workspace_dir / "notes.md").read_bytes() == b"one\n", "nothing overwritten without asking"
    both = upload_write(chat_session, name="notes.md", data=b"two\n", keep_both=True)
    assert both.path == "notes (2).md" and (workspace_dir / "notes (2).md").read_bytes() == b"two\n"
    assert upload_write(chat_session, name="notes.md", data=b"three\n", keep_both=True).path == "notes (3).md"
    replaced = upload_write(chat_session, name="notes.md", data=b"new\n", replace=True)
    assert replaced.replaced and (workspace_dir / "notes.md").read_bytes() == b"new\n"
    inside = upload_write(chat_session, name="spec.txt", data=b"s", folder="docs/specs")
    assert inside.path == "docs/specs/spec.txt" and (workspace_dir / "docs/specs/spec.txt").exists()


def test_nothing_is_written_outside_the_workspace_symlinks_included(
    chat_session: ChatSession, workspace_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, workspace_dir / "link")
    with pytest.raises(UploadRefused):
        upload_write(chat_session, name="x.txt", data=b"x", folder="link")
    os.symlink(outside / "target.txt", workspace_dir / "dangling.txt")
    with pytest.raises(UploadRefused):
        upload_write(chat_session, name="dangling.txt", data=b"x", replace=True)
    (workspace_dir / "folder.txt").mkdir()
    with pytest.raises(UploadRefused, match="not a file"):
        upload_write(chat_session, name="folder.txt", data=b"x", replace=True)
    assert list(outside.iterdir()) == []


def test_the_quota_holds_and_a_removed_file_goes_only_when_unchanged(
    chat_session: ChatSession, workspace_dir: Path
) -> None:
    workspace = chat_session.workspace
    workspace.disk_quota_mb = 1
    workspace.save(update_fields=["disk_quota_mb"])
    with pytest.raises(UploadRefused, match="quota"):
        upload_write(chat_session, name="big.bin", data=b"\0" * (2 * 1024 * 1024))
    assert not (workspace_dir / "big.bin").exists()
    small = upload_write(chat_session, name="a.txt", data=b"a")
    (workspace_dir / "b.txt").write_bytes(b"b")
    other = upload_write(chat_session, name="b.txt", data=b"B", replace=True)
    (workspace_dir / "b.txt").write_bytes(b"changed")
    assert upload_unwrite(chat_session, path=small.path, sha256=small.sha256)
    assert not (workspace_dir / "a.txt").exists()
    assert not upload_unwrite(chat_session, path=other.path, sha256=other.sha256), "changed since: kept"
    assert (workspace_dir / "b.txt").read_bytes() == b"changed"


def test_the_audits_probe_replace_never_follows_a_symlink(chat_session: ChatSession, workspace_dir: Path) -> None:
    """Attach's Replace followed a symlink inside the workspace and overwrote the link's target."""
    (workspace_dir / "target.txt").write_bytes(b"kept\n")
    (workspace_dir / "report.txt").symlink_to("target.txt")
    (workspace_dir / "docs").symlink_to(".")
    for folder, name in (("", "report.txt"), ("docs", "target.txt")):
        with pytest.raises(UploadRefused, match="never written through one"):
            upload_write(chat_session, name=name, data=b"new\n", folder=folder, replace=True)
    assert (workspace_dir / "target.txt").read_bytes() == b"kept\n"
    assert (workspace_dir / "report.txt").is_symlink()


def test_an_attachment_never_goes_into_a_git_folder(chat_session: ChatSession, workspace_dir: Path) -> None:
    (workspace_dir / ".git" / "hooks").mkdir(parents=True)
    (workspace_dir / "hooks").symlink_to(".git/hooks")
    with pytest.raises(UploadRefused, match="never written through one"):
        upload_write(chat_session, name="pre-commit", data=b"#!/bin/sh\n", folder="hooks")
    assert not (workspace_dir / ".git" / "hooks" / "pre-commit").exists()
    assert safe_folder(".git/hooks") == "git/hooks", "a typed folder never starts with a dot"
