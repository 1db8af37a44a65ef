"""Git as Cachet's own scripts run it runs nothing a repository names."""

from __future__ import annotations

import subprocess
from pathlib import Path

from testing.safe_git import git_argv, git_env


def test_a_repository_that_names_programs_runs_none_of_them(tmp_path: Path) -> None:
    repo, marker = tmp_path / "repo", tmp_path / "owned"
    repo.mkdir()

    def git(*args: str) -> str:
        done = subprocess.run(git_argv("-C", str(repo), *args), env=git_env(), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    git("init", "-q")
    (repo / "a.txt").write_text("a\n")
    (repo / ".gitattributes").write_text("* diff=evil\n")
    git("-c", "user.email=a@b", "-c", "user.name=A", "add", ".")
    git("-c", "user.email=a@b", "-c", "user.name=A", "commit", "-qm", "first")
    with (repo / ".git" / "config").open("a") as config:
        config.write(
            f"[core]\n\tfsmonitor = touch {marker}.fsmonitor\n\tpager = touch {marker}.pager\n"
            f'[diff "evil"]\n\ttextconv = touch {marker}.textconv\n\tcommand = touch {marker}.diff\n'
        )
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {marker}.hook\n")
    hook.chmod(0o755)
    (repo / "a.txt").write_text("b\n")
    git("status")
    git("diff")
    git("log", "-p")
    git("worktree", "add", "--detach", str(tmp_path / "tree"), "HEAD")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["repo", "tree"]
