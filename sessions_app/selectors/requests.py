"""Builds the request a model is sent from the stored turns: the same rows always give the same bytes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sessions_app.models import ChatSession, Generation, Result, Step, Turn
from sessions_app.selectors.sessions import current_generation, history_turns


def dumps(value: object) -> str:
    """The one JSON serialization of everything sent: key order as built, no spaces, UTF-8 as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class BuiltRequest:
    body: bytes
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    message_offsets: list[int]
    turn_user_index: dict[int, int] = field(default_factory=dict)
    generation_number: int = 1

    def message_end(self, index: int) -> int:
        """Byte offset just after message ``index``."""
        if index + 1 < len(self.message_offsets):
            return self.message_offsets[index + 1] - 1
        return len(self.body) - 2


def _step_messages(step: Step, results: list[Result]) -> list[dict[str, Any]]:
    assistant: dict[str, Any] = {"role": "assistant", "content": step.text}
    if step.reasoning:
        assistant["reasoning_content"] = step.reasoning
    if step.tool_calls:
        assistant["tool_calls"] = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"]},
            }
            for call in step.tool_calls
        ]
    messages = [assistant]
    by_call = {result.call_id: result for result in results}
    for call in step.tool_calls:
        result = by_call.get(call["id"])
        if result is not None:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result.inserted_text})
    return messages


def request_messages(
    session: ChatSession, *, generation: Generation, current: Turn | None
) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """The messages of a request, and where each turn's user message sits among them."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": generation.system_prompt}]
    turn_user_index: dict[int, int] = {}
    for turn in history_turns(session, generation=generation):
        if current is not None and turn.number >= current.number:
            break
        turn_user_index[turn.number] = len(messages)
        messages.append({"role": "user", "content": turn.message})
        messages.append({"role": "assistant", "content": turn.reply_text})
    if current is not None:
        turn_user_index[current.number] = len(messages)
        messages.append({"role": "user", "content": current.message})
        results = list(current.results.order_by("number"))
        for step in current.steps.order_by("number"):
            messages.extend(_step_messages(step, [r for r in results if r.step_id == step.pk]))
    return messages, turn_user_index


def build_request(
    session: ChatSession,
    *,
    current: Turn | None,
    model_name: str,
    extra_user: str | None = None,
) -> BuiltRequest:
    """The request for the next step of ``current`` (or, with ``current`` None, the next turn's history)."""
    generation = current_generation(session)
    tools: list[dict[str, Any]] = json.loads(generation.tools_json)
    messages, turn_user_index = request_messages(session, generation=generation, current=current)
    if extra_user is not None:
        messages.append({"role": "user", "content": extra_user})
    head = (
        '{"model":'
        + dumps(model_name)
        + ',"stream":true,"stream_options":{"include_usage":true}'
        + (',"tools":' + dumps(tools) if tools else "")
        + ',"messages":['
    )
    parts: list[bytes] = [head.encode()]
    offsets: list[int] = []
    size = len(parts[0])
    for index, message in enumerate(messages):
        encoded = (("," if index else "") + dumps(message)).encode()
        offsets.append(size + (1 if index else 0))
        parts.append(encoded)
        size += len(encoded)
    parts.append(b"]}")
    return BuiltRequest(
        body=b"".join(parts),
        messages=messages,
        tools=tools,
        message_offsets=offsets,
        turn_user_index=turn_user_index,
        generation_number=generation.number,
    )
