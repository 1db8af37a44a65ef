from __future__ import annotations

import pytest

from sessions_app.hygiene import (
    NOTHING_STATED,
    ComposedMessage,
    ContextConfig,
    StatedContext,
    UploadedFile,
    compose_message,
    restated_message,
    size_text,
    stated_after,
)

PLAN = "read-only tools.\nMore words.\n"
KNOWN = StatedContext(workspace="ws", model="qwen", mode="edit", date="2026-11-29")


def compose(
    config: ContextConfig,
    stated: StatedContext,
    *,
    today: str = "2026-11-29",
    workspace: str = "ws",
    model: str = "qwen",
    mode: str = "edit",
    instructions: str | None = None,
    session_instructions: str | None = None,
) -> ComposedMessage:
    return compose_message(
        "hello",
        today=today,
        workspace=workspace,
        model=model,
        mode=mode,
        mode_text=PLAN,
        instructions=instructions,
        stated=stated,
        config=config,
        session_instructions=session_instructions,
    )


def test_first_message_states_workspace_model_mode_and_date_in_that_order(config: ContextConfig) -> None:
    composed = compose(config, NOTHING_STATED, mode="plan")
    assert composed == ComposedMessage(
        'hello\n\n<note>\nWorkspace: "ws".\n\nYour model: qwen.\n\n'
        "The permission mode is plan: read-only tools.\nMore words.\n\nDate: 2026-11-29.\n</note>",
        workspace_noted="ws",
        model_noted="qwen",
        mode_noted="plan",
        date_noted="2026-11-29",
    )
    assert stated_after(NOTHING_STATED, composed) == StatedContext("ws", "qwen", "plan", "2026-11-29", None)


def test_the_first_note_is_the_same_but_for_the_names(config: ContextConfig) -> None:
    one = compose(config, NOTHING_STATED, workspace="alpha", model="m1").text
    other = compose(config, NOTHING_STATED, workspace="beta", model="m2").text
    assert one.replace("alpha", "beta").replace("m1", "m2") == other


def test_nothing_changed_is_the_words_alone(config: ContextConfig) -> None:
    assert compose(config, KNOWN) == ComposedMessage("hello")


def test_a_new_model_is_stated_alone(config: ContextConfig) -> None:
    composed = compose(config, KNOWN, model="llama")
    assert composed == ComposedMessage("hello\n\n<note>\nYour model: llama.\n</note>", model_noted="llama")
    assert stated_after(KNOWN, composed) == StatedContext("ws", "llama", "edit", "2026-11-29", None)


def test_a_renamed_workspace_is_stated_again(config: ContextConfig) -> None:
    composed = compose(config, KNOWN, workspace="ws2")
    assert composed.text == 'hello\n\n<note>\nWorkspace: "ws2".\n</note>'
    assert composed.workspace_noted == "ws2"


def test_empty_names_are_not_stated(config: ContextConfig) -> None:
    composed = compose(config, KNOWN, workspace="", model="")
    assert composed == ComposedMessage("hello")


def test_changes_in_order_and_the_mode_read_once(config: ContextConfig) -> None:
    stated = StatedContext("ws", "qwen", "edit", "2026-11-28", None)
    composed = compose(config, stated, mode="plan", instructions="Use tabs.\n")
    assert composed.text == (
        "hello\n\n<note>\nThe permission mode is now plan: read-only tools.\nMore words.\n\n"
        "Date: 2026-11-29.\n\n"
        "The workspace's instructions (AGENTS.md) are now:\nUse tabs.\n</note>"
    )
    assert (composed.mode_noted, composed.date_noted, composed.instructions_noted) == (
        "plan",
        "2026-11-29",
        "Use tabs.",
    )
    after = stated_after(stated, composed)
    assert after == StatedContext("ws", "qwen", "plan", "2026-11-29", "Use tabs.")
    assert compose(config, after, mode="plan", instructions="Use tabs.").text == "hello"


def test_instructions_removed(config: ContextConfig) -> None:
    stated = StatedContext("ws", "qwen", "edit", "2026-11-29", "Use tabs.")
    composed = compose(config, stated)
    assert composed.text == (
        "hello\n\n<note>\nThe workspace has no AGENTS.md any more; its earlier instructions no longer apply.\n</note>"
    )
    assert composed.instructions_noted == ""
    assert stated_after(stated, composed) == KNOWN


def test_blank_instructions_count_as_none(config: ContextConfig) -> None:
    assert compose(config, KNOWN, instructions="  \n").text == "hello"


def test_changed_instructions_are_shown_again(config: ContextConfig) -> None:
    stated = StatedContext("ws", "qwen", "edit", "2026-11-29", "Use tabs.")
    composed = compose(config, stated, instructions="Use spaces.")
    assert composed.text.endswith("are now:\nUse spaces.\n</note>")
    assert compose(config, stated, instructions="Use tabs.\n").text == "hello"


def test_stated_after_keeps_what_was_not_mentioned() -> None:
    stated = StatedContext("ws", "qwen", "plan", "2026-11-29", "x")
    assert stated_after(stated, ComposedMessage("hi")) == stated


def test_a_sessions_instructions_come_last_stripped_and_only_when_they_change(config: ContextConfig) -> None:
    first = compose(config, KNOWN, instructions="Run the tests.", session_instructions="  Answer in French.\n")
    assert first.text == (
        "hello\n\n<note>\nThe workspace's instructions (AGENTS.md) are now:\nRun the tests.\n\n"
        "Instructions for this session:\nAnswer in French.\n</note>"
    )
    assert first.session_instructions_noted == "Answer in French."
    stated = stated_after(KNOWN, first)
    assert stated.session_instructions == "Answer in French."
    again = compose(config, stated, instructions="Run the tests.", session_instructions="Answer in French. ")
    assert again == ComposedMessage("hello"), "the same instructions again: no note"
    removed = compose(config, stated, instructions="Run the tests.", session_instructions="   ")
    assert removed.text == "hello\n\n<note>\nThis session's earlier instructions no longer apply.\n</note>"
    assert removed.session_instructions_noted == ""
    assert stated_after(stated, removed).session_instructions is None
    assert compose(config, stated_after(stated, removed), instructions="Run the tests.") == ComposedMessage("hello")


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 bytes"),
        (1, "1 byte"),
        (1023, "1023 bytes"),
        (1024, "1 KB"),
        (34_816, "34 KB"),
        (1_048_575, "1.0 MB"),
        (1_258_291, "1.2 MB"),
        (15 * 1_048_576, "15 MB"),
        (3 * 1024**3, "3.0 GB"),
        (2048 * 1024**3, "2,048 GB"),
    ],
)
def test_sizes_read_as_a_person_says_them(size: int, text: str) -> None:
    assert size_text(size) == text


def test_uploads_are_said_last_every_time(config: ContextConfig) -> None:
    files = [UploadedFile("docs/spec.pdf", 34_816), UploadedFile("a b.txt", 3)]
    said = compose_message(
        "Read them",
        today="2026-11-29",
        workspace="ws",
        model="qwen",
        mode="edit",
        mode_text=PLAN,
        instructions=None,
        stated=KNOWN,
        config=config,
        session_instructions="Be brief.",
        uploads=files,
    )
    assert said.text == (
        "Read them\n\n<note>\nInstructions for this session:\nBe brief.\n\n"
        "Uploaded: docs/spec.pdf, 34 KB; a b.txt, 3 bytes.\n</note>"
    )
    assert stated_after(KNOWN, said) == StatedContext("ws", "qwen", "edit", "2026-11-29", None, "Be brief.")


def test_an_attached_image_is_said_to_be_one_the_model_is_not_shown(config: ContextConfig) -> None:
    files = [UploadedFile("shot.PNG", 2048), UploadedFile("notes.md", 10)]
    said = compose_message(
        "See",
        today="2026-11-29",
        workspace="ws",
        model="qwen",
        mode="edit",
        mode_text=PLAN,
        instructions=None,
        stated=KNOWN,
        config=config,
        uploads=files,
    )
    assert said.text == (
        "See\n\n<note>\nUploaded: shot.PNG, 2 KB, an image (the model is not shown images; read cannot open one); "
        "notes.md, 10 bytes.\n</note>"
    )


def test_an_image_shown_with_the_message_and_one_that_cannot_be_are_said_so(config: ContextConfig) -> None:
    files = [UploadedFile("shot.png", 2048, shown=True), UploadedFile("scan.tif", 99, problem="it is too big")]
    said = compose_message(
        "See",
        today="2026-11-29",
        workspace="ws",
        model="qwen",
        mode="edit",
        mode_text=PLAN,
        instructions=None,
        stated=KNOWN,
        config=config,
        uploads=files,
    )
    assert said.text == (
        "See\n\n<note>\nUploaded: shot.png, 2 KB, an image, shown with this message; "
        "scan.tif, 99 bytes, an image that cannot be shown: it is too big.\n</note>"
    )


def test_mcp_servers_instructions_are_said_once_then_when_they_change_or_go(config: ContextConfig) -> None:
    def said(stated: StatedContext, servers: dict[str, str]) -> ComposedMessage:
        return compose_message(
            "hi",
            today="2026-11-29",
            workspace="ws",
            model="qwen",
            mode="edit",
            mode_text=PLAN,
            instructions=None,
            stated=stated,
            config=config,
            tool_instructions=servers,
        )

    first = said(KNOWN, {"wiki": "Search first.", "db": "  ", "notes": "Cite pages."})
    assert first.text == (
        "hi\n\n<note>\nInstructions of the MCP server notes:\nCite pages.\n\n"
        "Instructions of the MCP server wiki:\nSearch first.\n</note>"
    )
    assert first.tool_instructions_noted == {"notes": "Cite pages.", "wiki": "Search first."}
    stated = stated_after(KNOWN, first)
    assert said(stated, {"wiki": "Search first.", "notes": "Cite pages."}).text == "hi"
    changed = said(stated, {"wiki": "Search twice."})
    assert changed.text == (
        "hi\n\n<note>\nThe MCP server notes gives no instructions any more; its earlier ones no longer apply.\n\n"
        "Instructions of the MCP server wiki:\nSearch twice.\n</note>"
    )
    assert stated_after(stated, changed).tool_instructions == (("wiki", "Search twice."),)


def test_a_restated_message_states_exactly_the_items_given_and_never_instructions(config: ContextConfig) -> None:
    first = compose(config, NOTHING_STATED, instructions="secret", session_instructions="also secret")
    again = restated_message(
        "hello",
        workspace="copy-ws",
        model="qwen",
        mode="edit",
        mode_text=PLAN,
        mode_first=True,
        date="2026-11-29",
        config=config,
        uploads=[UploadedFile("a.txt", 3)],
    )
    assert again.text == first.text.split("\n\nThe workspace's instructions")[0].replace('"ws"', '"copy-ws"') + (
        "\n\nUploaded: a.txt, 3 bytes.\n</note>"
    )
    assert (again.workspace_noted, again.instructions_noted, again.session_instructions_noted) == (
        "copy-ws",
        None,
        None,
    )
    later = restated_message(
        "hello", workspace=None, model=None, mode="plan", mode_text=PLAN, mode_first=False, date=None, config=config
    )
    assert later.text == compose(config, KNOWN, mode="plan").text, "a change of mode, said as a change"
    assert restated_message(
        "hello", workspace=None, model=None, mode=None, mode_text="", mode_first=False, date=None, config=config
    ) == ComposedMessage("hello")
