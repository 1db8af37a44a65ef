"""What git on the host would run of a workspace's repository is read-only to commands; git itself still works."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from chat.tools import ToolContext, call_tool
from chat.tools.repository import LinkedEntry, repository_guards
from sessions_app.hygiene.outcomes import ErrorOutcome, OutputOutcome
from tests.sandbox_kit import for_commands

GIT_ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null", "PATH": os.defpath}


def ran(ctx: ToolContext, command: str) -> str:
    _, outcome = call_tool("run", json.dumps({"command": command}), ctx)
    if isinstance(outcome, ErrorOutcome):
        return f"error: {outcome.message}"
    assert isinstance(outcome, OutputOutcome)
    return outcome.text


def git(ws: Path, *args: str, trusted: bool = True) -> str:
    """Git on the host, as the test's user; ``trusted`` passes git's check of who owns the repository."""
    trust = ["-c", "safe.directory=*"] if trusted else []
    done = subprocess.run(
        ["git", *trust, "-C", str(ws), *args], env=GIT_ENV, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise AssertionError(done.stderr)
    return done.stdout


@pytest.fixture
def repo(ws: Path) -> Path:
    git(ws, "init", "-q")
    git(ws, "config", "user.email", "ada@example.com")
    git(ws, "config", "user.name", "Ada")
    (ws / "a.txt").write_text("a\n")
    return for_commands(ws)


def test_the_config_and_hooks_are_read_only_and_git_still_commits(repo: Path, ctx: ToolContext) -> None:
    config = (repo / ".git" / "config").read_text()
    output = ran(
        ctx,
        "git config core.fsmonitor 'touch /tmp/owned' 2>&1 | tail -1; "
        "echo 'touch owned' > .git/hooks/pre-commit 2>&1; "
        "git add a.txt && git commit -qm first && git log --format=%s",
    )
    lines = output.splitlines()
    assert "first" in lines, output
    assert any("Read-only file system" in line or "Device or resource busy" in line for line in lines), output
    assert (repo / ".git" / "config").read_text() == config
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert git(repo, "log", "--format=%s") == "first\n"


def test_missing_hooks_are_made_so_none_can_be_added(repo: Path, ctx: ToolContext) -> None:
    hooks = repo / ".git" / "hooks"
    for hook in hooks.iterdir():
        hook.unlink()
    hooks.rmdir()
    assert ran(ctx, "mkdir -p .git/hooks && echo 'touch owned' > .git/hooks/post-checkout; ls -A .git/hooks") != ""
    assert hooks.is_dir() and list(hooks.iterdir()) == []
    assert hooks.stat().st_uid == (repo / ".git").stat().st_uid


def test_a_hooks_path_and_included_config_inside_the_workspace_are_read_only(repo: Path, ctx: ToolContext) -> None:
    (repo / ".githooks").mkdir()
    (repo / "shared.gitconfig").write_text("[user]\n\tname = Shared\n")
    git(repo, "config", "core.hooksPath", ".githooks")
    git(repo, "config", "include.path", "../shared.gitconfig")
    for_commands(repo)
    ran(
        ctx,
        "echo 'touch owned' > .githooks/pre-commit; printf '[core]\\n\\tpager = touch owned\\n' >> shared.gitconfig",
    )
    assert list((repo / ".githooks").iterdir()) == []
    assert (repo / "shared.gitconfig").read_text() == "[user]\n\tname = Shared\n"
    assert ran(ctx, "echo changed > a.txt && cat a.txt") == "changed\n"


def test_a_git_file_cannot_be_pointed_elsewhere(ws: Path, ctx: ToolContext) -> None:
    (ws / ".git").write_text("gitdir: ../elsewhere/.git\n")
    for_commands(ws)
    ran(ctx, "echo 'gitdir: planted' > .git")
    assert (ws / ".git").read_text() == "gitdir: ../elsewhere/.git\n"


def test_a_linked_config_is_refused(repo: Path, ctx: ToolContext) -> None:
    config = repo / ".git" / "config"
    (repo / "real.gitconfig").write_text(config.read_text())
    config.unlink()
    config.symlink_to("../real.gitconfig")
    assert ran(ctx, "touch ran") == (
        f"error: Commands cannot run in this workspace: {config} is a symbolic link, and git on the host would "
        "follow wherever a command pointed it. Make it a plain file or folder."
    )
    assert not (repo / "ran").exists()
    with pytest.raises(LinkedEntry), repository_guards(str(repo)):
        pass


def test_a_workspace_without_a_repository_has_nothing_guarded(ws: Path, make_ctx: Callable[..., ToolContext]) -> None:
    with repository_guards(str(ws)) as guards:
        assert guards.items == []
    assert ran(make_ctx(), "git init -q && ls -A") == ".git\n"


def test_submodules_git_folders_are_guarded(repo: Path, ctx: ToolContext) -> None:
    module = repo / ".git" / "modules" / "lib"
    (module / "hooks").mkdir(parents=True)
    (module / "HEAD").write_text("ref: refs/heads/main\n")
    (module / "config").write_text("[core]\n\tbare = false\n")
    for_commands(repo)
    with repository_guards(str(repo)) as guards:
        guarded = sorted(guard.path for guard in guards.items)
    assert guarded == sorted(
        str(path)
        for path in (
            repo / ".git" / "config",
            repo / ".git" / "hooks",
            module / "config",
            module / "hooks",
        )
    )
    ran(ctx, "echo '[core] fsmonitor = touch owned' >> .git/modules/lib/config")
    assert (module / "config").read_text() == "[core]\n\tbare = false\n"


def test_as_root_git_on_the_host_refuses_a_workspace_the_sandbox_user_owns(repo: Path) -> None:
    """Git's own guard: a repository owned by another user is not read (``safe.directory``), config and all."""
    if os.geteuid() != 0:
        pytest.skip("the suite's user owns its workspaces")
    with pytest.raises(AssertionError, match="dubious ownership"):
        git(repo, "status", trusted=False)
