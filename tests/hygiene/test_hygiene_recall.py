from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from sessions_app.hygiene import ContextConfig, RecallOutcome, render_result

STORED = "".join(f"row {n}\n" for n in range(1, 3401))


def recall(config: ContextConfig, number: int, outcome: RecallOutcome) -> tuple[str, str, str]:
    rendered = render_result(number=number, tool="recall", args_key="{}", outcome=outcome, table=[], config=config)
    return rendered.inserted_text, rendered.full_text, rendered.kind


def test_unknown_id(config: ContextConfig) -> None:
    inserted, full, kind = recall(config, 0x21, RecallOutcome(0xFFFF, None, 1, 2000))
    assert inserted == "[#0021] No stored result #ffff in this session."
    assert kind == "error" and full == "No stored result #ffff in this session."
    assert recall(config, 0x21, RecallOutcome(0x12, None, 1, 2000))[0].endswith(
        "No stored result #0012 in this session."
    )


def test_first_window_and_the_next(config: ContextConfig) -> None:
    inserted, full, kind = recall(config, 0x21, RecallOutcome(0x20, STORED, 1, 5000))
    lines = inserted.split("\n")
    assert lines[0] == "[#0021 recall #0020 lines 1-2000 of 3400]"
    assert lines[1:] == [f"row {n}" for n in range(1, 2001)]
    assert kind == "recall" and full == "\n".join(lines[1:])
    inserted, _, _ = recall(config, 0x22, RecallOutcome(0x20, STORED, 2001, 2000))
    lines = inserted.split("\n")
    assert lines[0] == "[#0022 recall #0020 lines 2001-3400 of 3400]"
    assert lines[1:] == [f"row {n}" for n in range(2001, 3401)]


def test_offset_and_limit(config: ContextConfig) -> None:
    inserted, _, _ = recall(config, 0x23, RecallOutcome(0x20, "a\nb\nc\nd\n", 2, 2))
    assert inserted == "[#0023 recall #0020 lines 2-3 of 4]\nb\nc"
    inserted, _, _ = recall(config, 0x23, RecallOutcome(0x20, "a\nb\nc\nd", 4, 10))
    assert inserted == "[#0023 recall #0020 lines 4-4 of 4]\nd"


def test_lines_are_shown_as_they_are(config: ContextConfig) -> None:
    inserted, _, _ = recall(config, 2, RecallOutcome(1, "1: import a\n2: export b", 1, 2000))
    assert inserted == "[#0002 recall #0001 lines 1-2 of 2]\n1: import a\n2: export b"


def test_empty_result(config: ContextConfig) -> None:
    inserted, full, kind = recall(config, 0x31, RecallOutcome(0x13, "", 1, 2000))
    assert inserted == "[#0031 recall #0013 empty]" and full == "" and kind == "recall"


def test_offset_past_the_end(config: ContextConfig) -> None:
    inserted, _, kind = recall(config, 0x22, RecallOutcome(0x20, STORED, 3401, 2000))
    assert inserted == "[#0022] Offset 3401 is past the end of #0020 (3400 lines)."
    assert kind == "error"


def test_recall_is_not_capped(make_config: Callable[..., ContextConfig]) -> None:
    config = make_config(cap={"max_lines": 3, "head_lines": 1, "tail_lines": 1})
    inserted, _, _ = recall(config, 2, RecallOutcome(1, STORED, 1, 100))
    assert len(inserted.split("\n")) == 101


texts = st.tuples(st.lists(st.text(alphabet="xy é", max_size=5), max_size=25), st.booleans()).map(
    lambda parts: "\n".join(parts[0]) + ("\n" if parts[0] and parts[1] else "")
)


@settings(max_examples=300, deadline=None)
@given(text=texts, window=st.integers(1, 6), limit=st.integers(1, 8))
def test_windows_over_all_offsets_reassemble_the_text(
    make_config: Callable[..., ContextConfig], text: str, window: int, limit: int
) -> None:
    config = make_config(recall={"window": window})
    lines = text.removesuffix("\n").split("\n") if text else []
    step = min(window, limit)
    for offset in range(1, len(lines) + 1):
        rendered = render_result(
            number=99,
            tool="recall",
            args_key="{}",
            outcome=RecallOutcome(1, text, offset, limit),
            table=[],
            config=config,
        )
        last = min(len(lines), offset + step - 1)
        assert rendered.full_text == "\n".join(lines[offset - 1 : last])
        assert rendered.inserted_text.split("\n")[0] == f"[#0063 recall #0001 lines {offset}-{last} of {len(lines)}]"
    parts = []
    for offset in range(1, len(lines) + 1, step):
        outcome = RecallOutcome(1, text, offset, limit)
        parts.append(
            render_result(number=99, tool="recall", args_key="{}", outcome=outcome, table=[], config=config).full_text
        )
    final_newline = "\n" if text.endswith("\n") else ""
    assert "\n".join(parts) + final_newline == text
    past = RecallOutcome(1, text, len(lines) + 1, limit)
    rendered = render_result(number=99, tool="recall", args_key="{}", outcome=past, table=[], config=config)
    assert rendered.kind == ("error" if text else "recall")
