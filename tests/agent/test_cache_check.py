"""The cache-miss classifier: expected tokens against reported ones, and where two renderings part."""

from __future__ import annotations

import json
from typing import Any

from chat.agent.cache_check import (
    HARNESS,
    SERVER,
    TEMPLATE,
    Divergence,
    classify,
    divergence,
    message_ends,
    shared_prefix,
)


def render(messages: list[dict[str, Any]], *, think: bool) -> str:
    """A ChatML-like rendering; with ``think`` the reasoning of the last assistant message only is shown."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    parts = []
    for index, message in enumerate(messages):
        reasoning = message.get("reasoning_content", "")
        shown = f"<think>{reasoning}</think>" if reasoning and (not think or index == last) else ""
        calls = "".join(
            f"<call>{call['function']['name']} {call['function']['arguments']}</call>"
            for call in message.get("tool_calls", ())
        )
        parts.append(f"<|{message['role']}|>{shown}{message.get('content', '')}{calls}<|end|>")
    return "".join(parts) + "<|assistant|>"


SYSTEM: dict[str, Any] = {"role": "system", "content": "You help."}
USER: dict[str, Any] = {"role": "user", "content": "Read notes.md"}
STEP_1: dict[str, Any] = {
    "role": "assistant",
    "content": "",
    "reasoning_content": "I will read it.",
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path":"n"}'}}],
}
RESULT_1: dict[str, Any] = {"role": "tool", "tool_call_id": "c1", "content": "[#0001 n]\n1: hello"}
STEP_2: dict[str, Any] = {**STEP_1, "tool_calls": [{**STEP_1["tool_calls"][0], "id": "c2"}]}
RESULT_2: dict[str, Any] = {"role": "tool", "tool_call_id": "c2", "content": "[#0002 n]\nUnchanged since #0001."}


def test_shared_prefix_counts_from_the_first_item() -> None:
    assert shared_prefix((1, 2, 3), (1, 2, 4, 5)) == 2
    assert shared_prefix((), (1,)) == 0
    assert shared_prefix("abc", "abc") == 3


def test_message_ends_follow_each_messages_own_strings_in_order() -> None:
    messages = [SYSTEM, USER, STEP_1, RESULT_1]
    text = render(messages, think=False)
    ends = message_ends(messages, text)
    assert text[: ends[0]].endswith("You help.")
    assert text[: ends[1]].endswith("Read notes.md")
    assert text[: ends[2]].endswith('{"path":"n"}')
    assert text[: ends[3]].endswith("1: hello")
    assert ends == sorted(ends)


def test_a_message_with_an_image_ends_where_its_text_does() -> None:
    """A template writes an image as its marker: the message's own strings are its text parts."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with_image = {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}
    text = "<|system|>You help.<|user|>What is this?<__media__><|assistant|>"
    ends = message_ends([SYSTEM, with_image], text)
    assert text[: ends[1]].endswith("What is this?")


def test_no_divergence_when_the_renderings_part_after_the_shared_messages() -> None:
    before = [SYSTEM, USER, STEP_1, RESULT_1]
    after = [*before, STEP_2, RESULT_2]
    found = divergence(before, after, render(before, think=False), render(after, think=False), promised=len(before))
    assert found is None


def test_a_template_that_drops_earlier_reasoning_parts_at_that_message() -> None:
    before = [SYSTEM, USER, STEP_1, RESULT_1]
    after = [*before, STEP_2, RESULT_2]
    found = divergence(before, after, render(before, think=True), render(after, think=True), promised=len(before))
    assert found is not None
    parted, promised_end = found
    assert parted.message == 2
    assert parted.same_bytes
    assert "<think>I will read it.</think>" in parted.before
    assert "<think>" not in parted.after
    assert render(before, think=True)[:promised_end].endswith("1: hello")


def test_changed_bytes_part_at_the_changed_message() -> None:
    before = [SYSTEM, USER, STEP_1, RESULT_1]
    after = [SYSTEM, {"role": "user", "content": "Read notes.md!"}, STEP_1, RESULT_1, STEP_2, RESULT_2]
    found = divergence(before, after, render(before, think=False), render(after, think=False), promised=len(before))
    assert found is not None
    assert found[0].message == 1
    assert not found[0].same_bytes


def test_nothing_promised_nothing_parted() -> None:
    before = [SYSTEM, USER]
    assert divergence(before, [SYSTEM], "a", "b", promised=0) is None


def test_all_reused_is_no_miss() -> None:
    check = classify(expected_cached=500, reported_cached=500, harness_break=False, parted=None, promised_tokens=None)
    assert (check.miss, check.tokens_lost, check.expected_cached) == ("", 0, 500)


def test_more_than_expected_is_no_miss() -> None:
    check = classify(expected_cached=500, reported_cached=520, harness_break=False, parted=None, promised_tokens=None)
    assert check.miss == ""


def test_one_token_short_is_the_servers_own_reevaluation() -> None:
    check = classify(expected_cached=500, reported_cached=499, harness_break=False, parted=None, promised_tokens=None)
    assert check.miss == ""


def test_same_tokens_not_reused_is_the_server() -> None:
    check = classify(expected_cached=500, reported_cached=0, harness_break=False, parted=None, promised_tokens=None)
    assert (check.miss, check.tokens_lost) == (SERVER, 500)


def test_no_report_is_no_server_miss() -> None:
    check = classify(expected_cached=500, reported_cached=None, harness_break=False, parted=None, promised_tokens=None)
    assert check.miss == ""


def test_same_bytes_rendered_differently_is_the_template() -> None:
    parted = Divergence(message=2, before="<think>r</think>", after="", same_bytes=True)
    check = classify(expected_cached=300, reported_cached=300, harness_break=False, parted=parted, promised_tokens=420)
    assert (check.miss, check.tokens_lost, check.message) == (TEMPLATE, 120, 2)
    assert (check.before, check.after) == ("<think>r</think>", "")


def test_a_template_miss_also_evicted_counts_both() -> None:
    parted = Divergence(message=2, before="x", after="y", same_bytes=True)
    check = classify(expected_cached=300, reported_cached=0, harness_break=False, parted=parted, promised_tokens=420)
    assert (check.miss, check.tokens_lost) == (TEMPLATE, 420)


def test_changed_bytes_are_the_harness() -> None:
    parted = Divergence(message=1, before="a", after="b", same_bytes=False)
    check = classify(expected_cached=20, reported_cached=20, harness_break=True, parted=parted, promised_tokens=420)
    assert (check.miss, check.tokens_lost, check.message) == (HARNESS, 400, 1)


def test_an_unexpected_byte_break_is_the_harness_even_where_the_renderings_agree() -> None:
    check = classify(expected_cached=20, reported_cached=10, harness_break=True, parted=None, promised_tokens=None)
    assert (check.miss, check.tokens_lost) == (HARNESS, 10)


def test_a_server_that_renders_nothing_costs_no_parse_of_the_previous_body(monkeypatch: Any) -> None:
    from chat.agent import cache_check
    from testing.scripted_server import ScriptedServer

    parsed: list[bytes] = []
    real = cache_check._messages_and_tools

    def counted(body: bytes) -> Any:
        parsed.append(body)
        return real(body)

    monkeypatch.setattr(cache_check, "_messages_and_tools", counted)
    previous = json.dumps({"messages": [SYSTEM, USER], "tools": []}).encode()
    with ScriptedServer(server_api=False) as server:
        check = cache_check.check_request(
            base_url=server.base_url,
            api_key=None,
            previous_body=previous,
            body=json.dumps({"messages": [SYSTEM, USER, STEP_1], "tools": []}).encode(),
            messages=[SYSTEM, USER, STEP_1],
            tools=[],
            promised_messages=2,
            harness_break=False,
            reported_cached=None,
        )
    assert check is None
    assert parsed == []
