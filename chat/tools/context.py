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
    call (memory in bytes, processes and threads), and folders to cover with an empty one should they
    lie inside the workspace (Cachet's own data)."""

    bwrap: str = "/usr/bin/bwrap"
    cgroup_root: str = "/sys/fs/cgroup"
    memory_bytes: int = 2 * 1024**3
    max_processes: int = 256
    hidden: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolContext:
    """The session's side of a tool call. ``root`` is the workspace folder, already resolved; ``tools`` the
    names of the tools the session lists (fixed when it started); ``allow_commands`` whether the workspace
    allows commands now. A tool that can run long (``grep``) polls ``cancelled`` and ends when it turns
    true (Stop)."""

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
    spool_dir: Path | None = None
    grep_timeout: float = 60.0
    grep_max_bytes: int = 10_000_000
    cancelled: Callable[[], bool] = never_cancelled
    allow_network: bool = False
    sandbox: Sandbox = field(default_factory=Sandbox)
