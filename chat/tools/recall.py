"""``recall``: a stored result of the session, shown again by its id."""

from __future__ import annotations

from collections.abc import Mapping

from sessions_app.hygiene.outcomes import Outcome, RecallOutcome

from .args import checked
from .context import ToolContext


def recall(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """The stored full text of result ``id`` (hex, ``#`` optional), from line ``offset``.

    A number given as JSON is read as the hex digits it is written with: ``12`` is ``#0012``.
    """
    call = checked(args, "recall", ctx)
    target = call.number("id")
    return RecallOutcome(target, ctx.recall(target), call.number("offset"), call.number("limit"))
