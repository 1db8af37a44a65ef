"""``list``: the entries of one folder, one absolute path a line, folders ending in ``/``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sessions_app.hygiene.outcomes import ListingOutcome, Outcome

from .args import Args
from .context import ToolContext
from .errors import ToolError, shown
from .paths import link_target_inside, resolve_in_workspace, workspace_root
from .walk import entries, is_real_folder


def list_(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """The entries of a folder, sorted. A symlink is shown by its own path, as a folder only when it
    leads to a folder inside the workspace."""
    call = Args(args, "list", ctx.config)
    folder = require_folder(resolve_in_workspace(call.text("path", "."), ctx), ctx)
    root = workspace_root(ctx)
    lines = sorted(shown(entry.path) + ("/" if _shows_as_folder(entry, root) else "") for entry in entries(folder))
    return ListingOutcome("\n".join(lines) if lines else ctx.config.text("no_matches"))


def require_folder(path: Path, ctx: ToolContext) -> str:
    """``path`` as a string when it is a folder; else the error naming it."""
    if not os.path.lexists(path):
        raise ToolError(ctx.config.error("not_found", path=shown(path)))
    if not os.path.isdir(path):
        raise ToolError(ctx.config.error("not_folder", path=shown(path)))
    return str(path)


def _shows_as_folder(entry: os.DirEntry[str], root: str) -> bool:
    if entry.is_symlink():
        target = link_target_inside(entry.path, root)
        return target is not None and os.path.isdir(target)
    return is_real_folder(entry)
