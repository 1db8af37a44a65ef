"""``run``'s sandbox: bubblewrap decides what a command can see, a cgroup (or rlimits) what it can use.

Who a command is. Never root: where Cachet runs as an unprivileged user, commands run as that user; where it
runs as root, they run as ``Sandbox.user`` (``CACHET_SANDBOX_USER``, by default ``cachet-sandbox``), whom the
call's first process becomes with util-linux's ``setpriv`` (no supplementary groups) once its limits are set,
just before bubblewrap. That user must exist, must not be uid or gid 0, and must be able to enter every
folder on the way to the workspace; otherwise ``run`` refuses and says why. A workspace folder it may not
write is first opened to it with POSIX ACLs, ownership unchanged (``open_to_commands``). As root
in the kernel's eyes, a process writes host-wide kernel settings through ``/proc/sys`` whatever capabilities
it has; as anyone else it cannot.

What a command sees. ``bwrap`` makes a new root that holds only: the workspace, read-write, at its own
resolved path (also the current folder and ``HOME``); ``/usr``, the ``/bin``, ``/sbin`` and ``/lib*``
folders or links, ``/etc/alternatives``, ``/etc/ld.so.*``, ``/etc/nsswitch.conf`` and ``/etc/localtime``,
read-only; a generated ``/etc/passwd`` and ``/etc/group`` naming only the command's user and group, and
an ``/etc/hosts`` naming only localhost; a fresh ``/tmp`` (a tmpfs), ``/proc`` with ``/proc/sys`` read-only,
and ``/dev``; no ``/sys``. It runs in new user, pid, ipc, uts, cgroup and network namespaces, with every
capability dropped and no further user namespaces, ``--die-with-parent`` and ``--new-session``, in an
environment of exactly PATH, HOME, LANG and TERM. Where the workspace allows the network, the server's
network namespace is shared and ``/etc/resolv.conf``, the real ``/etc/hosts``, ``/etc/gai.conf`` and the CA
certificates are bound too. A hidden folder (Cachet's data) that lies inside the workspace is covered by an
empty tmpfs, and what git on the host would run of the workspace's repository is read-only
(``repository``).

What a command can use. Time: the call's timeout (``run`` enforces it); when it passes, the sandbox's
first process is killed, and the pid namespace ends with everything in it. Everything a command leaves
running ends the same way when its shell exits. Processes and memory: a cgroup made for the call and
removed after it, holding ``pids.max`` = ``max_processes`` (processes and threads) and a memory limit of
``memory_bytes`` (swap included; the ``/tmp`` tmpfs counts too), made where the server may write: cgroup
v1 at the server's own path under ``<cgroup_root>/pids`` and ``<cgroup_root>/memory``, or cgroup v2 in
the server's own cgroup or its parent where that delegates the controller. Where there is no such pids
cgroup the limit is RLIMIT_NPROC, which the kernel counts over every process and thread of the command's
user, so it is set ``max_processes`` above what that user runs when the call starts. Where there is no
memory cgroup the limit is RLIMIT_DATA, per process. A file it writes: RLIMIT_FSIZE of ``file_max_bytes``,
with SIGXFSZ ignored, so a write past it fails with "File too large" rather than killing the writer. Core
dumps are off (RLIMIT_CORE 0).

How the limits are put in place without ``preexec_fn`` (not safe in a threaded server): the child is
``/bin/sh -c 'trap "" XFSZ; read -r go && exec "$@"' cachet-run bwrap …``, blocked on its standard input.
The server writes its pid into the call's cgroups and sets its rlimits with ``prlimit(2)`` (a process of the
server's own user: lowering another user's limits would need ``CAP_SYS_RESOURCE``, which containers drop),
then sends the line that lets it ``exec`` bubblewrap (through ``setpriv`` where it changes user); every
process of the sandbox inherits both.

Whether bubblewrap can make a sandbox here is tried once per process, binary (its inode and mtime) and
user, with a trivial one; a failure is tried again after ``RECHECK_AFTER`` seconds. A command never runs
outside the sandbox: where none can be made, ``run`` answers why and how to fix it.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import itertools
import logging
import os
import pwd
import re
import resource
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache

from sessions_app.hygiene.config import ContextConfig

from . import acl
from .context import Sandbox, ToolContext
from .errors import ToolError, one_line
from .paths import is_inside
from .repository import (
    MAX_GUARDS,
    Guard,
    LinkedEntry,
    MissingNamed,
    TooManyRepositories,
    WorkspaceIsGitFolder,
    repository_guards,
)

logger = logging.getLogger(__name__)

RECHECK_AFTER = 30.0
CLEANUP_WITHIN = 5.0
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SETPRIV = "/usr/bin/setpriv"
LANG = "C.UTF-8"
TERM = "dumb"
GATE = 'trap "" XFSZ; read -r go && exec "$@"'
OPTIONAL_FLAGS = ("--disable-userns", "--size")
SYSTEM_FOLDERS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = (
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/nsswitch.conf",
    "/etc/localtime",
)
NETWORK_FILES = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/gai.conf",
    "/etc/host.conf",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates",
    "/etc/pki/tls/certs",
    "/etc/pki/ca-trust",
)
LOCAL_HOSTS = b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
_CALL_CGROUP = re.compile(r"cachet-run-(\d+)-\d+")
_KILL_POLL = 0.005
FILE_MAX_FLOOR = 64 * 1024  # what bubblewrap itself writes as it starts (the generated /etc files) must fit


@dataclass(frozen=True)
class Identity:
    """Who a command runs as: ``dropped`` where the server is root and commands run as another user."""

    uid: int
    gid: int
    user: str
    group: str
    dropped: bool


@dataclass(frozen=True)
class _Verdict:
    identity: tuple[int, int, int, int]
    problem: str | None
    flags: frozenset[str]
    checked_at: float


@dataclass(frozen=True)
class CgroupBase:
    """A cgroup folder the server may make a call's cgroups in, and which controllers they get there."""

    path: str
    version: int
    controllers: frozenset[str]


_lock = threading.Lock()
_verdicts: dict[tuple[str, int], _Verdict] = {}
_bases: dict[str, list[CgroupBase]] = {}
_call_numbers = itertools.count(1)


def command_identity(settings: Sandbox, config: ContextConfig) -> Identity:
    """Who commands run as: the server's own user, or where it is root ``settings.user``; ``ToolError`` where
    that would be root or the user does not exist."""
    if not kernel_root():
        user, group = _identity_names()
        return Identity(os.getuid(), os.getgid(), user, group, dropped=False)
    wanted = settings.user.strip()
    numeric = re.fullmatch(r"(\d+)(?::(\d+))?", wanted)
    try:
        if numeric is not None:
            uid = int(numeric.group(1))
            gid = int(numeric.group(2)) if numeric.group(2) else _primary_group(uid)
        else:
            entry = pwd.getpwnam(wanted)
            uid, gid = entry.pw_uid, entry.pw_gid
    except (KeyError, ValueError):
        raise ToolError(config.error("sandbox_no_user", user=wanted or '""')) from None
    if uid == 0 or gid == 0:
        raise ToolError(config.error("sandbox_root_user", user=wanted))
    return Identity(uid, gid, _user_name(uid, wanted), _group_name(gid), dropped=True)


def kernel_root() -> bool:
    """Whether this process is root as the kernel sees it: uid 0 in a user namespace that maps it to uid 0 of
    the one above (the host's own, or one a root made). Root of a namespace a user made is that user."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/uid_map", encoding="ascii") as handle:
            for line in handle:
                inside, outside, count = (int(field) for field in line.split())
                if inside <= 0 < inside + count:
                    return outside - inside == 0
    except (OSError, ValueError):
        pass
    return True


def _primary_group(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def _user_name(uid: int, fallback: str) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return fallback if not fallback[:1].isdigit() else "cachet-sandbox"


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return "cachet-sandbox"


def _become(identity: Identity) -> list[str]:
    """What to put before bubblewrap so that it runs as ``identity``: nothing where that is the server's own
    user, else util-linux's ``setpriv`` (it needs no capability the server may lack, unlike lowering the
    limits of another user's process)."""
    if not identity.dropped:
        return []
    return [SETPRIV, f"--reuid={identity.uid}", f"--regid={identity.gid}", "--clear-groups", "--"]


def give_to_commands(folder: str, settings: Sandbox, config: ContextConfig) -> Identity | None:
    """As root, give a folder Cachet made, with all it holds, to the user commands run as, so that they may
    change it; who that is, or ``None`` where Cachet is not root. ``ToolError`` where that user is unusable."""
    identity = command_identity(settings, config)
    if not identity.dropped:
        return None
    for path, folders, files in os.walk(folder):
        for name in [path, *(os.path.join(path, entry) for entry in (*folders, *files))]:
            os.chown(name, identity.uid, identity.gid, follow_symlinks=False)
    return identity


def closed_on_the_way(root: str, identity: Identity) -> str | None:
    """The first folder from ``/`` down to ``root`` that ``identity`` may not enter (by owner, group, ACL
    entries and mode), or ``None``."""
    if not identity.dropped:
        return None
    path = "/"
    for name in ["", *[part for part in root.split("/") if part]]:
        path = os.path.join(path, name) if name else path
        try:
            info = os.stat(path)
            entries = acl.access_of(path, info)
        except (OSError, ValueError):
            return path
        if not acl.permits(entries, info, identity.uid, identity.gid, acl.EXECUTE):
            return path
    return None


def open_to_commands(fd: int, folder: str, identity: Identity, settings: Sandbox, config: ContextConfig) -> bool:
    """As root, where the user commands run as may not write the workspace folder ``fd`` (at ``folder``), give
    it access to the folder and all it holds with POSIX ACLs, ownership unchanged (``acl.grant``; never to
    Cachet's hidden folders); whether it did. ``ToolError`` where the file system keeps no ACLs."""
    if not identity.dropped:
        return False
    try:
        if os.fstat(fd).st_uid == identity.uid or acl.may_write_folder(fd, identity.uid, identity.gid):
            return False
        skip = set()
        for hidden in settings.hidden:
            with contextlib.suppress(OSError):
                info = os.stat(hidden)
                skip.add((info.st_dev, info.st_ino))
        acl.grant(fd, identity.uid, skip=skip)
    except acl.NoAcls:
        raise ToolError(config.error("sandbox_no_acl", user=identity.user, folder=folder)) from None
    except OSError as error:
        if error.errno == errno.EROFS:
            return False
        raise ToolError(config.error("sandbox_failed", detail=f"{folder}: {error.strerror}")) from None
    return True


def usable_flags(settings: Sandbox, config: ContextConfig, identity: Identity | None = None) -> frozenset[str]:
    """The optional flags of a bubblewrap that can make a sandbox here for ``identity`` (by default who commands
    run as); ``ToolError`` where none can."""
    identity = identity or command_identity(settings, config)
    path = settings.bwrap
    try:
        info = os.stat(path)
    except OSError:
        info = None
    if info is None or not stat.S_ISREG(info.st_mode) or not os.access(path, os.X_OK):
        raise ToolError(config.error("sandbox_missing", path=path))
    binary = (info.st_dev, info.st_ino, info.st_mtime_ns, identity.uid)
    with _lock:
        verdict = _verdicts.get((path, identity.uid))
        stale = verdict is not None and verdict.problem is not None
        if (
            verdict is None
            or verdict.identity != binary
            or (stale and time.monotonic() - verdict.checked_at > RECHECK_AFTER)
        ):
            verdict = _probe(path, binary, identity)
            _verdicts[(path, identity.uid)] = verdict
    if verdict.problem is not None:
        raise ToolError(config.error("sandbox_unavailable", detail=verdict.problem))
    return verdict.flags


def _probe(path: str, binary: tuple[int, int, int, int], identity: Identity) -> _Verdict:
    flags: frozenset[str] = frozenset()
    try:
        shown_help = subprocess.run(
            [path, "--help"], stdin=subprocess.DEVNULL, capture_output=True, env=environment("/"), timeout=30
        )
        flags = frozenset(flag for flag in OPTIONAL_FLAGS if flag.encode() in shown_help.stdout)
        argv = [*_become(identity), path, *_namespaces(flags, network=False), *_system(), *_kernel_interface()]
        argv += ["--tmpfs", "/tmp", "--", "/bin/true"]
        tried = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, env=environment("/"), timeout=30, check=False, cwd="/"
        )
    except (OSError, subprocess.SubprocessError) as error:
        problem: str | None = one_line(str(error))
    else:
        said = tried.stderr.decode("utf-8", "replace").strip().splitlines()
        problem = None if tried.returncode == 0 else one_line(said[0] if said else f"exit {tried.returncode}")
    return _Verdict(binary, problem, flags, time.monotonic())


def environment(root: str) -> dict[str, str]:
    """The whole environment of a sandboxed command."""
    return {"PATH": PATH, "HOME": root, "LANG": LANG, "TERM": TERM}


def _namespaces(flags: frozenset[str], *, network: bool) -> list[str]:
    args = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not network:
        args.append("--unshare-net")
    if "--disable-userns" in flags:
        args.append("--disable-userns")
    return [*args, "--cap-drop", "ALL", "--die-with-parent", "--new-session"]


@cache
def _system() -> tuple[str, ...]:
    args = ["--ro-bind", "/usr", "/usr"]
    for folder in SYSTEM_FOLDERS:
        if os.path.islink(folder):
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    for path in SYSTEM_FILES:
        args += ["--ro-bind-try", path, path]
    return tuple(args)


def _kernel_interface() -> list[str]:
    """A fresh ``/proc`` whose kernel settings are read-only, and ``/dev``; no ``/sys``."""
    return ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"]


@cache
def _identity_names() -> tuple[str, str]:
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = "cachet"
    try:
        group = grp.getgrgid(os.getgid()).gr_name
    except KeyError:
        group = user
    return user, group


def _identity_files(root: str, identity: Identity) -> tuple[bytes, bytes]:
    user, uid, gid = identity.user, identity.uid, identity.gid
    passwd = f"{user}:x:{uid}:{gid}:{user}:{root}:/bin/sh\n"
    return os.fsencode(passwd), f"{identity.group}:x:{gid}:\n".encode()


def _data_pipe(data: bytes) -> int:
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)
    finally:
        os.close(write_end)
    return read_end


@dataclass(frozen=True)
class _Call:
    """What one call's bubblewrap is made of besides the command: who runs it, the optional flags, the
    descriptors it reads (the workspace's own, opened once for the call), and the repositories' entries to keep
    read-only or in place."""

    identity: Identity
    flags: frozenset[str]
    info_fd: int
    root_fd: int
    guards: tuple[Guard, ...]
    read_only: tuple[str, ...] = ()


def git_config(root: str) -> bytes:
    """The sandbox's ``/etc/gitconfig``: git in it trusts the workspace's own repository (for that path only),
    whoever owns the folder on the host."""
    escaped = root.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'[safe]\n\tdirectory = "{escaped}"\n'.encode()


def _bwrap_argv(command: str, root: str, ctx: ToolContext, call: _Call, data_fds: list[int]) -> list[str]:
    settings, flags = ctx.sandbox, call.flags
    passwd, group = _identity_files(root, call.identity)
    data_fds += [_data_pipe(passwd), _data_pipe(group), _data_pipe(git_config(root))]
    args = [*_become(call.identity), settings.bwrap, *_namespaces(flags, network=ctx.allow_network), *_system()]
    args += ["--ro-bind-data", str(data_fds[-3]), "/etc/passwd", "--ro-bind-data", str(data_fds[-2]), "/etc/group"]
    args += ["--ro-bind-data", str(data_fds[-1]), "/etc/gitconfig"]
    if ctx.allow_network:
        for path in NETWORK_FILES:
            args += ["--ro-bind-try", path, path]
    else:
        data_fds.append(_data_pipe(LOCAL_HOSTS))
        args += ["--ro-bind-data", str(data_fds[-1]), "/etc/hosts"]
    args += _kernel_interface()
    if "--size" in flags:
        args += ["--size", str(settings.memory_bytes)]
    args += ["--tmpfs", "/tmp", "--bind-fd", str(call.root_fd), root]
    for hidden in map(os.path.realpath, settings.hidden):
        if is_inside(hidden, root) and os.path.isdir(hidden):
            args += ["--tmpfs", hidden]
    for guard in call.guards:
        args += ["--ro-bind-fd" if guard.read_only else "--bind-fd", str(guard.fd), guard.path]
    for folder in call.read_only:
        args += ["--ro-bind", folder, folder]
    return [*args, "--chdir", root, "--info-fd", str(call.info_fd), "--", "/bin/sh", "-c", command]


class Sandboxed:
    """A command running in the sandbox: its bubblewrap process, and a way to end it with all it started."""

    def __init__(self, process: subprocess.Popen[bytes], info_fd: int) -> None:
        self.process = process
        self._info_fd = info_fd
        self._info = b""

    def child_pid(self) -> int | None:
        """The host pid of the sandbox's first process (pid 1 of its namespace), once bubblewrap said it."""
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self._info_fd, 4096):
                self._info += chunk
        found = re.search(rb'"child-pid"\s*:\s*(\d+)', self._info)
        return int(found.group(1)) if found else None

    def kill(self) -> None:
        """End the sandbox unless it ended: SIGKILL its first process, and the kernel kills the rest of its
        pid namespace before bubblewrap, its parent, can exit; SIGKILL bubblewrap too if it does not."""
        if self._exited():
            return
        child = self.child_pid()
        if child is not None and _parent_of(child) == self.process.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
            try:
                self.process.wait(CLEANUP_WITHIN)
                return
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def _exited(self) -> bool:
        if self.process.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True


@dataclass(frozen=True)
class Workspace:
    """The workspace as one call of ``run`` opened it: its descriptor and path, the ``.git`` entries and the other
    git folders found in it (relative to it), and the most any one file a command writes may hold (the space its
    quota leaves)."""

    fd: int
    path: str
    git_entries: tuple[str, ...] = ()
    file_max_bytes: int | None = None
    git_folders: tuple[str, ...] = ()


@contextlib.contextmanager
def sandboxed(
    command: str,
    workspace: Workspace,
    output_fd: int,
    ctx: ToolContext,
    *,
    input_pipe: tuple[int, int] | None = None,
    errors_fd: int | None = None,
    read_only: tuple[str, ...] = (),
) -> Iterator[Sandboxed]:
    """Start ``command`` in the sandbox with its limits, its output going to ``output_fd`` (its errors too, unless
    ``errors_fd``), and the folders ``read_only`` bound read-only at their own paths. It reads nothing, or, given
    ``input_pipe`` (its read and write ends), what the caller writes to that pipe after the line that lets it start,
    which is written there. On leaving, whatever is left of it is killed and the call's cgroups are removed."""
    config = ctx.config
    root = workspace.path
    identity = command_identity(ctx.sandbox, config)
    if closed_on_the_way(os.path.dirname(root), identity) is None:
        open_to_commands(workspace.fd, root, identity, ctx.sandbox, config)
    closed = closed_on_the_way(root, identity)
    if closed is not None:
        raise ToolError(config.error("sandbox_unreachable", user=identity.user, folder=closed))
    flags = usable_flags(ctx.sandbox, config, identity)
    with contextlib.ExitStack() as closing:
        try:
            guards = closing.enter_context(
                repository_guards(workspace.fd, root, workspace.git_entries, workspace.git_folders)
            )
        except LinkedEntry as linked:
            raise ToolError(config.error("sandbox_git_link", path=linked.path)) from None
        except WorkspaceIsGitFolder:
            raise ToolError(config.error("sandbox_git_root", folder=root)) from None
        except MissingNamed as missing:
            error = config.error("sandbox_git_missing", path=missing.path, config=missing.config, setting=missing.key)
            raise ToolError(error) from None
        except TooManyRepositories as many:
            raise ToolError(config.error("sandbox_git_many", count=str(many), limit=MAX_GUARDS)) from None
        file_max = ctx.sandbox.file_max_bytes
        if workspace.file_max_bytes is not None:
            file_max = min(file_max, max(FILE_MAX_FLOOR, workspace.file_max_bytes))
        limits = closing.enter_context(_CallLimits(ctx.sandbox, config, identity, file_max_bytes=file_max))
        data_fds: list[int] = []
        closing.callback(_close_all, data_fds)
        info_read, info_write = os.pipe()
        closing.callback(os.close, info_read)
        os.set_blocking(info_read, False)
        gate_read, gate_write = os.pipe() if input_pipe is None else (input_pipe[0], os.dup(input_pipe[1]))
        try:
            call = _Call(identity, flags, info_write, workspace.fd, tuple(guards.items), read_only)
            argv = _bwrap_argv(command, root, ctx, call, data_fds)
            process = subprocess.Popen(
                ["/bin/sh", "-c", GATE, "cachet-run", *argv],
                cwd="/",
                env=environment(root),
                stdin=gate_read,
                stdout=output_fd,
                stderr=subprocess.STDOUT if errors_fd is None else errors_fd,
                pass_fds=(info_write, workspace.fd, *data_fds, *(guard.fd for guard in guards.items)),
                start_new_session=True,
            )
        except OSError as error:
            os.close(gate_write)
            raise ToolError(config.error("command_failed", detail=error.strerror or str(error))) from None
        finally:
            if input_pipe is None:  # the caller's input pipe stays the caller's to close
                os.close(gate_read)
            os.close(info_write)
        running = Sandboxed(process, info_read)
        try:
            try:
                limits.confine(process.pid)
                with contextlib.suppress(BrokenPipeError):
                    os.write(gate_write, b"go\n")
            finally:
                os.close(gate_write)
            yield running
        finally:
            running.kill()
            process.wait()


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return int(handle.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


class _CallLimits:
    """The cgroups and rlimits of one call: made on entering, put on its first process by ``confine``,
    and on leaving emptied (SIGKILL) and removed."""

    def __init__(self, settings: Sandbox, config: ContextConfig, identity: Identity, *, file_max_bytes: int) -> None:
        self.settings = settings
        self.config = config
        self.identity = identity
        self.cgroups: list[str] = []
        self.rlimits: list[tuple[int, int]] = [
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_FSIZE, file_max_bytes),
        ]

    def __enter__(self) -> _CallLimits:
        settings, config = self.settings, self.config
        bases = cgroup_bases(settings.cgroup_root)
        limited = {controller for base in bases for controller in base.controllers}
        name = f"cachet-run-{os.getpid()}-{next(_call_numbers)}"
        try:
            for base in bases:
                path = os.path.join(base.path, name)
                os.mkdir(path)
                self.cgroups.append(path)
                _set_limits(path, base, settings)
        except OSError as error:
            self._remove()
            with _lock:
                _bases.pop(settings.cgroup_root, None)
            raise ToolError(config.error("sandbox_failed", detail=f"{error.filename}: {error.strerror}")) from None
        if "pids" not in limited:
            self.rlimits.append((resource.RLIMIT_NPROC, settings.max_processes + _tasks_of(self.identity.uid)))
        if "memory" not in limited:
            self.rlimits.append((resource.RLIMIT_DATA, settings.memory_bytes))
        return self

    def confine(self, pid: int) -> None:
        """Put the call's first process in its cgroups and give it its rlimits, before it runs anything."""
        try:
            for path in self.cgroups:
                _write(os.path.join(path, "cgroup.procs"), str(pid))
            for limit, value in self.rlimits:
                hard = resource.prlimit(pid, limit)[1]
                if hard != resource.RLIM_INFINITY:
                    value = min(value, hard)
                resource.prlimit(pid, limit, (value, value))
        except OSError as error:
            detail = f"{error.filename}: {error.strerror}" if error.filename else str(error.strerror or error)
            raise ToolError(self.config.error("sandbox_failed", detail=detail)) from None

    def __exit__(self, *exc: object) -> None:
        self._remove()

    def _remove(self) -> None:
        for path in self.cgroups:
            _remove_cgroup(path)
        self.cgroups.clear()


def _set_limits(path: str, base: CgroupBase, settings: Sandbox) -> None:
    memory = str(settings.memory_bytes)
    if "pids" in base.controllers:
        _write(os.path.join(path, "pids.max"), str(settings.max_processes))
    if "memory" in base.controllers and base.version == 1:
        _write(os.path.join(path, "memory.limit_in_bytes"), memory)
        with contextlib.suppress(OSError):
            _write(os.path.join(path, "memory.memsw.limit_in_bytes"), memory)
    elif "memory" in base.controllers:
        _write(os.path.join(path, "memory.max"), memory)
        with contextlib.suppress(OSError):
            _write(os.path.join(path, "memory.swap.max"), "0")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _remove_cgroup(path: str) -> None:
    """Kill what is left in a call's cgroup and remove it; a process being killed may take a moment."""
    with contextlib.suppress(OSError):
        _write(os.path.join(path, "cgroup.kill"), "1")
    deadline = time.monotonic() + CLEANUP_WITHIN
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() > deadline:
                logger.warning("could not remove the cgroup %s: %s", path, error.strerror)
                return
        for pid in _members(path):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(_KILL_POLL)


def _members(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs"), encoding="ascii") as handle:
            return [int(line) for line in handle if line.strip()]
    except OSError:
        return []


def cgroup_bases(cgroup_root: str) -> list[CgroupBase]:
    """Where this process may make a call's cgroups, and with which of ``pids`` and ``memory`` there;
    found once per process (again after a failure), leftovers of ended processes removed."""
    with _lock:
        found = _bases.get(cgroup_root)
        if found is None:
            found = find_bases(cgroup_root, _own_cgroups())
            for base in found:
                _remove_leftovers(base.path)
            _bases[cgroup_root] = found
    return found


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under ``""`` its v2 path."""
    own: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as handle:
            for line in handle:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for controller in controllers.split(",") if controllers else [""]:
                    own[controller] = path
    except OSError:
        pass
    return own


def find_bases(cgroup_root: str, own: Mapping[str, str]) -> list[CgroupBase]:
    """Where a process in the cgroups ``own`` (as ``/proc/self/cgroup`` names them, v2 under ``""``)
    may make a call's cgroups: per v1 controller its own cgroup, else its v2 cgroup or that one's parent
    where the folder delegates ``pids`` (and ``memory`` where it delegates that too)."""
    bases: list[CgroupBase] = []
    wanted = ["pids", "memory"]
    for controller in list(wanted):
        hierarchy = os.path.join(cgroup_root, controller)
        if controller in own and os.path.exists(os.path.join(hierarchy, "cgroup.procs")):
            path = os.path.normpath(hierarchy + own[controller])
            if os.access(path, os.W_OK):
                bases.append(CgroupBase(path, 1, frozenset({controller})))
                wanted.remove(controller)
    unified = next(
        (
            path
            for path in (cgroup_root, os.path.join(cgroup_root, "unified"))
            if os.path.exists(os.path.join(path, "cgroup.controllers"))
        ),
        None,
    )
    if not wanted or unified is None or "" not in own:
        return bases
    own_path = os.path.normpath(unified + own[""])
    for path in (own_path, os.path.dirname(own_path)):
        if not is_inside(path, unified) or not os.access(path, os.W_OK):
            continue
        try:
            with open(os.path.join(path, "cgroup.subtree_control"), encoding="ascii") as handle:
                delegated = set(handle.read().split())
        except OSError:
            continue
        if "pids" in wanted and "pids" in delegated:
            bases.append(CgroupBase(path, 2, frozenset(controller for controller in wanted if controller in delegated)))
            break
    return bases


def _remove_leftovers(base: str) -> None:
    """Remove empty call cgroups that processes which no longer run left behind (after a crash)."""
    with contextlib.suppress(OSError), os.scandir(base) as entries:
        for entry in entries:
            matched = _CALL_CGROUP.fullmatch(entry.name)
            if matched is None or int(matched.group(1)) == os.getpid() or _alive(int(matched.group(1))):
                continue
            with contextlib.suppress(OSError):
                os.rmdir(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tasks_of(uid: int) -> int:
    """How many processes and threads ``uid`` runs now: what RLIMIT_NPROC counts."""
    count = 0
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(os.path.join(entry.path, "task")))
            except OSError:
                continue
    return count
