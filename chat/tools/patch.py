"""``apply_patch``: a Codex-format patch over one or more files, checked whole before anything is written.

``*** Move to:`` is supported: the file at its new path answers as created (so that an undo removes
it), followed by the deletion of its old path. The new path must not exist yet.
"""

from __future__ import annotations

from collections.abc import Mapping

from sessions_app.hygiene.outcomes import EditOutcome, FileChange, Outcome

from .args import checked
from .context import ToolContext
from .editing import create, delete, load_existing, update
from .errors import ToolError, shown
from .files import clean
from .patch_format import FileOp, apply_hunks, parse_patch
from .paths import Resolved, Root
from .quota import commit_within_quota
from .writes import PendingWrite, check_parent


def apply_patch(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """Add, update, move and delete files as the patch says, all or none."""
    config = ctx.config
    patch = clean(checked(args, "apply_patch", ctx).text("patch"))
    touched: set[str] = set()
    changes: list[FileChange] = []
    writes: list[PendingWrite] = []
    with Root(ctx) as root:
        for op in parse_patch(patch, config):
            target = _claim(root, op.path, touched, ctx)
            for change, pending in _plan(root, op, target, touched, ctx):
                changes.append(change)
                writes.append(pending)
        commit_within_quota(writes, ctx, root)
    return EditOutcome(tuple(changes), several=len(changes) > 1)


def _plan(
    root: Root, op: FileOp, target: Resolved, touched: set[str], ctx: ToolContext
) -> list[tuple[FileChange, PendingWrite]]:
    config = ctx.config
    if op.action == "add":
        _require_absent(target, ctx)
        check_parent(target, ctx)
        return [create(op.path, target, op.content, ctx)]
    current = load_existing(root, target, ctx)
    if op.action == "delete":
        return [delete(op.path, current)]
    if not op.hunks and op.move_to is None:
        detail = config.error("patch_no_hunks", path=shown(target.path))
        raise ToolError(config.error("patch_invalid", detail=detail))
    text = apply_hunks(current.text, op.hunks, target.path, config)
    if op.move_to is None or root.resolve(op.move_to).path == target.path:
        return [update(op.path, current, text, ctx)]
    moved = _claim(root, op.move_to, touched, ctx)
    _require_absent(moved, ctx)
    check_parent(moved, ctx)
    return [create(op.move_to, moved, text, ctx), delete(op.path, current)]


def _claim(root: Root, given: str, touched: set[str], ctx: ToolContext) -> Resolved:
    target = root.resolve(given)
    if target.path in touched:
        detail = ctx.config.error("patch_twice", path=shown(target.path))
        raise ToolError(ctx.config.error("patch_invalid", detail=detail))
    touched.add(target.path)
    return target


def _require_absent(target: Resolved, ctx: ToolContext) -> None:
    if target.kind != "missing":
        raise ToolError(ctx.config.error("exists", path=shown(target.path)))
