"""What a tool call may use: the workspace, the rules' texts, the mode and the session's memory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sessions_app.hygiene.config import ContextConfig


@dataclass(frozen=True)
class ToolContext:
    """The session's side of a tool call. ``root`` is the workspace folder, already resolved."""

    root: Path
    config: ContextConfig
    mode: str
    allow_commands: bool
    last_seen_sha: Callable[[str], str | None]
    recall: Callable[[int], str | None]
    run_timeout: int = 120
    run_max_timeout: int = 3600
    edit_max_bytes: int = 10_000_000
    spool_dir: Path | None = None
    cancelled: Callable[[], bool] = lambda: False
