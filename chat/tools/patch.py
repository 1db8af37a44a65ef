"""``apply_patch``: a Codex-format patch over one or more files, checked whole before anything is written.

``*** Move to:`` is supported: the file at its new path answers as created (so that an undo removes
it), followed by the deletion of its old path. The new path must not exist yet.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sessions_app.hygiene.outcomes import EditOutcome, FileChange, Outcome

from .args import Args
from .context import ToolContext
from .editing import create, delete, load_existing, update
from .errors import ToolError, shown
from .files import clean
from .patch_format import FileOp, apply_hunks, parse_patch
from .paths import resolve_in_workspace
from .writes import PendingWrite, check_parent, commit


def apply_patch(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """Add, update, move and delete files as the patch says, all or none."""
    config = ctx.config
    patch = clean(Args(args, "apply_patch", config).text("patch"))
    touched: set[Path] = set()
    changes: list[FileChange] = []
    writes: list[PendingWrite] = []
    for op in parse_patch(patch, config):
        path = _claim(op.path, touched, ctx)
        for change, pending in _plan(op, path, touched, ctx):
            changes.append(change)
            writes.append(pending)
    commit(writes)
    return EditOutcome(tuple(changes), several=len(changes) > 1)


def _plan(op: FileOp, path: Path, touched: set[Path], ctx: ToolContext) -> list[tuple[FileChange, PendingWrite]]:
    config = ctx.config
    if op.action == "add":
        _require_absent(path, ctx)
        check_parent(path, ctx)
        return [create(op.path, path, op.content, ctx)]
    current = load_existing(path, ctx)
    if op.action == "delete":
        return [delete(op.path, current)]
    if not op.hunks and op.move_to is None:
        detail = config.error("patch_no_hunks", path=shown(path))
        raise ToolError(config.error("patch_invalid", detail=detail))
    text = apply_hunks(current.text, op.hunks, str(path), config)
    if op.move_to is None or resolve_in_workspace(op.move_to, ctx) == path:
        return [update(op.path, current, text, ctx)]
    target = _claim(op.move_to, touched, ctx)
    _require_absent(target, ctx)
    check_parent(target, ctx)
    return [create(op.move_to, target, text, ctx), delete(op.path, current)]


def _claim(given: str, touched: set[Path], ctx: ToolContext) -> Path:
    path = resolve_in_workspace(given, ctx)
    if path in touched:
        detail = ctx.config.error("patch_twice", path=shown(path))
        raise ToolError(ctx.config.error("patch_invalid", detail=detail))
    touched.add(path)
    return path


def _require_absent(path: Path, ctx: ToolContext) -> None:
    if os.path.lexists(path):
        raise ToolError(ctx.config.error("exists", path=shown(path)))
