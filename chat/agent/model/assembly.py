"""Folding the chunks of a streamed chat completion into what the caller shows as it comes (pieces) and the
whole answer (``Completion``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from chat.agent.model.errors import int_or_none


@dataclass
class ToolCall:
    """A tool call the model made: its arguments exactly as generated."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass
class Completion:
    """The model's whole answer, with the server's raw usage and timings as sent."""

    text: str
    reasoning: str
    tool_calls: list[ToolCall]
    finish_reason: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    usage: dict[str, Any] | None
    timings: dict[str, Any] | None
    time_to_first_token: float | None
    total_time: float
    model: str | None


@dataclass(frozen=True)
class TextPiece:
    """Text the model generated, as it came."""

    text: str


@dataclass(frozen=True)
class ReasoningPiece:
    """Reasoning the model generated (`reasoning_content`), as it came."""

    text: str


@dataclass(frozen=True)
class ToolCallPiece:
    """The model began a tool call: its name is known, its arguments are still coming."""

    index: int
    name: str


StreamPiece = TextPiece | ReasoningPiece | ToolCallPiece


def joined(pieces: list[StreamPiece]) -> list[StreamPiece]:
    """``pieces`` with each run of text (or of reasoning) as one piece: what came in one read goes on together."""
    out: list[StreamPiece] = []
    for piece in pieces:
        last = out[-1] if out else None
        if isinstance(piece, TextPiece) and isinstance(last, TextPiece):
            out[-1] = TextPiece(last.text + piece.text)
        elif isinstance(piece, ReasoningPiece) and isinstance(last, ReasoningPiece):
            out[-1] = ReasoningPiece(last.text + piece.text)
        else:
            out.append(piece)
    return out


class StreamAssembler:
    """Folds parsed chunks of a chat completion stream into a `Completion`; `pieces` holds what each
    chunk added, for the caller to take."""

    def __init__(self) -> None:
        self.pieces: list[StreamPiece] = []
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, ToolCall] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.ollama_cached: int | None = None
        self.model: str | None = None
        self.got_token = False

    def add(self, chunk: dict[str, Any]) -> bool:
        """Take one chunk; True when it carried generated content (text, reasoning or a call)."""
        if self.model is None and isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        self._accounting(chunk)
        produced = False
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, dict) and choice.get("index", 0) in (0, None):
                produced = self._choice(choice) or produced
        if produced:
            self.got_token = True
        return produced

    def _accounting(self, chunk: dict[str, Any]) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
            cached = int_or_none(usage.get("prompt_eval_cached_count"))
            if cached is not None:
                self.ollama_cached = cached
        timings = chunk.get("timings")
        if isinstance(timings, dict):
            self.timings = timings
        cached = int_or_none(chunk.get("prompt_eval_cached_count"))
        if cached is not None:
            self.ollama_cached = cached

    def _choice(self, choice: dict[str, Any]) -> bool:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            delta = choice.get("message")
        produced = self._delta(delta) if isinstance(delta, dict) else False
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self.finish_reason = reason
        return produced

    def _delta(self, delta: dict[str, Any]) -> bool:
        produced = False
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.text.append(content)
            produced = True
            self.pieces.append(TextPiece(content))
        reasoning = delta.get("reasoning_content")
        if not isinstance(reasoning, str) or not reasoning:
            reasoning = delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.reasoning.append(reasoning)
            produced = True
            self.pieces.append(ReasoningPiece(reasoning))
        calls = delta.get("tool_calls")
        if isinstance(calls, list) and calls:
            for position, fragment in enumerate(calls):
                if isinstance(fragment, dict):
                    self._tool_fragment(position, fragment)
            produced = True
        return produced

    def _tool_fragment(self, position: int, fragment: dict[str, Any]) -> None:
        function = fragment.get("function")
        if not isinstance(function, dict):
            function = {}
        raw_id = fragment.get("id")
        call_id = raw_id if isinstance(raw_id, str) else ""
        raw_name = function.get("name")
        name = raw_name if isinstance(raw_name, str) else ""
        arguments = function.get("arguments")
        if isinstance(arguments, (dict, list)):
            arguments = json.dumps(arguments, ensure_ascii=False)
        elif not isinstance(arguments, str):
            arguments = ""
        index = int_or_none(fragment.get("index"))
        if index is None:
            index = self._index_without_index(position, call_id, name)
        call = self.calls.get(index)
        if call is None:
            call = ToolCall(index=index, id="", name="", arguments="")
            self.calls[index] = call
        if call_id and not call.id:
            call.id = call_id
        call.arguments += arguments
        if name and not call.name:
            call.name = name
            self.pieces.append(ToolCallPiece(call.index, name))

    def _index_without_index(self, position: int, call_id: str, name: str) -> int:
        if call_id:
            for existing in self.calls.values():
                if existing.id == call_id:
                    return existing.index
        if name or not self.calls:
            taken = max(self.calls, default=-1)
            return position if position > taken else taken + 1
        return max(self.calls)

    def take_pieces(self) -> list[StreamPiece]:
        """The pieces added since the last call."""
        pieces, self.pieces = self.pieces, []
        return pieces

    def completion(self, *, time_to_first_token: float | None, total_time: float) -> Completion:
        """The answer as assembled so far."""
        usage = self.usage or {}
        timings = self.timings or {}
        cached: int | None = None
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            cached = int_or_none(details.get("cached_tokens"))
        if cached is None:
            cached = int_or_none(timings.get("cache_n"))
        if cached is None:
            cached = self.ollama_cached
        prompt = int_or_none(usage.get("prompt_tokens"))
        if prompt is None:
            prompt_n = int_or_none(timings.get("prompt_n"))
            cache_n = int_or_none(timings.get("cache_n"))
            if prompt_n is not None:
                prompt = prompt_n + (cache_n or 0)
        generated = int_or_none(usage.get("completion_tokens"))
        if generated is None:
            generated = int_or_none(timings.get("predicted_n"))
        return Completion(
            text="".join(self.text),
            reasoning="".join(self.reasoning),
            tool_calls=[self.calls[i] for i in sorted(self.calls)],
            finish_reason=self.finish_reason,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=generated,
            usage=self.usage,
            timings=self.timings,
            time_to_first_token=time_to_first_token,
            total_time=total_time,
            model=self.model,
        )
