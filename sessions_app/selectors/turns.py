"""What a turn says: the one place that states a turn's reply text."""

from __future__ import annotations

from django.db.models import QuerySet

from sessions_app.models import Step, StepDraft, Turn

REPLY_TEXT_SEPARATOR = "\n\n"


def turn_reply_text(turn: Turn, *, unstored: str = "") -> str:
    """The reply's text: its steps' texts in order, then ``unstored`` (what streamed but no step holds),
    joined by a blank line."""
    texts = [text for text in turn.steps.order_by("number").values_list("text", flat=True) if text]
    if unstored:
        texts.append(unstored)
    return REPLY_TEXT_SEPARATOR.join(texts)


def turn_draft_text(turn: Turn) -> str:
    """The text of the step being streamed as last saved, or ``""``."""
    draft = StepDraft.objects.filter(turn=turn).order_by("-number").values_list("text", flat=True).first()
    return draft or ""


def turns_reasoning(turns: QuerySet[Turn]) -> dict[int, str]:
    """Each of ``turns``' reasoning as an earlier turn sends it back: its steps' reasoning in order, joined by a
    blank line; turns without any are left out. The turns are read as a subquery, not a list of ids (a
    1,000-turn session's list cost 0.2 s to send)."""
    pieces: dict[int, list[str]] = {}
    rows = (
        Step.objects.filter(turn__in=turns.values("pk"))
        .exclude(reasoning="")
        .order_by("turn_id", "number")
        .values_list("turn_id", "reasoning")
    )
    for turn_id, reasoning in rows:
        pieces.setdefault(turn_id, []).append(reasoning)
    return {turn_id: REPLY_TEXT_SEPARATOR.join(texts) for turn_id, texts in pieces.items()}
