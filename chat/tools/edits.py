"""``edit``, ``multiedit`` and ``write``: a file's text changed in place, bytes elsewhere kept exactly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sessions_app.hygiene.config import ContextConfig
from sessions_app.hygiene.outcomes import EditOutcome, Outcome

from .args import Args
from .context import ToolContext
from .editing import create, load_existing, update
from .errors import ToolError, shown
from .files import clean
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
    call = Args(args, "edit", ctx.config)
    given = call.text("path")
    replacement = Replacement(
        clean(call.text("old_string")), clean(call.text("new_string")), call.flag("replace_all", False)
    )
    return _apply(given, [replacement], ctx, numbered=False)


def multiedit(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """Several replacements in one file, in order, all or none."""
    call = Args(args, "multiedit", ctx.config)
    given = call.text("path")
    replacements = _replacements(call)
    return _apply(given, replacements, ctx, numbered=True)


def write(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """Write a whole file: created (with its folders) when new, else replaced and answered as a diff."""
    call = Args(args, "write", ctx.config)
    given = call.text("path")
    content = clean(call.text("content"))
    with Root(ctx) as root:
        target = root.resolve(given)
        if target.kind != "missing":
            current = load_existing(root, target, ctx)
            change, pending = update(given, current, content, ctx)
            if content != current.text:
                commit_within_quota([pending], ctx)
            return EditOutcome((change,))
        check_parent(target, ctx)
        change, pending = create(given, target, content, ctx)
        commit_within_quota([pending], ctx)
    return EditOutcome((change,))


def replace_text(text: str, replacement: Replacement, path: str, config: ContextConfig) -> str:
    """``text`` with the replacement made; in a CRLF file, ``\\n`` in the strings stands for ``\\r\\n``."""
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
            old, new = crlf_old, new.replace("\r\n", "\n").replace("\n", "\r\n")
    if count == 0:
        raise ToolError(config.error("old_string_missing", path=shown(path)))
    if count > 1 and not replacement.replace_all:
        raise ToolError(config.error("old_string_ambiguous", count=count, path=shown(path)))
    return text.replace(old, new) if replacement.replace_all else text.replace(old, new, 1)


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
        commit_within_quota([pending], ctx)
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


def _replacements(call: Args) -> list[Replacement]:
    edits = call.values.get("edits")
    if edits is None:
        raise ToolError(call.config.error("missing_argument", tool=call.tool, name="edits"))
    if not isinstance(edits, list) or not all(isinstance(item, Mapping) for item in edits):
        raise call.wrong_type("edits", "expected_edits")
    if not edits:
        raise ToolError(call.config.error("no_edits"))
    replacements = []
    for item in edits:
        inner = Args(item, call.tool, call.config)
        old, new = item.get("old_string"), item.get("new_string")
        if not isinstance(old, str) or not isinstance(new, str):
            raise call.wrong_type("edits", "expected_edits")
        replacements.append(Replacement(clean(old), clean(new), inner.flag("replace_all", False)))
    return replacements
