from __future__ import annotations

import os
import stat
from dataclasses import asdict
from pathlib import Path

import pytest

from chat.agent.workspace import read_instructions, restore_files, workspace_context
from chat.tools import call_tool
from sessions_app.hygiene.outcomes import EditOutcome
from sessions_app.models import ChatSession, Result

pytestmark = pytest.mark.django_db


def edit_result(session: ChatSession, number: int, tool: str, arguments: str) -> Result:
    """A result (not stored: ``restore_files`` reads its changes and number only) of a real tool call."""
    _, outcome = call_tool(tool, arguments, workspace_context(session))
    assert isinstance(outcome, EditOutcome)
    return Result(session=session, number=number, changed_files=[asdict(change) for change in outcome.changes])


def test_instructions_follow_a_link_inside_and_not_one_outside(
    chat_session: ChatSession, workspace_dir: Path, tmp_path: Path
) -> None:
    (workspace_dir / "docs").mkdir()
    (workspace_dir / "docs" / "rules.md").write_text("Use tabs.\n")
    (workspace_dir / "AGENTS.md").symlink_to("docs/rules.md")
    assert read_instructions(chat_session) == "Use tabs."
    (tmp_path / "secret.md").write_text("outside\n")
    (workspace_dir / "AGENTS.md").unlink()
    (workspace_dir / "AGENTS.md").symlink_to(tmp_path / "secret.md")
    assert read_instructions(chat_session) is None
    (workspace_dir / "AGENTS.md").unlink()
    (workspace_dir / "AGENTS.md").mkdir()
    assert read_instructions(chat_session) is None


def test_instructions_of_a_missing_workspace_folder_are_none(chat_session: ChatSession, workspace_dir: Path) -> None:
    workspace_dir.rmdir()
    assert read_instructions(chat_session) is None


def test_restore_puts_back_deleted_files_and_their_folders(chat_session: ChatSession, workspace_dir: Path) -> None:
    (workspace_dir / "deep" / "er").mkdir(parents=True)
    (workspace_dir / "deep" / "er" / "kept.txt").write_text("kept\n")
    os.chmod(workspace_dir / "deep" / "er" / "kept.txt", 0o640)
    update = edit_result(chat_session, 1, "write", '{"path": "deep/er/kept.txt", "content": "changed\\n"}')
    patch = "*** Begin Patch\\n*** Delete File: deep/er/kept.txt\\n*** Add File: new/file.txt\\n+new\\n*** End Patch"
    delete = edit_result(chat_session, 2, "apply_patch", f'{{"patch": "{patch}"}}')
    (workspace_dir / "deep" / "er").rmdir()
    report = restore_files(chat_session, [delete, update])
    assert report.conflicts == []
    kept = f"{workspace_dir}/deep/er/kept.txt"
    assert report.restored == [f"{workspace_dir}/new/file.txt", kept, kept]
    assert (workspace_dir / "deep" / "er" / "kept.txt").read_text() == "kept\n"
    assert not (workspace_dir / "new" / "file.txt").exists()
    assert [name for name in os.listdir(workspace_dir / "deep" / "er") if name.endswith(".cachet")] == []


def test_restore_keeps_the_mode_and_refuses_a_path_now_outside(
    chat_session: ChatSession, workspace_dir: Path, tmp_path: Path
) -> None:
    (workspace_dir / "sub").mkdir()
    (workspace_dir / "sub" / "a.txt").write_text("a\n")
    os.chmod(workspace_dir / "sub" / "a.txt", 0o600)
    (workspace_dir / "b.txt").write_text("b\n")
    first = edit_result(chat_session, 1, "write", '{"path": "sub/a.txt", "content": "A\\n"}')
    second = edit_result(chat_session, 2, "write", '{"path": "b.txt", "content": "B\\n"}')
    report = restore_files(chat_session, [second])
    assert report.restored == [f"{workspace_dir}/b.txt"]
    assert (workspace_dir / "b.txt").read_text() == "b\n"
    outside = tmp_path / "outside"
    (workspace_dir / "sub").rename(outside)
    (workspace_dir / "sub").symlink_to(outside)
    report = restore_files(chat_session, [first])
    assert report.conflicts == [f"{workspace_dir}/sub/a.txt: outside the workspace now"]
    assert (outside / "a.txt").read_text() == "A\n"
    (workspace_dir / "sub").unlink()
    outside.rename(workspace_dir / "sub")
    report = restore_files(chat_session, [first])
    assert report.restored == [f"{workspace_dir}/sub/a.txt"]
    assert (workspace_dir / "sub" / "a.txt").read_text() == "a\n"
    assert stat.S_IMODE((workspace_dir / "sub" / "a.txt").stat().st_mode) == 0o600


def test_the_audits_probe_a_restore_counts_against_the_quota_and_never_writes_a_git_folder(
    chat_session: ChatSession, workspace_dir: Path
) -> None:
    """An import whose ``changed_files`` carried 3 MB, then a rewind with restore, wrote past a 1 MB quota: restores
    used ``commit``, not ``commit_within_quota``. Its changes could name ``.git/hooks`` as well."""
    (workspace_dir / "small.txt").write_text("small\n")
    update = edit_result(chat_session, 1, "write", '{"path": "small.txt", "content": "changed\\n"}')
    update.changed_files[0]["previous_text"] = "x" * (3 * 1024 * 1024)
    (workspace_dir / ".git" / "hooks").mkdir(parents=True)
    planted = Result(
        session=chat_session,
        number=2,
        changed_files=[
            {
                "action": "create",
                "abs_path": f"{workspace_dir}/.git/hooks/pre-commit",
                "sha256": "",
                "previous_text": None,
            },
            {
                "action": "update",
                "abs_path": f"{workspace_dir}/.git/config",
                "sha256": "",
                "previous_text": "[core]\n\tfsmonitor = touch /tmp/owned\n",
            },
        ],
    )
    chat_session.workspace.disk_quota_mb = 1
    chat_session.workspace.save(update_fields=["disk_quota_mb"])
    report = restore_files(chat_session, [planted, update])
    assert report.restored == []
    assert report.conflicts[0].startswith(
        f"{workspace_dir}/.git/config: {workspace_dir}/.git/config is in a git folder"
    )
    assert report.conflicts[2].startswith(f"{workspace_dir}/small.txt: writing {workspace_dir}/small.txt (3.0 MB more)")
    assert (workspace_dir / "small.txt").read_text() == "changed\n"
    assert not (workspace_dir / ".git" / "config").exists()
