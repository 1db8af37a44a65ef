"""Where a workspace folder may lie: the one rule that the admin, the environment's seeding, ``ask`` and every
action of a session apply. Pure but for reading the settings and resolving paths (symlinks included).

A folder is refused when it is ``/``, a system folder or inside one, Cachet's own code, data, prompts or
Python (inside them, or holding them), or a folder that holds everyone's (``/home``, ``/tmp``…) itself; and,
unless ``anywhere`` (``ask --workspace``, run by someone with a shell on the server), when it lies outside
``CACHET_WORKSPACE_ROOTS``. The data folder's ``workspaces`` folder stays allowed: it is the default root. The
private workspaces live in the data folder's ``people`` (``CACHET_PEOPLE``), where no other workspace may be.
No workspace's folder is another's, lies inside one or holds one (:func:`nesting_refusal`, given the others).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

# Never a workspace, neither inside one nor holding one (their resolved forms too: /lib may be /usr/lib).
SYSTEM_FOLDERS = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/lost+found",
    "/proc",
    "/run",
    "/sbin",
    "/snap",
    "/sys",
    "/usr",
    "/var/backups",
    "/var/cache",
    "/var/db",
    "/var/empty",
    "/var/lib",
    "/var/local",
    "/var/lock",
    "/var/log",
    "/var/mail",
    "/var/opt",
    "/var/run",
    "/var/spool",
)
# Folders that hold everyone's or the system's: a workspace may lie inside them, never be one of them.
SHARED_FOLDERS = ("/", "/home", "/root", "/var", "/tmp", "/var/tmp", "/mnt", "/media", "/opt", "/srv")
DATA_WORKSPACES = "workspaces"  # the folder of Cachet's data folder that workspaces may use: the default root


@dataclass(frozen=True)
class FolderCheck:
    """A workspace folder as given, resolved (symlinks followed), and why it is refused (empty: allowed)."""

    given: str
    folder: Path
    refusal: str = ""

    @property
    def allowed(self) -> bool:
        return not self.refusal


def _resolved(path: Path | str) -> Path:
    return Path(os.path.realpath(os.path.expanduser(path)))


@functools.cache
def _system_folders() -> tuple[Path, ...]:
    found: dict[Path, None] = {}
    for name in SYSTEM_FOLDERS:
        found[Path(name)] = None
        found[_resolved(name)] = None
    return tuple(found)


def _shared_folders() -> set[Path]:
    shared = {Path(name) for name in SHARED_FOLDERS} | {_resolved(name) for name in SHARED_FOLDERS}
    with contextlib.suppress(RuntimeError):  # no home known
        shared.add(_resolved(Path.home()))  # the home of the account Cachet runs as
    return shared


def _own_folders() -> list[tuple[Path, str]]:
    """Cachet's own folders, each with what it is."""
    own: list[tuple[Path | str, str]] = [
        (settings.BASE_DIR, "Cachet's code"),
        (settings.CACHET_PROMPTS, "Cachet's prompts"),
        (settings.CACHET_DATA, "Cachet's data"),
        (settings.CACHET_PEOPLE, "the private workspaces' folder"),
        (settings.STATIC_ROOT, "Cachet's static files"),
        (sys.prefix, "Cachet's virtual environment"),
        (sys.base_prefix, "the Python Cachet runs on"),
    ]
    host = settings.DATABASES.get("default", {}).get("HOST")
    if isinstance(host, str) and host.startswith("/"):
        own.append((host, "the database's socket folder"))
    return [(_resolved(path), label) for path, label in own if path]


def workspace_roots() -> list[Path]:
    """``CACHET_WORKSPACE_ROOTS``, resolved."""
    return [_resolved(root) for root in settings.CACHET_WORKSPACE_ROOTS]


def people_folder() -> Path:
    """The folder of the private workspaces (``CACHET_PEOPLE``: the data folder's ``people``), where no other
    workspace may be."""
    return _resolved(settings.CACHET_PEOPLE)


def private_folder(user_id: int) -> Path:
    """Where the private workspace of person ``user_id`` lives, and nowhere else."""
    return people_folder() / str(user_id)


def nesting_refusal(folder: Path, others: Iterable[tuple[str, str]]) -> str:
    """Why ``folder`` may not be a workspace's, given the other workspaces as ``(name, folder)``: it is one of
    theirs, lies inside one or holds one; empty where none."""
    for name, other in others:
        theirs = Path(other)
        if folder == theirs:
            return f"{folder} is already the folder of the workspace {name!r}"
        if folder.is_relative_to(theirs):
            return f"{folder} lies inside the folder of the workspace {name!r} ({theirs}); workspaces never nest"
        if theirs.is_relative_to(folder):
            return f"{folder} holds the folder of the workspace {name!r} ({theirs}); workspaces never nest"
    return ""


def _refusal(folder: Path, *, anywhere: bool) -> str:
    if folder == Path("/"):
        return "/ is the root of the file system"
    if folder in _shared_folders():
        return f"{folder} holds other people's or the system's folders: a workspace may lie inside it, not be it"
    for system in _system_folders():
        if folder == system:
            return f"{folder} is a system folder"
        if folder.is_relative_to(system):
            return f"{folder} lies inside the system folder {system}"
        if system.is_relative_to(folder):
            return f"{folder} holds the system folder {system}"
    data_workspaces = _resolved(settings.CACHET_DATA) / DATA_WORKSPACES
    in_data_workspaces = folder.is_relative_to(data_workspaces)
    own_folders = sorted(_own_folders(), key=lambda item: len(item[0].parts))
    for own, label in reversed(own_folders):  # the innermost first: the data folder before the code around it
        if folder.is_relative_to(own) and not (in_data_workspaces and data_workspaces.is_relative_to(own)):
            return f"{folder} is {label}" if folder == own else f"{folder} lies inside {label} ({own})"
    for own, label in own_folders:  # the outermost first: the code before the data folder in it
        if own.is_relative_to(folder):
            return f"{folder} holds {label} ({own})"
    if anywhere:
        return ""
    roots = workspace_roots()
    if not any(folder.is_relative_to(root) for root in roots):
        listed = ", ".join(str(root) for root in roots) or "none are set"
        return f"{folder} is not under the workspace roots ({listed}); CACHET_WORKSPACE_ROOTS sets them"
    return ""


def folder_check(folder: str | Path, *, anywhere: bool = False) -> FolderCheck:
    """Whether ``folder`` may be a workspace's (see the module); ``anywhere`` lifts only the roots' rule."""
    given = str(folder)
    if not given.strip() or not Path(given).is_absolute():
        return FolderCheck(given, Path(given), f"{given!r} is not an absolute path")
    try:
        resolved = _resolved(given)
    except (OSError, RuntimeError) as error:  # a loop of symlinks
        return FolderCheck(given, Path(given), f"{given} cannot be resolved ({error})")
    refusal = _refusal(resolved, anywhere=anywhere)
    if refusal and str(resolved) != os.path.normpath(given):
        refusal = f"{given} leads to {resolved}: {refusal}"
    return FolderCheck(given, resolved, refusal)
