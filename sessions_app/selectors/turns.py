"""What a turn says: the one place that states a turn's reply text."""

from __future__ import annotations

from sessions_app.models import StepDraft, Turn

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
