"""``recall``: a stored result of the session, shown again by its id."""

from __future__ import annotations

from collections.abc import Mapping

from sessions_app.hygiene.ids import parse_id
from sessions_app.hygiene.outcomes import Outcome, RecallOutcome

from .args import Args
from .context import ToolContext
from .errors import ToolError


def recall(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """The stored full text of result ``id`` (hex, ``#`` optional), from line ``offset``.

    A number given as JSON is read as the hex digits it is written with: ``12`` is ``#0012``.
    """
    config = ctx.config
    call = Args(args, "recall", config)
    given = call.values.get("id")
    if given is None:
        raise ToolError(config.error("missing_argument", tool="recall", name="id"))
    offset = call.number("offset", 1, minimum=1)
    limit = min(call.number("limit", config.recall_window, minimum=1), config.recall_window)
    target = _target(given)
    if target is None:
        raise call.wrong_type("id", "expected_id")
    return RecallOutcome(target, ctx.recall(target), offset, limit)


def _target(given: object) -> int | None:
    if isinstance(given, bool):
        return None
    if isinstance(given, int):
        return parse_id(str(given)) if given >= 0 else None
    if isinstance(given, str):
        return parse_id(given)
    return None
