from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from chat.tools import Sandbox, ToolContext, ToolError, acl, call_tool, run
from chat.tools import quota as quota_module
from chat.tools import run as run_module_function
from chat.tools import sandbox as sandbox_module
from sessions_app.hygiene.outcomes import ErrorOutcome, OutputOutcome
from tests.listeners import stop_listening
from tests.sandbox_kit import for_commands, open_the_way, sandbox_ids

RUN_MODULE = __import__("chat.tools.run", fromlist=["execute"])
REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


def text(outcome: object) -> str:
    assert isinstance(outcome, OutputOutcome)
    return outcome.text


def ran(ctx: ToolContext, command: str, timeout: int | None = None) -> str:
    """What the model gets for ``run(command)``: the output text, or the error line."""
    arguments: dict[str, object] = {"command": command}
    if timeout is not None:
        arguments["timeout"] = timeout
    _, outcome = call_tool("run", json.dumps(arguments), ctx)
    if isinstance(outcome, ErrorOutcome):
        return f"error: {outcome.message}"
    return text(outcome)


def marker() -> str:
    """Digits no other process on the machine has in its command line."""
    return str(10**11 + secrets.randbelow(10**11))


def processes_with(mark: str) -> list[int]:
    """The live processes whose command line holds ``mark`` (a zombie's command line is empty)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                if mark.encode() in handle.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def own_children() -> set[int]:
    children: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children", encoding="ascii") as handle:
            children.update(int(pid) for pid in handle.read().split())
    return children


def gone(mark: str, within: float = 5.0) -> bool:
    """Whether no process with ``mark`` is left; the kernel may take a moment to end a pid namespace."""
    deadline = time.monotonic() + within
    while processes_with(mark):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("echo hi", "hi\n"),
        ("echo hi; exit 3", "hi\n[exit 3]"),
        ("printf partial; exit 2", "partial\n[exit 2]"),
        ("exit 1", "[exit 1]"),
        ("true", ""),
        ("echo out; echo err >&2; echo out again", "out\nerr\nout again\n"),
        ("cat; echo done", "done\n"),
        ("kill -9 $$", "[exit 137]"),
        ("printf 'bad \\377 byte\\n'", "bad \ufffd byte\n"),
    ],
)
def test_output_and_exit_line(ctx: ToolContext, command: str, expected: str) -> None:
    assert text(run({"command": command}, ctx)) == expected


def test_runs_in_the_workspace_with_only_its_own_environment(
    ws: Path, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CACHET_TEST_SECRET", "hunter2")
    assert ran(ctx, 'pwd; echo "[$CACHET_TEST_SECRET]"; env | sort') == (
        f"{ws}\n[]\n"
        f"HOME={ws}\nLANG=C.UTF-8\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        f"PWD={ws}\nTERM=dumb\n"
    )


def test_the_sandbox_holds_the_workspace_and_system_folders_only(ws: Path, ctx: ToolContext) -> None:
    (ws / "notes.txt").write_text("mine\n")
    system = {folder.lstrip("/") for folder in sandbox_module.SYSTEM_FOLDERS if os.path.lexists(folder)}
    top = sorted(system | {"dev", "etc", "proc", "tmp", "usr"} | {ws.parts[1]})
    assert ran(ctx, "ls /") == "".join(f"{name}\n" for name in top)
    assert ran(ctx, "ls; cat notes.txt; id -un; ls /etc | sort") == (
        "notes.txt\nmine\n"
        f"{sandbox_module.command_identity(ctx.sandbox, ctx.config).user}\n"
        "alternatives\ngitconfig\ngroup\nhosts\nld.so.cache\nld.so.conf\nld.so.conf.d\nlocaltime\nnsswitch.conf\npasswd\n"
    )


def test_commands_never_run_as_root(ctx: ToolContext) -> None:
    uid, gid, groups = ran(ctx, "id -u; id -g; id -G").splitlines()
    assert "0" not in (uid, gid, *groups.split())
    if os.geteuid() == 0:
        assert ctx.sandbox.user == "cachet-sandbox"
        sandbox_user = pwd.getpwnam(ctx.sandbox.user)
        assert (int(uid), int(gid), groups) == (sandbox_user.pw_uid, sandbox_user.pw_gid, str(sandbox_user.pw_gid))
    else:
        assert (int(uid), int(gid)) == (os.getuid(), os.getgid())


KERNEL_INTERFACE = r"""
checked=0
top=$(find /proc -mindepth 1 -maxdepth 1 ! -name '[0-9]*' ! -name self ! -name thread-self)
for f in $(find /proc/sys /sys 2>/dev/null) $top; do
  checked=$((checked + 1))
  if test -w "$f"; then echo "writable: $f"; fi
done
echo "checked $checked"
ls /sys 2>&1
for f in /dev/*; do if test -w "$f"; then echo "dev: $f"; fi; done
"""


def test_no_kernel_setting_can_be_written(ctx: ToolContext) -> None:
    """Every path under /proc/sys and /sys, and every kernel file at the top of /proc, by ``test -w``: none is
    writable, as root or not (a write is never tried). /dev holds only the usual devices."""
    lines = ran(ctx, KERNEL_INTERFACE).splitlines()
    assert [line for line in lines if line.startswith("writable:")] == []
    checked = int(next(line for line in lines if line.startswith("checked "))[len("checked ") :])
    assert checked > 500, lines
    assert "ls: cannot access '/sys': No such file or directory" in lines
    writable_devices = {line.split("/dev/", 1)[1] for line in lines if line.startswith("dev: ")}
    own = {"fd", "stdin", "stdout", "stderr"}  # links into /proc/self
    assert writable_devices <= {"full", "null", "ptmx", "pts", "random", "shm", "tty", "urandom", "zero"} | own
    print(f"checked {checked} paths under /proc/sys, /sys and /proc: none writable")


def test_ordinary_commands_work_in_the_workspace(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.txt").write_text("a\n")
    assert ran(ctx, "ls") == "a.txt\n"
    assert ran(ctx, "python3 -c 'print(1)'") == "1\n"
    output = ran(ctx, "git init -q && git status")
    assert "No commits yet" in output and "a.txt" in output and "[exit" not in output
    assert (ws / ".git" / "HEAD").is_file()
    assert ran(ctx, "echo made > b.txt && mkdir -p sub && echo deep > sub/c.txt") == ""
    assert (ws / "b.txt").read_text() == "made\n" and (ws / "sub" / "c.txt").read_text() == "deep\n"


def test_the_secret_key_outside_the_workspace_cannot_be_read(tmp_path: Path, ctx: ToolContext) -> None:
    data = tmp_path / "cachet-data"
    data.mkdir()
    (data / "secret_key").write_text("very-secret-key")
    output = ran(ctx, f"cat {data}/secret_key; ls {data}; ls -A {tmp_path}")
    assert output == (
        f"cat: {data}/secret_key: No such file or directory\n"
        f"ls: cannot access '{data}': No such file or directory\n"
        "ws\n"
    )


def test_cachet_data_inside_the_workspace_is_covered(
    ws: Path, make_ctx: Callable[..., ToolContext], tmp_path: Path
) -> None:
    data = ws / "project" / ".cachet"
    data.mkdir(parents=True)
    (data / "secret_key").write_text("very-secret-key")
    (ws / "project" / "main.py").write_text("print('hi')\n")
    ctx = make_ctx(sandbox=Sandbox(hidden=(str(data), str(tmp_path / "elsewhere"))))
    assert ran(ctx, "ls -A project project/.cachet; cat project/.cachet/secret_key") == (
        "project:\n.cachet\nmain.py\n\nproject/.cachet:\n"
        "cat: project/.cachet/secret_key: No such file or directory\n[exit 1]"
    )
    assert (data / "secret_key").read_text() == "very-secret-key"


PROBE_CONNECT = """
import socket, sys
family, where = sys.argv[1], sys.argv[2]
if family == "unix":
    sock, address = socket.socket(socket.AF_UNIX), where
else:
    host, port = where.rsplit(":", 1)
    sock, address = socket.socket(), (host, int(port))
sock.settimeout(5)
try:
    sock.connect(address)
except OSError as error:
    print(type(error).__name__)
else:
    sock.sendall(b"hello from the sandbox")
    print("connected")
"""


def connect_from(ctx: ToolContext, family: str, where: str) -> str:
    return ran(ctx, f"python3 -c '{PROBE_CONNECT}' {family} {where}")


def test_the_database_cannot_be_reached(ctx: ToolContext) -> None:
    socket_dir = str(connection.get_connection_params()["host"])
    sockets = [name for name in os.listdir(socket_dir) if name.startswith(".s.PGSQL.")]
    assert sockets, "the embedded Postgres listens on a unix socket"
    socket_path = os.path.join(socket_dir, sockets[0])
    probe = socket.socket(socket.AF_UNIX)
    probe.connect(socket_path)
    probe.close()
    assert connect_from(ctx, "unix", socket_path) == "FileNotFoundError\n"
    assert connect_from(ctx, "tcp", "127.0.0.1:5432") == "ConnectionRefusedError\n"


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, list[bytes]]]:
    server = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            connection, _ = server.accept()
            with connection:
                received.append(connection.recv(100))

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server, received
    stop_listening(server, thread)


def test_no_network_unless_the_workspace_allows_it(
    make_ctx: Callable[..., ToolContext], listener: tuple[socket.socket, list[bytes]]
) -> None:
    server, received = listener
    where = f"127.0.0.1:{server.getsockname()[1]}"
    assert connect_from(make_ctx(), "tcp", where) == "ConnectionRefusedError\n"
    assert connect_from(make_ctx(), "tcp", "192.0.2.1:80") == "OSError\n"  # no route: only lo exists
    assert received == []
    allowed = make_ctx(allow_network=True)
    assert connect_from(allowed, "tcp", where) == "connected\n"
    deadline = time.monotonic() + 5
    while not received and time.monotonic() < deadline:
        time.sleep(0.01)
    assert received == [b"hello from the sandbox"]
    assert "nameserver" in ran(allowed, "cat /etc/resolv.conf") or not os.path.exists("/etc/resolv.conf")
    assert ran(make_ctx(), "cat /etc/resolv.conf") == "cat: /etc/resolv.conf: No such file or directory\n[exit 1]"


def test_the_server_process_is_not_visible(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHET_TEST_MARK", "hunter2")
    output = ran(ctx, f"cat /proc/{os.getpid()}/environ; cat /proc/[0-9]*/environ | tr '\\0' '\\n' | grep -c hunter2")
    assert output == f"cat: /proc/{os.getpid()}/environ: No such file or directory\n0\n[exit 1]"
    pids = ran(ctx, "ls /proc | grep -E '^[0-9]+$' | sort -n").split()
    assert pids and all(int(pid) < 10 for pid in pids)


def test_nothing_outside_the_workspace_can_be_written(ws: Path, tmp_path: Path, ctx: ToolContext) -> None:
    name = f"cachet-test-{marker()}"
    output = ran(
        ctx,
        f"touch /usr/{name}; echo x > {REPO}/{name}; echo x >> /etc/passwd; "
        f"echo scratch > /tmp/{name} && cat /tmp/{name}; echo beside > {tmp_path}/{name} && cat {tmp_path}/{name}",
    )
    assert output == (
        f"touch: cannot touch '/usr/{name}': Read-only file system\n"
        f"/bin/sh: 1: cannot create {REPO}/{name}: Directory nonexistent\n"
        "/bin/sh: 1: cannot create /etc/passwd: Read-only file system\n"
        "scratch\nbeside\n"
    )
    assert not os.path.exists(f"/usr/{name}") and not (REPO / name).exists()
    assert not os.path.exists(f"/tmp/{name}") and not (tmp_path / name).exists()
    assert os.listdir(ws) == []


def test_what_a_command_leaves_running_is_killed(ctx: ToolContext) -> None:
    mark = marker()
    children = own_children()
    assert ran(ctx, f"sleep 1000.{mark} & (sleep 1000.{mark} &); echo left") == "left\n"
    assert gone(mark)
    assert own_children() == children


def test_timeout_kills_everything_the_command_started(ctx: ToolContext) -> None:
    mark = marker()
    assert ran(ctx, f"echo started; sleep 1000.{mark} & sleep 1000.{mark}", timeout=1) == (
        "started\n[timed out after 1 s]"
    )
    assert gone(mark), "both sleeps of 1000 s ended with the command's timeout"


def test_a_command_that_ignores_sigterm_still_ends_at_its_timeout(ctx: ToolContext) -> None:
    mark = marker()
    assert ran(ctx, f"trap '' TERM; sleep 1000.{mark} & wait", timeout=1) == "[timed out after 1 s]"
    assert gone(mark)


def test_timeout_is_capped(make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(run_max_timeout=1, run_timeout=1)
    assert text(run({"command": "sleep 30", "timeout": 99999}, ctx)) == "[timed out after 1 s]"
    assert text(run({"command": "sleep 30"}, ctx)) == "[timed out after 1 s]"


BOMB = ":(){ :|:& };:"


def watch_while(mark: str, work: Callable[[], str]) -> tuple[str, int, bool]:
    """Run ``work`` in a thread; meanwhile count the processes holding ``mark`` and start one of our own.
    Returns what ``work`` returned, the most processes seen at once, and whether ours could start."""
    result: list[str] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    peak, could_start = 0, False
    while thread.is_alive():
        count = len(processes_with(mark))
        peak = max(peak, count)
        if count > 8 and not could_start:
            could_start = subprocess.run(["true"], check=False).returncode == 0
        time.sleep(0.01)
    thread.join()
    return result[0], peak, could_start


@pytest.mark.parametrize("after", ["", "; sleep 1000"], ids=["bomb", "bomb-and-wait"])
def test_a_fork_bomb_is_held_to_the_process_limit(make_ctx: Callable[..., ToolContext], after: str) -> None:
    """The bare bomb may end with its shell, which ends the pid namespace; the waiting one times out."""
    limit = 32
    mark = marker()
    children = own_children()
    ctx = make_ctx(sandbox=Sandbox(max_processes=limit))
    output, peak, could_start = watch_while(mark, lambda: ran(ctx, f"bash -c '{BOMB}{after} # {mark}'", timeout=3))
    assert peak <= limit + limit // 4  # a scan of /proc is no snapshot: a few may be counted twice
    if after:
        assert output.endswith("[timed out after 3 s]")
        assert "fork: retry: Resource temporarily unavailable" in output
        assert peak >= limit // 2
        assert could_start
    assert gone(mark)
    assert own_children() == children


def python_for_nobody() -> str | None:
    """A Python that uid 65534 can run and import the tools with, or None."""
    return python_for(NOBODY, NOBODY)


def python_for(uid: int, gid: int) -> str | None:
    """A Python that ``uid`` can run and import the tools with, or None (the system's first: a virtual
    environment's often links into a home folder closed to others)."""
    for python in ("/usr/bin/python3", sys.executable):
        tried = subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", python, "-c", "import chat.tools"],
            env={"PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", "PATH": os.defpath},
            capture_output=True,
            check=False,
        )
        if tried.returncode == 0:
            return python
    return None


AS_NOBODY = """
import json, sys
from pathlib import Path
from chat.tools import Sandbox, ToolContext, call_tool
from sessions_app.hygiene.config import context_config
spec = json.loads(sys.stdin.read())
with open(spec["loop"], encoding="utf-8") as handle:
    config = context_config(json.load(handle)["context"])
ctx = ToolContext(
    root=Path(spec["root"]), config=config, mode="full", tools=("run",), allow_commands=True,
    last_seen_sha=lambda path: None, recall=lambda number: None, sandbox=Sandbox(max_processes=spec["limit"]),
)
_, outcome = call_tool("run", json.dumps({"command": spec["command"], "timeout": spec["timeout"]}), ctx)
print(json.dumps(getattr(outcome, "text", None) or getattr(outcome, "message", "")))
"""


@pytest.mark.skipif(os.getuid() != 0, reason="the suite runs as another user: the test above covers that case")
def test_a_fork_bomb_is_held_to_the_process_limit_when_cachet_is_not_root() -> None:
    python = python_for_nobody()
    if python is None:
        pytest.skip("no Python that uid 65534 can run and import Cachet with")
    limit = 32
    mark = marker()
    workspace = tempfile.mkdtemp(prefix="cachet-nobody-")
    try:
        os.chown(workspace, NOBODY, NOBODY)

        def bomb() -> str:
            spec = {
                "loop": str(REPO / "prompts" / "loop.json"),
                "root": workspace,
                "limit": limit,
                "command": f"id -u; bash -c 'ulimit -u'; bash -c '{BOMB}; sleep 1000.{mark}'",
                "timeout": 3,
            }
            done = subprocess.run(
                ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c", AS_NOBODY],
                input=json.dumps(spec),
                env={"PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", "PATH": os.defpath},
                capture_output=True,
                text=True,
                check=True,
            )
            answer: str = json.loads(done.stdout)
            return answer

        output, peak, could_start = watch_while(mark, bomb)
    finally:
        shutil.rmtree(workspace)
    first, nproc = output.split("\n")[:2]
    assert first == str(NOBODY)
    assert int(nproc) >= limit
    assert output.endswith("[timed out after 3 s]")
    assert "fork: retry: Resource temporarily unavailable" in output
    assert limit // 2 <= peak <= limit + limit // 4  # a scan of /proc is no snapshot: a few may be counted twice
    assert could_start
    assert gone(mark)


def test_memory_is_limited(make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(sandbox=Sandbox(memory_bytes=64 << 20))
    output = ran(ctx, "python3 -c \"b = b'x' * (256 << 20); print('allocated')\"")
    assert "allocated" not in output
    assert output.endswith(("[exit 137]", "[exit 1]"))
    assert ran(ctx, "python3 -c \"b = b'x' * (16 << 20); print('allocated')\"") == "allocated\n"


def test_a_missing_bubblewrap_refuses_and_runs_nothing(
    ws: Path, tmp_path: Path, make_ctx: Callable[..., ToolContext]
) -> None:
    ctx = make_ctx(sandbox=Sandbox(bwrap=str(tmp_path / "no-such-bwrap")))
    assert ran(ctx, "touch ran") == (
        f"error: Commands cannot run here: the sandbox program {tmp_path}/no-such-bwrap is missing. "
        "Install bubblewrap (apt-get install bubblewrap), or set CACHET_BWRAP to where it is."
    )
    assert not (ws / "ran").exists()


UNSANDBOXABLE = """
import json, sys
from pathlib import Path
from chat.tools import ToolContext, call_tool
from sessions_app.hygiene.config import context_config
with open(sys.argv[1], encoding="utf-8") as handle:
    config = context_config(json.load(handle)["context"])
ctx = ToolContext(
    root=Path(sys.argv[2]), config=config, mode="full", tools=("run",), allow_commands=True,
    last_seen_sha=lambda path: None, recall=lambda number: None,
)
for _ in range(2):
    print(call_tool("run", json.dumps({"command": "touch ran"}), ctx)[1].message)
"""


def test_no_user_namespaces_refuses_and_runs_nothing(ws: Path) -> None:
    """In a user namespace that may make no more of them, bubblewrap really fails: ``run`` says why."""
    script = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" -c "$1" "$2" "$3"'
    arguments = [str(REPO / "prompts" / "loop.json"), str(ws)]
    ids = sandbox_ids()  # as root, the namespace's root is the sandbox user: no root of the kernel's to drop
    become = [] if ids is None else ["setpriv", f"--reuid={ids[0]}", f"--regid={ids[1]}", "--clear-groups"]
    python = sys.executable if ids is None else python_for(*ids)
    if python is None:
        pytest.skip("no Python that the sandbox user can run and import Cachet with")
    done = subprocess.run(
        [*become, "unshare", "--user", "--map-root-user", "sh", "-c", script, python, UNSANDBOXABLE, *arguments],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    expected = (
        "Commands cannot run here: bubblewrap cannot make a sandbox (bwrap: Creating new namespace failed: "
        "nesting depth or /proc/sys/user/max_*_namespaces exceeded (ENOSPC)). Allow unprivileged user namespaces "
        "(sysctl -w kernel.unprivileged_userns_clone=1 and user.max_user_namespaces=10000; on Ubuntu also "
        "kernel.apparmor_restrict_unprivileged_userns=0), or in Docker run with --security-opt seccomp=unconfined "
        "--security-opt apparmor=unconfined --security-opt systempaths=unconfined."
    )
    assert done.stdout == f"{expected}\n{expected}\n"
    assert not (ws / "ran").exists()


def test_the_verdict_is_kept_and_checked_again(
    ws: Path, tmp_path: Path, make_ctx: Callable[..., ToolContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bubblewrap that cannot make a sandbox is tried once, again after a while or once it changed."""
    log = tmp_path / "calls"
    log.touch(mode=0o666)
    log.chmod(0o666)
    fake = tmp_path / "bwrap"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\necho "bwrap: setting up uid map: Permission denied" >&2\nexit 1\n')
    fake.chmod(0o755)
    ctx = make_ctx(sandbox=Sandbox(bwrap=str(fake)))
    for _ in range(3):
        assert ran(ctx, "touch ran").startswith(
            "error: Commands cannot run here: bubblewrap cannot make a sandbox "
            "(bwrap: setting up uid map: Permission denied). Allow unprivileged user namespaces"
        )
    calls = log.read_text().splitlines()
    assert calls[0] == "--help" and calls[1].endswith("--tmpfs /tmp -- /bin/true") and len(calls) == 2
    assert "--ro-bind /proc/sys /proc/sys" in calls[1]
    monkeypatch.setattr(sandbox_module, "RECHECK_AFTER", 0.0)
    ran(ctx, "touch ran")
    assert len(log.read_text().splitlines()) == 4
    monkeypatch.setattr(sandbox_module, "RECHECK_AFTER", 3600.0)
    ran(ctx, "touch ran")
    assert len(log.read_text().splitlines()) == 4
    os.utime(fake, ns=(time.time_ns(), time.time_ns() + 10**9))
    ran(ctx, "touch ran")
    assert len(log.read_text().splitlines()) == 6
    assert "touch ran" not in log.read_text()
    assert not (ws / "ran").exists()


def test_without_a_pids_cgroup_the_limit_is_the_command_users_rlimit(make_ctx: Callable[..., ToolContext]) -> None:
    """As root too: commands run as the sandbox user, whom RLIMIT_NPROC holds (it never held root). The limit
    counts every process of that user, so as root the commands here run as a uid no other test process uses."""
    limit = 32
    mark = marker()
    alone = f"{50_000 + os.getpid() % 10_000}" if os.geteuid() == 0 else ""
    sandbox = Sandbox(max_processes=limit, cgroup_root="/nonexistent-cgroups")
    ctx = make_ctx(sandbox=dataclasses.replace(sandbox, user=alone) if alone else sandbox)
    output, peak, could_start = watch_while(mark, lambda: ran(ctx, f"bash -c '{BOMB}; sleep 1000 # {mark}'", timeout=3))
    assert output.endswith("[timed out after 3 s]")
    assert "fork: retry: Resource temporarily unavailable" in output
    assert limit // 2 <= peak <= limit + limit // 4
    assert could_start
    assert gone(mark)


def test_who_commands_run_as_when_cachet_is_root(
    ws: Path, tmp_path: Path, make_ctx: Callable[..., ToolContext]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root changes user for its commands")
    missing = make_ctx(sandbox=Sandbox(user="cachet-no-such-user"))
    assert ran(missing, "touch ran") == (
        "error: Commands cannot run here: Cachet runs as root, and commands run as the user cachet-no-such-user "
        "(CACHET_SANDBOX_USER), who does not exist. Create it (useradd --system --user-group --no-create-home "
        "--shell /usr/sbin/nologin cachet-no-such-user), or set CACHET_SANDBOX_USER to another unprivileged user."
    )
    for root_user in ("root", "0", "1000:0"):
        assert ran(make_ctx(sandbox=Sandbox(user=root_user)), "touch ran") == (
            "error: Commands cannot run here: Cachet runs as root, and commands never do; CACHET_SANDBOX_USER "
            f"names {root_user}, whose uid or gid is 0. Name an unprivileged user."
        )
    assert ran(make_ctx(sandbox=Sandbox(user="65534:65534")), "id -u; id -g") == "65534\n65534\n"
    closed = tmp_path / "closed"
    inner = closed / "ws"
    inner.mkdir(parents=True)
    for_commands(inner)
    closed.chmod(0o700)
    assert ran(make_ctx(root=inner), "touch ran") == (
        f"error: Commands cannot run in this workspace: they run as the user cachet-sandbox, who may not enter "
        f"{closed}. Let that user in (chmod o+x {closed}), or move the workspace."
    )
    assert not (ws / "ran").exists() and not (inner / "ran").exists()


def root_repository(folder: Path) -> Path:
    """A git repository made by root as an admin would check one out: files 0644, folders 0755, all root's; the
    folders on the way opened, the repository itself not given to anyone."""
    folder.mkdir()
    (folder / "src").mkdir()
    (folder / "README.md").write_text("read me\n")
    (folder / "src" / "app.py").write_text("print('app')\n")
    git = ["git", "-c", "user.name=Admin", "-c", "user.email=admin@example.com", "-C", str(folder)]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "first"]):
        subprocess.run([*git, *step], check=True, capture_output=True)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return open_the_way(folder)


def needs_root() -> tuple[int, int]:
    ids = sandbox_ids()
    if ids is None:
        pytest.skip("commands run as Cachet's own user, who owns what it made")
    return ids


def test_commands_change_a_repository_root_owns(tmp_path: Path, make_ctx: Callable[..., ToolContext]) -> None:
    uid, _ = needs_root()
    repo = root_repository(tmp_path / "repo")
    ctx = make_ctx(root=repo)
    output = ran(ctx, "echo made > made.txt && echo more >> README.md && git status --short && git diff --stat")
    assert output == " M README.md\n?? made.txt\n README.md | 1 +\n 1 file changed, 1 insertion(+)\n"
    assert all(path.stat().st_uid == 0 for path in [repo, repo / "README.md", repo / "src", repo / ".git" / "HEAD"])
    assert (acl.USER, 6, uid) in (acl.read(str(repo / "README.md")) or [])
    assert (acl.USER, 7, uid) in (acl.read(str(repo), acl.DEFAULT) or [])
    assert (repo / "made.txt").stat().st_uid == uid
    edited = call_tool("edit", '{"path": "README.md", "old_string": "read me", "new_string": "READ ME"}', ctx)[1]
    written = call_tool("write", '{"path": "src/fresh.py", "content": "fresh\\n"}', ctx)[1]
    assert not isinstance(edited, ErrorOutcome) and not isinstance(written, ErrorOutcome)
    assert (repo / "README.md").stat().st_uid == 0 and (repo / "src" / "fresh.py").stat().st_uid == 0
    assert ran(ctx, "echo again >> README.md && echo later >> src/fresh.py && git status --short") == (
        " M README.md\n?? made.txt\n?? src/fresh.py\n"
    )
    assert (repo / "README.md").read_text() == "READ ME\nmore\nagain\n"
    assert (repo / "src" / "fresh.py").read_text() == "fresh\nlater\n"


def test_a_repository_behind_a_closed_folder_is_refused_and_left_alone(
    tmp_path: Path, make_ctx: Callable[..., ToolContext]
) -> None:
    needs_root()
    closed = tmp_path / "closed"
    closed.mkdir()
    repo = root_repository(closed / "repo")
    closed.chmod(0o700)
    assert ran(make_ctx(root=repo), "touch ran") == (
        f"error: Commands cannot run in this workspace: they run as the user cachet-sandbox, who may not enter "
        f"{closed}. Let that user in (chmod o+x {closed}), or move the workspace."
    )
    assert acl.read(str(repo)) is None and acl.read(str(closed)) is None
    assert not (repo / "ran").exists()


def test_links_in_a_repository_root_owns_are_not_followed(tmp_path: Path, make_ctx: Callable[..., ToolContext]) -> None:
    needs_root()
    outside = open_the_way(tmp_path / "outside")
    outside.mkdir()
    (outside / "target.txt").write_text("outside\n")
    repo = root_repository(tmp_path / "repo")
    (repo / "link.txt").symlink_to(outside / "target.txt")
    (repo / "folder").symlink_to(outside)
    assert ran(make_ctx(root=repo), "echo in > inside.txt") == ""
    assert acl.read(str(outside / "target.txt")) is None and acl.read(str(outside)) is None
    assert acl.read(str(outside), acl.DEFAULT) is None
    assert (outside / "target.txt").read_text() == "outside\n"
    assert (repo / "inside.txt").read_text() == "in\n"


def test_cachets_hidden_folder_in_a_repository_root_owns_gets_no_acl(
    tmp_path: Path, make_ctx: Callable[..., ToolContext]
) -> None:
    uid, _ = needs_root()
    repo = root_repository(tmp_path / "repo")
    (repo / "data" / "pg").mkdir(parents=True)
    (repo / "data" / "secret_key").write_text("key\n")
    ctx = make_ctx(root=repo, sandbox=Sandbox(hidden=(str(repo / "data"),)))
    assert ran(ctx, "touch made && ls data") == ""
    assert (acl.USER, 7, uid) in (acl.read(str(repo)) or [])
    for path in (repo / "data", repo / "data" / "pg", repo / "data" / "secret_key"):
        assert acl.read(str(path)) is None and acl.read(str(path), acl.DEFAULT) is None


def test_without_acls_commands_say_what_to_run(
    tmp_path: Path, make_ctx: Callable[..., ToolContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_root()
    repo = root_repository(tmp_path / "repo")
    real_getxattr = os.getxattr

    def unsupported(target: object, name: str, *args: object, **kwargs: object) -> bytes:
        if name.startswith("system.posix_acl"):
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        return real_getxattr(target, name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "getxattr", unsupported)
    monkeypatch.setattr(os, "setxattr", unsupported)
    assert ran(make_ctx(root=repo), "touch ran") == (
        f"error: Commands cannot run in this workspace: they run as the user cachet-sandbox, who may not write "
        f"{repo}, and its file system keeps no ACLs to give that user access with. Give it the folder (chown -R "
        f"cachet-sandbox: {repo}), or remount the file system with ACLs (mount -o remount,acl) and try again."
    )
    assert not (repo / "ran").exists()


def test_the_call_cgroups_are_removed(ctx: ToolContext) -> None:
    bases = sandbox_module.cgroup_bases(ctx.sandbox.cgroup_root)
    if not bases:
        pytest.skip("no writable cgroup here: RLIMIT_NPROC is the limit")
    prefix = f"cachet-run-{os.getpid()}-"
    ran(ctx, "sleep 0.1 & true")
    for base in bases:
        assert [name for name in os.listdir(base.path) if name.startswith(prefix)] == []


def test_where_call_cgroups_are_made(tmp_path: Path) -> None:
    """Cgroup file systems laid out as the kernel shows them: v1 per controller, v2 delegated by systemd."""
    v1 = tmp_path / "v1"
    for controller, folder in (("pids", "srv"), ("memory", "a/b")):
        (v1 / controller / folder).mkdir(parents=True)
        (v1 / controller / "cgroup.procs").touch()
    mounts = {"pids": "/srv", "memory": "/a/b", "": "/"}
    assert sandbox_module.find_bases(str(v1), mounts) == [
        sandbox_module.CgroupBase(f"{v1}/pids/srv", 1, frozenset({"pids"})),
        sandbox_module.CgroupBase(f"{v1}/memory/a/b", 1, frozenset({"memory"})),
    ]
    v2 = tmp_path / "v2"
    service = v2 / "system.slice" / "cachet.service"
    (service / "supervisor").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu io memory pids\n")
    (service / "supervisor" / "cgroup.subtree_control").write_text("\n")
    (service / "cgroup.subtree_control").write_text("memory pids\n")
    own = {"": "/system.slice/cachet.service/supervisor"}
    assert sandbox_module.find_bases(str(v2), own) == [
        sandbox_module.CgroupBase(str(service), 2, frozenset({"pids", "memory"}))
    ]
    (service / "cgroup.subtree_control").write_text("pids\n")
    assert sandbox_module.find_bases(str(v2), own) == [sandbox_module.CgroupBase(str(service), 2, frozenset({"pids"}))]
    (service / "cgroup.subtree_control").write_text("memory\n")
    assert sandbox_module.find_bases(str(v2), own) == []
    hybrid = tmp_path / "hybrid"
    (hybrid / "pids").mkdir(parents=True)
    (hybrid / "pids" / "cgroup.procs").touch()
    (hybrid / "unified").mkdir()
    (hybrid / "unified" / "cgroup.controllers").write_text("\n")
    (hybrid / "unified" / "cgroup.subtree_control").write_text("\n")
    assert sandbox_module.find_bases(str(hybrid), {"pids": "/", "memory": "/", "": "/"}) == [
        sandbox_module.CgroupBase(f"{hybrid}/pids", 1, frozenset({"pids"}))
    ]
    assert sandbox_module.find_bases(str(tmp_path / "none"), mounts) == []


def test_argument_errors(ctx: ToolContext) -> None:
    with pytest.raises(ToolError) as caught:
        run({"command": "true", "timeout": 0}, ctx)
    assert caught.value.message == "timeout must be a whole number of at least 1, not 0."
    with pytest.raises(ToolError) as caught:
        run({}, ctx)
    assert caught.value.message == "The call to run lacks the argument command."


def test_a_command_that_cannot_start(tmp_path: Path, make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(root=tmp_path / "gone")
    with pytest.raises(ToolError) as caught:
        run({"command": "true"}, ctx)
    assert caught.value.message == "The command could not be started: No such file or directory"


def test_output_comes_through_a_pipe_and_nothing_is_spooled_on_the_host(ctx: ToolContext) -> None:
    output = text(run({"command": "head -c 5000 /dev/zero | tr '\\0' a; stat -L -c '%F' /proc/self/fd/1"}, ctx))
    assert output == "a" * 5000 + "fifo\n"


def test_output_past_the_limit_keeps_its_first_and_last_halves(make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(sandbox=Sandbox(output_max_bytes=2000))
    output = text(run({"command": "seq 1 10000; exit 3"}, ctx))
    head, cut, tail = output.split("\n[", 1)[0], "[" + output.split("\n[", 1)[1].split("\n", 1)[0], ""
    tail = output.split(cut + "\n", 1)[1]
    numbers = "".join(f"{n}\n" for n in range(1, 10001))
    assert numbers.startswith(head + "\n") and len(head) <= 1000
    assert tail.endswith("\n[exit 3]") and numbers.endswith(tail[: -len("[exit 3]")])
    kept = len(head) + 1 + len(tail) - len("[exit 3]")
    assert cut == (
        f"[{quota_module.size_text(len(numbers) - kept)} of output cut here: the command wrote "
        f"{quota_module.size_text(len(numbers))}; run keeps the first and the last 1000 bytes]"
    )
    assert text(run({"command": "seq 1 300"}, ctx)) == "".join(f"{n}\n" for n in range(1, 301))


def test_a_hundred_megabytes_of_output_take_no_more_memory_than_the_limit(ctx: ToolContext) -> None:
    command = "head -c 100000000 /dev/zero | tr '\\0' a; exit 4"
    tracemalloc.start()
    try:
        output = text(run_module_function({"command": command}, ctx))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    limit = ctx.sandbox.output_max_bytes
    assert limit == 10_000_000
    assert peak < 5 * limit
    assert output.startswith("a" * (limit // 2)) and output.endswith("a" * (limit // 2) + "\n[exit 4]")
    assert "[85.8 MB of output cut here: the command wrote 95.4 MB; run keeps the first and the last 4.8 MB]" in output
    assert len(output) < limit + 200


def test_a_file_past_the_size_limit_cannot_be_written(ws: Path, make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(sandbox=Sandbox(file_max_bytes=1 << 20))
    output = ran(ctx, "head -c 2000000 /dev/zero > big; echo status $?; stat -c %s big; head -c 1000 /dev/zero > small")
    assert output == "head: error writing 'standard output': File too large\nstatus 1\n1048576\n"
    assert (ws / "big").stat().st_size == 1 << 20 and (ws / "small").stat().st_size == 1000


def test_stop_ends_a_running_command_and_everything_it_started(ws: Path, make_ctx: Callable[..., ToolContext]) -> None:
    mark = marker()
    ctx = make_ctx(cancelled=(ws / "started").exists)
    output = ran(ctx, f"echo started; sleep 1000.{mark} & touch started; sleep 1000.{mark}")
    assert re.fullmatch(r"started\n\[stopped after \d+ s\]", output), output
    assert gone(mark)


def test_a_command_given_an_input_pipe_reads_what_follows_the_gate_and_folders_bound_read_only(
    ws: Path, ctx: ToolContext, tmp_path: Path
) -> None:
    """How an MCP server's command runs: its input a pipe the caller writes after the gate line the sandbox writes
    there first, and folders staff named bound read-only at their own paths (readable, never writable)."""
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "tool.txt").write_text("installed\n")
    shared = for_commands(tmp_path / "shared")  # the sandbox user's own: only the binding keeps it from writing
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    command = (
        f'read -r line; echo "got $line"; cat {shared}/tool.txt; (echo x > {shared}/new) 2>/dev/null || echo refused'
    )
    with (
        RUN_MODULE.command_workspace(ctx) as (workspace, _),
        sandbox_module.sandboxed(
            command, workspace, out_write, ctx, input_pipe=(in_read, in_write), read_only=(str(shared),)
        ) as running,
    ):
        os.close(out_write)
        os.close(in_read)
        os.write(in_write, b"hello\n")
        os.close(in_write)
        running.process.wait(20)
    output = os.read(out_read, 65536).decode()
    os.close(out_read)
    assert output == "got hello\ninstalled\nrefused\n"
    assert not (shared / "new").exists()
