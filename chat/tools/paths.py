"""Confinement: every path a tool uses is resolved, symlinks too, and must lie inside the workspace."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .context import ToolContext
from .errors import ToolError, shown


def workspace_root(ctx: ToolContext) -> str:
    """The workspace folder as a resolved absolute path."""
    return os.path.realpath(ctx.root)


def is_inside(path: str, root: str) -> bool:
    """Whether the resolved ``path`` is ``root`` or lies below it."""
    if path == root:
        return True
    prefix = root if root.endswith(os.sep) else root + os.sep
    return path.startswith(prefix)


def resolve_in_workspace(given: str, ctx: ToolContext) -> Path:
    """The resolved absolute path of ``given`` (relative to the workspace); refused outside it.

    Nothing is opened: only the path's components are looked up to follow symlinks. The result is a
    fixed point of ``realpath`` (a symlink loop is the one way it is not: ``realpath`` leaves the loop
    unresolved and folds a following ``..`` away lexically), so the kernel resolves it to itself.
    """
    config = ctx.config
    if not given or "\x00" in given or not _encodable(given):
        raise ToolError(config.error("bad_path", given=given))
    root = workspace_root(ctx)
    joined = os.path.join(root, given)
    resolved = os.path.realpath(joined)
    if os.path.realpath(resolved) != resolved or _is_loop(resolved):
        raise ToolError(config.error("symlink_loop", path=shown(joined)))
    if not is_inside(resolved, root):
        raise ToolError(config.error("outside", path=shown(resolved)))
    return Path(resolved)


def link_target_inside(path: str, root: str) -> str | None:
    """Where the symlink ``path`` leads when that is inside ``root`` and exists, else ``None``."""
    target = os.path.realpath(path)
    if not is_inside(target, root) or not os.path.exists(target):
        return None
    return target


def _encodable(given: str) -> bool:
    try:
        os.fsencode(given)
    except UnicodeEncodeError:
        return False
    return True


def _is_loop(resolved: str) -> bool:
    try:
        os.stat(resolved)
    except OSError as error:
        return error.errno == errno.ELOOP
    return False
