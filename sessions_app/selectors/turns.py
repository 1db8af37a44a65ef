"""What a turn says: the one place that states a turn's reply text."""

from __future__ import annotations

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


def turns_reasoning(turn_ids: list[int]) -> dict[int, str]:
    """Each turn's reasoning as an earlier turn sends it back: its steps' reasoning in order, joined by a blank
    line; turns without any are left out."""
    pieces: dict[int, list[str]] = {}
    rows = (
        Step.objects.filter(turn_id__in=turn_ids)
        .exclude(reasoning="")
        .order_by("turn_id", "number")
        .values_list("turn_id", "reasoning")
    )
    for turn_id, reasoning in rows:
        pieces.setdefault(turn_id, []).append(reasoning)
    return {turn_id: REPLY_TEXT_SEPARATOR.join(texts) for turn_id, texts in pieces.items()}
