"""What a tool call may use: the workspace, the rules' texts, the mode and the session's memory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sessions_app.hygiene.config import ContextConfig


def never_cancelled() -> bool:
    """The cancel signal of a call that nothing can stop."""
    return False


@dataclass(frozen=True)
class Sandbox:
    """How ``run`` confines a command: the bubblewrap binary, the cgroup file system, the limits of one
    call (memory in bytes, processes and threads, the size of any one file it writes, the output kept),
    folders to cover with an empty one should they lie inside the workspace (Cachet's own data), and the
    user commands run as when Cachet runs as root (never root itself)."""

    bwrap: str = "/usr/bin/bwrap"
    cgroup_root: str = "/sys/fs/cgroup"
    memory_bytes: int = 2 * 1024**3
    max_processes: int = 256
    file_max_bytes: int = 1024**3
    output_max_bytes: int = 10_000_000
    hidden: tuple[str, ...] = ()
    user: str = "cachet-sandbox"


@dataclass(frozen=True)
class Documents:
    """How documents are converted: where their text is kept (``None``: not kept), and the limits of one
    conversion (the file's bytes, the pages, slides, sheets or chapters, the text's characters, the converting
    process's memory and its time)."""

    cache: Path | None = None
    max_bytes: int = 50_000_000
    max_pages: int = 2000
    max_chars: int = 5_000_000
    memory_bytes: int = 1024**3
    timeout: float = 60.0


@dataclass(frozen=True)
class ToolContext:
    """The session's side of a tool call. ``root`` is the workspace folder, already resolved; ``tools`` the
    names of the tools the session lists (fixed when it started); ``allow_commands`` whether the workspace
    allows commands now; ``disk_quota`` the bytes the workspace may hold (``None``: no quota); ``roots`` the
    folders the workspace must still lie under when a call opens it (``None``: anywhere, for a folder named from a
    shell); ``documents`` how documents are converted to be read. A tool that can run long (``grep``, ``run``, a
    document's conversion) polls ``cancelled`` and ends when it turns true (Stop)."""

    root: Path
    config: ContextConfig
    mode: str
    tools: tuple[str, ...]
    allow_commands: bool
    last_seen_sha: Callable[[str], str | None]
    recall: Callable[[int], str | None]
    run_timeout: int = 120
    run_max_timeout: int = 3600
    edit_max_bytes: int = 10_000_000
    grep_timeout: float = 60.0
    grep_max_bytes: int = 10_000_000
    cancelled: Callable[[], bool] = never_cancelled
    allow_network: bool = False
    sandbox: Sandbox = field(default_factory=Sandbox)
    disk_quota: int | None = None
    roots: tuple[str, ...] | None = None
    documents: Documents = field(default_factory=Documents)
