"""No command and no file tool can change what git on the host reads as configuration or runs: every ``.git`` is
read-only in the sandbox and cannot be moved aside or replaced, the file tools refuse a ``.git`` path, and what a
repository's configuration names inside the workspace is read-only too. Git in the sandbox still reads the
repository (status, diff, log).

Each route the audit found, and each other one tried here, plants ``touch MARKER`` (a file outside the workspace)
and then runs git on the host as a person who trusts the repository would: the marker must never appear."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from chat.tools import ToolContext, call_tool
from chat.tools.repository import LinkedEntry, repository_guards
from chat.tools.survey import survey
from sessions_app.hygiene.outcomes import EditOutcome, ErrorOutcome, OutputOutcome
from tests.sandbox_kit import for_commands, sandbox_ids

GIT_ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null", "PATH": os.defpath}


def ran(ctx: ToolContext, command: str) -> str:
    _, outcome = call_tool("run", json.dumps({"command": command}), ctx)
    if isinstance(outcome, ErrorOutcome):
        return f"error: {outcome.message}"
    assert isinstance(outcome, OutputOutcome)
    return outcome.text


def called(ctx: ToolContext, tool: str, **arguments: object) -> str:
    _, outcome = call_tool(tool, json.dumps(arguments), ctx)
    if isinstance(outcome, ErrorOutcome):
        return f"error: {outcome.message}"
    assert isinstance(outcome, EditOutcome | OutputOutcome), outcome
    return "written" if isinstance(outcome, EditOutcome) else outcome.text


def git(ws: Path, *args: str, trusted: bool = True, check: bool = True) -> str:
    """Git on the host, as the test's user; ``trusted`` passes git's check of who owns the repository."""
    trust = ["-c", "safe.directory=*"] if trusted else []
    done = subprocess.run(
        ["git", *trust, "-C", str(ws), *args], env=GIT_ENV, capture_output=True, text=True, check=False
    )
    if done.returncode and check:
        raise AssertionError(done.stderr)
    return done.stdout + done.stderr


def host_git_runs_nothing(ws: Path, marker: Path) -> None:
    """The commands a person runs on the host in the workspace, trusting it: none runs what a command planted."""
    for args in (("status",), ("diff", "--stat"), ("log", "-1"), ("submodule", "status")):
        git(ws, *args, check=False)
    assert not marker.exists(), "git on the host ran a program a command planted"


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "owned"


@pytest.fixture
def repo(ws: Path) -> Path:
    git(ws, "init", "-q")
    git(ws, "config", "user.email", "ada@example.com")
    git(ws, "config", "user.name", "Ada")
    (ws / "a.txt").write_text("a\n")
    git(ws, "add", "a.txt")
    git(ws, "commit", "-qm", "first")
    return for_commands(ws)


def test_the_git_folder_is_read_only_and_git_reads_it(repo: Path, ctx: ToolContext, marker: Path) -> None:
    config = (repo / ".git" / "config").read_text()
    output = ran(
        ctx,
        f"git config core.fsmonitor 'touch {marker}' 2>&1 | tail -1; "
        f"echo 'touch {marker}' > .git/hooks/pre-commit 2>&1; "
        "echo b > a.txt && git status --short && git diff --stat && git log --format=%s; "
        "git commit -qam second 2>&1 | tail -1",
    )
    lines = output.splitlines()
    assert " M a.txt" in lines and "first" in lines, output
    assert any("a.txt | 2 +-" in line for line in lines), output
    assert sum("Read-only file system" in line for line in lines) >= 3, output
    assert (repo / ".git" / "config").read_text() == config
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert git(repo, "log", "--format=%s") == "first\n"
    host_git_runs_nothing(repo, marker)


def test_the_audits_first_route_a_commondir_is_refused(repo: Path, ctx: ToolContext, tmp_path: Path) -> None:
    """``run`` wrote ``.git/commondir`` pointing at a folder whose ``config`` set ``core.fsmonitor``."""
    marker = tmp_path / "owned"
    output = ran(
        ctx,
        "mkdir -p evil && printf '[core]\\n\\tfsmonitor = touch %s\\n' "
        f"{marker} > evil/config && echo ../evil > .git/commondir; echo exit=$?",
    )
    assert "Read-only file system" in output and "exit=2" in output, output
    assert not (repo / ".git" / "commondir").exists()
    host_git_runs_nothing(repo, marker)


def test_the_audits_second_route_a_git_folder_cannot_be_moved_aside(repo: Path, ctx: ToolContext, marker: Path) -> None:
    """``run`` did ``mv .git .git-old && mkdir .git`` and wrote a new ``.git/config``."""
    output = ran(
        ctx,
        "mv .git .git-old; rm -rf .git; "
        f"mkdir -p .git && printf '[core]\\n\\tfsmonitor = touch {marker}\\n' > .git/config; echo exit=$?",
    )
    assert "Device or resource busy" in output and "exit=2" in output, output
    assert not (repo / ".git-old").exists()
    assert git(repo, "log", "--format=%s") == "first\n"
    host_git_runs_nothing(repo, marker)


def test_the_audits_third_route_the_file_tools_refuse_a_git_path(
    repo: Path, make_ctx: Callable[..., ToolContext], marker: Path
) -> None:
    """``write`` in edit mode, on a workspace without commands, wrote ``.git/config`` and a pre-commit hook."""
    ctx = make_ctx(mode="edit", allow_commands=False)
    config = repo / ".git" / "config"
    before = config.read_text()
    (repo / "cfg").symlink_to(".git/config")
    planted = f"[core]\n\tfsmonitor = touch {marker}\n"
    hook = repo / ".git" / "hooks" / "pre-commit"
    answers = [
        called(ctx, "write", path=".git/config", content=planted),
        called(ctx, "write", path=".git/hooks/pre-commit", content=f"#!/bin/sh\ntouch {marker}\n"),
        called(ctx, "edit", path=".git/config", old_string="[core]", new_string=planted),
        called(ctx, "multiedit", path="cfg", edits=[{"old_string": "[core]", "new_string": planted}]),
        called(ctx, "write", path="sub/../.GIT/info/attributes", content="* filter=evil\n"),
        called(
            ctx,
            "apply_patch",
            patch=f"*** Begin Patch\n*** Add File: .git/hooks/post-checkout\n+touch {marker}\n*** End Patch",
        ),
    ]
    for answer, path in zip(
        answers,
        [config, hook, config, config, repo / ".GIT" / "info" / "attributes", hook.with_name("post-checkout")],
        strict=True,
    ):
        assert answer == (
            f"error: Refused: {path} is in a git folder (.git); the model may not change a repository's "
            "configuration, hooks or history."
        )
    assert config.read_text() == before and not hook.exists()
    assert not isinstance(call_tool("read", json.dumps({"path": ".git/config"}), ctx)[1], ErrorOutcome)
    host_git_runs_nothing(repo, marker)


def test_included_config_and_programs_it_names_in_the_workspace_are_read_only(
    repo: Path, ctx: ToolContext, marker: Path
) -> None:
    (repo / "tools").mkdir()
    (repo / "tools" / "fsmon.sh").write_text("#!/bin/sh\nexit 0\n")
    (repo / "tools" / "fsmon.sh").chmod(0o755)
    (repo / "shared.gitconfig").write_text("[user]\n\tname = Shared\n")
    (repo / ".githooks").mkdir()
    git(repo, "config", "include.path", "../shared.gitconfig")
    git(repo, "config", "core.hooksPath", ".githooks")
    git(repo, "config", "core.sshCommand", "./tools/fsmon.sh")
    for_commands(repo)
    output = ran(
        ctx,
        f"printf '[core]\\n\\tpager = touch {marker}\\n' >> shared.gitconfig; "
        f"echo 'touch {marker}' >> tools/fsmon.sh; echo 'touch {marker}' > .githooks/pre-commit; "
        "mv tools tools-old; echo changed > a.txt && cat a.txt",
    )
    assert output.count("Read-only file system") == 3 and "Device or resource busy" in output, output
    assert output.endswith("changed\n")
    assert (repo / "shared.gitconfig").read_text() == "[user]\n\tname = Shared\n"
    assert (repo / "tools" / "fsmon.sh").read_text() == "#!/bin/sh\nexit 0\n"
    assert list((repo / ".githooks").iterdir()) == []
    host_git_runs_nothing(repo, marker)


def test_worktree_attributes_and_gitmodules_run_nothing(repo: Path, ctx: ToolContext, marker: Path) -> None:
    """What a command may still write, ``.gitattributes`` and ``.gitmodules``, names programs only through the
    configuration, which it cannot change: git on the host runs none of them."""
    ran(
        ctx,
        "echo '* filter=evil diff=evil' > .gitattributes; "
        f'printf \'[submodule "x"]\\n\\tpath = x\\n\\turl = ext::sh -c touch% {marker}\\n'
        f"\\tupdate = !touch {marker}\\n' > .gitmodules; "
        f"echo '* filter=evil' > .git/info/attributes 2>&1; mkdir -p x; echo b > a.txt",
    )
    assert (repo / ".gitattributes").exists() and not (repo / ".git" / "info" / "attributes").exists()
    host_git_runs_nothing(repo, marker)
    git(repo, "submodule", "update", "--init", check=False)
    assert not marker.exists()


def test_repositories_at_any_depth_are_guarded(ws: Path, ctx: ToolContext, marker: Path) -> None:
    deep = ws / "vendor" / "lib"
    deep.mkdir(parents=True)
    git(deep, "init", "-q")
    for_commands(ws)
    config = (deep / ".git" / "config").read_text()
    output = ran(
        ctx,
        f"git -C vendor/lib config core.fsmonitor 'touch {marker}' 2>&1 | tail -1; "
        "mv vendor vendor-old; mv vendor/lib vendor/lib-old; rm -rf vendor/lib/.git 2>&1 | tail -1; "
        "touch vendor/new.txt vendor/lib/new.txt && echo wrote",
    )
    assert output.count("Device or resource busy") == 2 and output.endswith("wrote\n"), output
    assert (deep / ".git" / "config").read_text() == config
    host_git_runs_nothing(deep, marker)


def test_a_git_file_and_the_folder_it_points_to_inside_the_workspace(ws: Path, ctx: ToolContext) -> None:
    git(ws, "init", "-q", "--separate-git-dir", str(ws / "store"))
    for_commands(ws)
    assert (ws / ".git").read_text().startswith("gitdir: ")
    config = (ws / "store" / "config").read_text()
    output = ran(ctx, "echo 'gitdir: planted' > .git; echo '[core] fsmonitor = x' >> store/config; echo done")
    assert output.count("Read-only file system") == 2, output
    assert (ws / "store" / "config").read_text() == config


def test_a_repository_a_command_makes_is_refused_by_git_on_the_host_as_root(
    ws: Path, ctx: ToolContext, marker: Path
) -> None:
    """A repository a command makes has the configuration the command gave it (from the next command on it is
    read-only like any). As root, commands run as the sandbox user, so git on the host refuses it as another
    user's (``dubious ownership``) and runs nothing of it."""
    if sandbox_ids() is None:
        pytest.skip("commands run as Cachet's own user")
    output = ran(ctx, f"git init -q made && git -C made config core.fsmonitor 'touch {marker}' && echo made")
    assert output == "made\n"
    assert "dubious ownership" in git(ws / "made", "status", trusted=False, check=False)
    assert not marker.exists()
    assert "Read-only file system" in ran(ctx, "git -C made config core.pager cat 2>&1")


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
    fd = os.open(repo, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(LinkedEntry), repository_guards(fd, str(repo), survey(fd).git_entries):
            pass
    finally:
        os.close(fd)


def test_what_is_guarded_and_pinned(repo: Path) -> None:
    module = repo / ".git" / "modules" / "lib"
    (module / "hooks").mkdir(parents=True)
    (module / "HEAD").write_text("ref: refs/heads/main\n")
    nested = repo / "a" / "b"
    nested.mkdir(parents=True)
    git(nested, "init", "-q")
    fd = os.open(repo, os.O_PATH | os.O_DIRECTORY)
    try:
        found = survey(fd).git_entries
        assert sorted(found) == [".git", "a/b/.git"]
        with repository_guards(fd, str(repo), found) as guards:
            guarded = [(guard.path, guard.read_only) for guard in guards.items]
    finally:
        os.close(fd)
    assert guarded == [
        (str(repo / ".git"), True),
        (str(repo / "a"), False),
        (str(repo / "a" / "b"), False),
        (str(repo / "a" / "b" / ".git"), True),
    ]


def test_a_workspace_without_a_repository_has_nothing_guarded(ws: Path, make_ctx: Callable[..., ToolContext]) -> None:
    fd = os.open(ws, os.O_PATH | os.O_DIRECTORY)
    try:
        with repository_guards(fd, str(ws), survey(fd).git_entries) as guards:
            assert guards.items == []
    finally:
        os.close(fd)
    assert ran(make_ctx(), "git init -q && ls -A") == ".git\n"


def test_git_in_the_sandbox_trusts_a_repository_another_user_owns(ws: Path, ctx: ToolContext) -> None:
    """The workspace's own repository (that path only): as root, a repository root owns reads as another user's
    in the sandbox, and git would refuse it as of dubious ownership."""
    git(ws, "init", "-q")
    (ws / "a.txt").write_text("a\n")
    output = ran(ctx, "git status --short; git -C /tmp status 2>&1 | head -1")
    assert output.startswith("?? a.txt\n"), output


def test_a_file_the_config_names_that_does_not_exist_yet_is_refused(repo: Path, ctx: ToolContext, marker: Path) -> None:
    """The audit's include of a file that did not exist yet: a command created it, and git on the host read it
    (no ``safe.directory`` needed). A path or program the configuration needs that is missing inside the
    workspace makes ``run`` refuse the workspace, naming both; what only looks like a path (a remote's URL, a
    branch's ref, an alias's argument) does not."""
    git(repo, "remote", "add", "origin", "https://example.org/team/repo.git")
    git(repo, "config", "branch.main.merge", "refs/heads/main")
    git(repo, "config", "alias.lg", "log --format=%h/%s")
    assert ran(ctx, "echo fine") == "fine\n"
    git(repo, "config", "include.path", "../.gitconfig.local")
    planted = f"printf '[core]\\n\\tfsmonitor = touch {marker}\\n' > .gitconfig.local; echo $?"
    assert ran(ctx, planted) == (
        f"error: Commands cannot run in this workspace: {repo}/.git/config names {repo}/.gitconfig.local "
        "(include.path), which does not exist; a command could create it, and git on the host would read or run "
        "it. Create it on the host (an empty file will do) or remove the setting."
    )
    assert not (repo / ".gitconfig.local").exists()
    (repo / ".gitconfig.local").write_text("")
    for_commands(repo)
    assert "Read-only file system" in ran(ctx, planted)
    host_git_runs_nothing(repo, marker)
    git(repo, "config", "core.hooksPath", ".githooks")
    assert "names " + str(repo / ".githooks") + " (core.hookspath)" in ran(ctx, "mkdir .githooks")
    git(repo, "config", "--unset", "core.hooksPath")
    git(repo, "config", "core.sshCommand", "./tools/ssh.sh -v")
    assert "names " + str(repo / "tools" / "ssh.sh") + " (core.sshcommand)" in ran(ctx, "mkdir tools")
    assert not (repo / "tools").exists()


def plant_bare(folder: str, marker: Path) -> str:
    """A shell line that makes ``folder`` what git takes for a bare repository, its config running ``marker``."""
    return (
        f"mkdir -p {folder}/objects {folder}/refs/heads && echo 'ref: refs/heads/main' > {folder}/HEAD && "
        f"printf '[core]\\n\\tbare = false\\n\\tworktree = ..\\n\\tfsmonitor = touch {marker}\\n' > {folder}/config"
    )


def test_a_command_cannot_leave_a_folder_git_takes_for_a_repository(ws: Path, ctx: ToolContext, marker: Path) -> None:
    """The audit's route with no ``.git`` at all: ``HEAD``, ``objects``, ``refs`` and a ``config`` written into a
    folder (or the workspace itself) make git on the host take it for a bare repository, trust it as its owner's
    and run its ``core.fsmonitor``. Whatever a command makes so has its ``HEAD`` renamed as soon as the workspace
    is walked again (every second while it runs, and as it ends), and the result says so."""
    (ws / "src").mkdir()
    for_commands(ws)
    output = ran(ctx, f"{plant_bare('src', marker)} && sleep 2.5 && ls src")
    renamed = (
        f"[Cachet renamed {ws}/src/HEAD to HEAD.disarmed: the command made {ws}/src a git folder, which git on the "
        "host would take for a repository and run what its config names]"
    )
    lines = output.splitlines()
    assert lines[0] == "HEAD.disarmed" and "HEAD" not in lines[1:-1] and lines[-1] == renamed, output
    assert ran(ctx, f"{plant_bare('.', marker)}").endswith(
        f"[Cachet renamed {ws}/HEAD to HEAD.disarmed: the command made {ws} a git folder, which git on the host "
        "would take for a repository and run what its config names]"
    )
    assert ran(ctx, "git init -q --bare made.git && echo 'ref: refs/heads/main' > src/HEAD").count("renamed") == 2
    for folder in (ws / "src", ws / "src" / "objects", ws, ws / "made.git"):
        host_git_runs_nothing(folder, marker)
    assert sorted(path.name for path in ws.glob("**/HEAD*")) == ["HEAD.disarmed"] * 3 + ["HEAD.disarmed2"]


def test_a_bare_repository_the_workspace_holds_is_read_only(ws: Path, make_ctx: Callable[..., ToolContext]) -> None:
    """A git folder not named ``.git`` (a bare repository, a mirror) is guarded as a ``.git`` is, by commands and
    by the file tools; a workspace folder that is itself one takes no command."""
    git(ws, "init", "-q", "--bare", "backup.git")
    for_commands(ws)
    config = (ws / "backup.git" / "config").read_text()
    ctx = make_ctx()
    output = ran(ctx, "echo '[core] fsmonitor = x' >> backup.git/config; mv backup.git moved; echo done")
    assert "Read-only file system" in output and "Device or resource busy" in output, output
    assert (ws / "backup.git" / "config").read_text() == config
    answer = called(make_ctx(mode="edit"), "write", path="backup.git/hooks/pre-commit", content="touch x\n")
    assert answer == (
        f"error: Refused: {ws}/backup.git/hooks/pre-commit is in a git folder ({ws}/backup.git holds a "
        "repository's HEAD); the model may not change a repository's configuration, hooks or history."
    )
    bare = ws / "bare"
    bare.mkdir()
    git(bare, "init", "-q", "--bare", ".")
    for_commands(ws)
    inner = make_ctx(root=bare)
    assert ran(inner, "echo ran") == (
        f"error: Commands cannot run in this workspace: its folder {bare} is itself a git folder (it holds a "
        "repository's HEAD), whose configuration a command could change. Move the repository into a folder of the "
        "workspace."
    )


def test_the_file_tools_make_no_folder_a_git_folder(
    ws: Path, make_ctx: Callable[..., ToolContext], marker: Path
) -> None:
    """The audit's ``write`` in edit mode, on a workspace without commands, of ``src/HEAD``, ``src/objects``,
    ``src/refs`` and ``src/config``: a ``HEAD`` git would accept is refused (a symbolic ref or an object id);
    a file of that name holding anything else is an ordinary file."""
    ctx = make_ctx(mode="edit", allow_commands=False)
    (ws / "src").mkdir()
    called(ctx, "write", path="src/objects/keep", content="")
    called(ctx, "write", path="src/refs/heads/keep", content="")
    called(ctx, "write", path="src/config", content=f"[core]\n\tworktree = ..\n\tfsmonitor = touch {marker}\n")
    for content in ("ref: refs/heads/main\n", "ref:refs/x", "0123456789abcdef0123456789abcdef01234567\n"):
        assert called(ctx, "write", path="src/HEAD", content=content) == (
            f"error: Refused: {ws}/src/HEAD would make its folder a git folder (it reads as a repository's HEAD); "
            "the model may not make what git on the host would take for a repository."
        )
    assert called(ctx, "write", path="src/HEAD", content="the newest notes go on top\n") == "written"
    assert called(ctx, "edit", path="src/HEAD", old_string="the newest", new_string="ref: refs/heads/x\nthe") == (
        f"error: Refused: {ws}/src/HEAD would make its folder a git folder (it reads as a repository's HEAD); "
        "the model may not make what git on the host would take for a repository."
    )
    host_git_runs_nothing(ws / "src", marker)
