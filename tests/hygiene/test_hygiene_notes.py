from __future__ import annotations

from sessions_app.hygiene import ComposedMessage, ContextConfig, StatedContext, compose_message, stated_after

PLAN = "Plan mode: read-only tools.\nMore words.\n"
START = StatedContext(date=None, mode="edit", instructions=None)


def compose(
    config: ContextConfig,
    stated: StatedContext,
    *,
    today: str = "2026-11-29",
    mode: str = "edit",
    instructions: str | None = None,
) -> ComposedMessage:
    return compose_message(
        "hello",
        today=today,
        mode=mode,
        mode_text=PLAN,
        instructions=instructions,
        stated=stated,
        config=config,
    )


def test_first_message_carries_the_date(config: ContextConfig) -> None:
    composed = compose(config, START)
    assert composed == ComposedMessage(
        "hello\n\n<note>\nToday's date is 2026-11-29.\n</note>", "2026-11-29", None, None
    )


def test_nothing_changed_is_the_words_alone(config: ContextConfig) -> None:
    stated = StatedContext("2026-11-29", "edit", None)
    assert compose(config, stated) == ComposedMessage("hello", None, None, None)


def test_all_three_in_order(config: ContextConfig) -> None:
    stated = StatedContext("2026-11-28", "edit", None)
    composed = compose(config, stated, mode="plan", instructions="Use tabs.\n")
    assert composed.text == (
        "hello\n\n<note>\nToday's date is 2026-11-29.\n\n"
        "The permission mode is now plan: Plan mode: read-only tools.\nMore words.\n\n"
        "The workspace's instructions (AGENTS.md) are now:\nUse tabs.\n</note>"
    )
    assert (composed.date_noted, composed.mode_noted, composed.instructions_noted) == (
        "2026-11-29",
        "plan",
        "Use tabs.",
    )
    after = stated_after(stated, composed)
    assert after == StatedContext("2026-11-29", "plan", "Use tabs.")
    assert compose(config, after, mode="plan", instructions="Use tabs.").text == "hello"


def test_instructions_removed(config: ContextConfig) -> None:
    stated = StatedContext("2026-11-29", "edit", "Use tabs.")
    composed = compose(config, stated)
    assert composed.text == (
        "hello\n\n<note>\nThe workspace has no AGENTS.md any more; its earlier instructions no longer apply.\n</note>"
    )
    assert composed.instructions_noted == ""
    assert stated_after(stated, composed) == StatedContext("2026-11-29", "edit", None)


def test_blank_instructions_count_as_none(config: ContextConfig) -> None:
    stated = StatedContext("2026-11-29", "edit", None)
    assert compose(config, stated, instructions="  \n").text == "hello"


def test_changed_instructions_are_shown_again(config: ContextConfig) -> None:
    stated = StatedContext("2026-11-29", "edit", "Use tabs.")
    composed = compose(config, stated, instructions="Use spaces.")
    assert composed.text.endswith("are now:\nUse spaces.\n</note>")
    assert compose(config, stated, instructions="Use tabs.\n").text == "hello"


def test_stated_after_keeps_what_was_not_mentioned(config: ContextConfig) -> None:
    stated = StatedContext("2026-11-29", "plan", "x")
    assert stated_after(stated, ComposedMessage("hi", None, None, None)) == stated
