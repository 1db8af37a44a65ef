"""``edit``, ``multiedit`` and ``write``: a file's text changed in place, bytes elsewhere kept exactly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sessions_app.hygiene.config import ContextConfig
from sessions_app.hygiene.outcomes import EditOutcome, Outcome

from .args import Arguments, checked
from .context import ToolContext
from .editing import create, load_existing, update
from .errors import ToolError, shown
from .files import as_crlf, clean, is_crlf
from .paths import Root
from .quota import commit_within_quota
from .writes import check_parent


@dataclass(frozen=True)
class Replacement:
    """One ``old_string`` → ``new_string`` of an edit."""

    old: str
    new: str
    replace_all: bool


def edit(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """Replace ``old_string`` by ``new_string`` in a file; an empty ``old_string`` creates a new file."""
    call = checked(args, "edit", ctx)
    given = call.text("path")
    replacement = Replacement(clean(call.text("old_string")), clean(call.text("new_string")), call.flag("replace_all"))
    return _apply(given, [replacement], ctx, numbered=False)


def multiedit(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """Several replacements in one file, in order, all or none."""
    call = checked(args, "multiedit", ctx)
    given = call.text("path")
    replacements = _replacements(call, ctx.config)
    return _apply(given, replacements, ctx, numbered=True)


def write(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """Write a whole file: created (with its folders) when new, else replaced and answered as a diff."""
    call = checked(args, "write", ctx)
    given = call.text("path")
    content = clean(call.text("content"))
    with Root(ctx) as root:
        target = root.resolve(given)
        if target.kind != "missing":
            current = load_existing(root, target, ctx)
            change, pending = update(given, current, content, ctx)
            if content != current.text:
                commit_within_quota([pending], ctx, root)
            return EditOutcome((change,))
        check_parent(target, ctx)
        change, pending = create(given, target, content, ctx)
        commit_within_quota([pending], ctx, root)
    return EditOutcome((change,))


def replace_text(text: str, replacement: Replacement, path: str, config: ContextConfig) -> str:
    """``text`` with the replacement made; ``\\n`` in the strings may stand for the file's ``\\r\\n``.

    A CRLF file (every ``\\n`` after a ``\\r``) stays CRLF throughout: every line break the replacement
    brings is ``\\r\\n``, a one-line ``old_string`` replaced by several lines too. In any other file an
    ``old_string`` found only as ``\\r\\n`` lines gets ``\\r\\n`` breaks in its ``new_string``; otherwise
    ``new_string`` is put as it is.
    """
    old, new = replacement.old, replacement.new
    if old == new:
        raise ToolError(config.error("old_equals_new", path=shown(path)))
    if old == "":
        raise ToolError(config.error("old_string_empty", path=shown(path)))
    count = text.count(old)
    if count == 0 and "\r\n" in text and "\n" in old and "\r\n" not in old:
        crlf_old = old.replace("\n", "\r\n")
        count = text.count(crlf_old)
        if count:
            old, new = crlf_old, as_crlf(new)
    if count == 0:
        raise ToolError(config.error("old_string_missing", path=shown(path)))
    if count > 1 and not replacement.replace_all:
        raise ToolError(config.error("old_string_ambiguous", count=count, path=shown(path)))
    replaced = text.replace(old, new) if replacement.replace_all else text.replace(old, new, 1)
    return as_crlf(replaced) if is_crlf(text) else replaced  # its own breaks are CRLF already: only new ones change


def _apply(given: str, replacements: Sequence[Replacement], ctx: ToolContext, *, numbered: bool) -> Outcome:
    config = ctx.config
    first = replacements[0]
    with Root(ctx) as root:
        target = root.resolve(given)
        if target.kind == "missing" and first.old == "" and first.new != "":
            check_parent(target, ctx)
            text = _replace_all_of(first.new, replacements[1:], target.path, config, numbered=numbered, start=2)
            change, pending = create(given, target, text, ctx)
        else:
            current = load_existing(root, target, ctx)
            text = _replace_all_of(current.text, replacements, current.path, config, numbered=numbered, start=1)
            change, pending = update(given, current, text, ctx)
        commit_within_quota([pending], ctx, root)
    return EditOutcome((change,))


def _replace_all_of(
    text: str,
    replacements: Sequence[Replacement],
    path: str,
    config: ContextConfig,
    *,
    numbered: bool,
    start: int,
) -> str:
    total = len(replacements) + start - 1
    for index, replacement in enumerate(replacements, start=start):
        try:
            text = replace_text(text, replacement, path, config)
        except ToolError as error:
            if not numbered:
                raise
            raise ToolError(config.error("edit_failed", index=index, count=total, detail=error.message)) from None
    return text


def _replacements(call: Arguments, config: ContextConfig) -> list[Replacement]:
    edits = call.items("edits")
    if not edits:
        raise ToolError(config.error("no_edits"))
    return [
        Replacement(clean(item.text("old_string")), clean(item.text("new_string")), item.flag("replace_all"))
        for item in edits
    ]
