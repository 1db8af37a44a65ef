"""Builds the request a model is sent from the stored turns: the same rows always give the same bytes."""

from __future__ import annotations

import base64
import bisect
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from sessions_app import prompts
from sessions_app.models import (
    ChatSession,
    Generation,
    LastRequest,
    ModelRequest,
    RequestStatus,
    Result,
    Step,
    Turn,
    Upload,
)
from sessions_app.selectors.sessions import current_generation, history_turns
from sessions_app.selectors.turns import turns_reasoning
from sessions_app.types import PendingBreak


def dumps(value: object) -> str:
    """The one JSON serialization of everything sent: key order as built, no spaces, UTF-8 as is."""
    return _ENCODER.encode(value)


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # made once, not per message


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

    def messages_within(self, size: int) -> int:
        """How many messages, from the first, end within the first ``size`` bytes (a binary search: a long
        session's request holds thousands)."""
        offsets = self.message_offsets
        whole = bisect.bisect_right(offsets, size + 1, 1) - 1  # message i ends at offsets[i + 1] - 1
        if whole == len(offsets) - 1 and self.message_end(whole) <= size:
            whole += 1
        return whole


IMAGE_URL = re.compile(rb'"url":"data:image/[a-z0-9.+-]+;base64,[A-Za-z0-9+/=]*"')
"""An image part's data in a request body: JSON escapes any quote inside a string, so only a part matches."""


def image_spans(body: bytes) -> list[tuple[int, int]]:
    """Where the images' data lies in a request ``body``: the byte range of each image part's URL."""
    return [match.span() for match in IMAGE_URL.finditer(body)]


@dataclass(frozen=True)
class SentImage:
    """An image that went with a message: its path in the workspace, and its ``data:`` URL as it is sent."""

    path: str
    url: str


def turns_images(turns: Sequence[tuple[int, int]], *, generation: Generation) -> dict[int, list[SentImage]]:
    """The images that went with the messages of ``turns`` (pk, number), by turn pk: those of a turn whose message
    was composed for a model that reads images (the turn's generation's; a resumed turn's, ``generation``'s)."""
    if not turns:
        return {}
    numbers = dict(turns)
    rows = Upload.objects.filter(turn_id__in=numbers, image__isnull=False).order_by("id")
    found: dict[int, list[SentImage]] = {}
    for turn_id, path, media_type, data, composed_reading in rows.values_list(
        "turn_id", "path", "image_type", "image", "turn__generation__reads_images"
    ):
        shown = generation.reads_images if numbers[turn_id] == generation.resumed_turn else composed_reading
        if shown and data is not None:
            url = f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"
            found.setdefault(turn_id, []).append(SentImage(path, url))
    return found


def user_message(text: str, images: Sequence[SentImage], *, reads_images: bool, withheld: str) -> dict[str, Any]:
    """A person's message as a request carries it: its text, and the images that went with it as image parts
    (where the model does not read images, each a line that says it went with the message: ``withheld``)."""
    if not images:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    for image in images:
        if reads_images:
            parts.append({"type": "image_url", "image_url": {"url": image.url}})
        else:
            parts.append({"type": "text", "text": withheld.format(path=image.path)})
    return {"role": "user", "content": parts}


def assistant_message(step: Step) -> dict[str, Any]:
    """A step's own message: its text, its reasoning as the server sent it, its calls as generated."""
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
    return assistant


def earlier_reply(reply_text: str, reasoning: str) -> dict[str, Any]:
    """An earlier turn's reply as one assistant message: its text, and its steps' reasoning where any, so that
    the chat template, not Cachet, decides what of it the model sees (spec §8)."""
    reply: dict[str, Any] = {"role": "assistant", "content": reply_text}
    if reasoning:
        reply["reasoning_content"] = reasoning
    return reply


def tool_message(result: Result) -> dict[str, Any]:
    """A result as the request carries it, answering its call."""
    return {"role": "tool", "tool_call_id": result.call_id, "content": result.inserted_text}


def step_messages(step: Step, results: Iterable[Result]) -> list[dict[str, Any]]:
    """A step as the request carries it: the assistant message with its calls, then one tool message each."""
    by_call = {result.call_id: result for result in results}
    answered = [by_call[call["id"]] for call in step.tool_calls if call["id"] in by_call]
    return [assistant_message(step), *(tool_message(result) for result in answered)]


class RequestBuilder:
    """The requests of one reply: the history is read from the store once, then each stored step is
    added as the reply goes on, so a step costs no reading of what came before it.

    ``build()`` gives the same bytes as a builder made afresh from the store at that moment.

    A turn's message is sent as stored (``Turn.message``, its note included), with one exception: the turn a
    generation resumed after a compaction inside its reply is sent, in that generation, as the generation's
    ``resumed_message``, its words with the full note composed when the compaction made the generation. Both are
    stored and neither ever changes: the requests before the compaction sent the turn's own message and a
    rebuild of them still does; every request of the new generation (the rest of that reply, later turns)
    sends the resumed one. The compaction is the declared break between the two.
    """

    def __init__(
        self, session: ChatSession, *, model_name: str, current: Turn | None, upto_step: int | None = None
    ) -> None:
        """``upto_step``: the current turn's steps up to that one only (0: its message alone; -1: not even that)."""
        generation = current_generation(session)
        self.generation: Generation = generation
        self.tools: list[dict[str, Any]] = json.loads(generation.tools_json)
        self.head = (
            '{"model":'
            + dumps(model_name)
            + ',"stream":true,"stream_options":{"include_usage":true}'
            + (',"tools":' + dumps(self.tools) if self.tools else "")
            + ',"messages":['
        ).encode()
        self.messages: list[dict[str, Any]] = []
        self.encoded: list[bytes] = []
        self.offsets: list[int] = []
        self.size = len(self.head)
        self.turn_user_index: dict[int, int] = {}
        self._add({"role": "system", "content": generation.system_prompt})
        turns = history_turns(session, generation=generation)
        if current is not None:
            turns = turns.filter(number__lt=current.number)
        earlier = list(turns.values_list("pk", "number", "message", "reply_text"))
        reasoning = turns_reasoning(turns) if earlier else {}
        sent_with = [(pk, number) for pk, number, _, _ in earlier]
        if current is not None:
            sent_with.append((current.pk, current.number))
        self.images = turns_images(sent_with, generation=generation)
        self.withheld: str = prompts.rules_config().note["image_withheld"] if self.images else ""
        for pk, number, message, reply_text in earlier:
            self.turn_user_index[number] = len(self.messages)
            self._add(self._user(pk, number, message))
            self._add(earlier_reply(reply_text, reasoning.get(pk, "")))
        if current is not None and (upto_step is None or upto_step >= 0):
            self.turn_user_index[current.number] = len(self.messages)
            self._add(self._user(current.pk, current.number, current.message))
            steps = current.steps.order_by("number")
            if generation.resumes_after_step is not None and generation.covers_through_turn == current.number:
                steps = steps.filter(number__gt=generation.resumes_after_step)
            if upto_step is not None:
                steps = steps.filter(number__lte=upto_step)
            results = list(current.results.filter(step__in=steps).order_by("number"))
            for step in steps:
                self.add_step(step, [result for result in results if result.step_id == step.pk])

    def open(self, turn: Turn) -> None:
        """Go on with ``turn``, started after the history this builder holds (made with ``current`` None): its
        message, as a builder made afresh for it would read it."""
        if self.turn_user_index and turn.number <= max(self.turn_user_index):
            raise ValueError(f"turn {turn.number} does not follow the history this builder holds")
        self.turn_user_index[turn.number] = len(self.messages)
        images = turns_images([(turn.pk, turn.number)], generation=self.generation)
        if images and not self.withheld:
            self.withheld = prompts.rules_config().note["image_withheld"]
        self.images.update(images)
        self._add(self._user(turn.pk, turn.number, turn.message))

    def _user(self, pk: int, number: int, message: str) -> dict[str, Any]:
        """Turn ``number``'s stored ``message`` as this generation sends it (see the class), with its images."""
        text = self.generation.resumed_message if number == self.generation.resumed_turn else message
        images = self.images.get(pk, ())
        return user_message(text, images, reads_images=self.generation.reads_images, withheld=self.withheld)

    def _add(self, message: dict[str, Any]) -> None:
        encoded = (("," if self.messages else "") + dumps(message)).encode()
        self.offsets.append(self.size + (1 if self.messages else 0))
        self.messages.append(message)
        self.encoded.append(encoded)
        self.size += len(encoded)

    def add_step(self, step: Step, results: Sequence[Result]) -> None:
        """The stored ``step`` and the results of its calls, after everything added so far."""
        for message in step_messages(step, results):
            self._add(message)

    def add_assistant(self, step: Step) -> None:
        """The stored ``step``'s own message; its results follow as they are stored."""
        self._add(assistant_message(step))

    def add_result(self, result: Result) -> None:
        self._add(tool_message(result))

    def build(self, *, extra_user: str | None = None) -> BuiltRequest:
        """The request as it stands; ``extra_user`` appends one more user message (the compaction task)."""
        messages, encoded, offsets = self.messages, self.encoded, self.offsets
        if extra_user is not None:
            extra = {"role": "user", "content": extra_user}
            messages = [*messages, extra]
            encoded = [*encoded, ("," + dumps(extra)).encode()]
            offsets = [*offsets, self.size + 1]
        return BuiltRequest(
            body=b"".join([self.head, *encoded, b"]}"]),
            messages=list(messages),
            tools=self.tools,
            message_offsets=list(offsets),
            turn_user_index=dict(self.turn_user_index),
            generation_number=self.generation.number,
        )


def build_request(
    session: ChatSession,
    *,
    current: Turn | None,
    model_name: str,
    extra_user: str | None = None,
) -> BuiltRequest:
    """The request for the next step of ``current`` (or, with ``current`` None, the next turn's history),
    read whole from the store."""
    return RequestBuilder(session, model_name=model_name, current=current).build(extra_user=extra_user)


@dataclass(frozen=True)
class PreviousRequest:
    """What the next request is compared with: the last request's bytes and turn, and what happened since;
    ``known`` is false where a request was sent whose bytes were not kept (Cachet stopped in the middle of an
    action)."""

    body: bytes
    turn_number: int | None
    pending: tuple[PendingBreak, ...]
    known: bool = True


def pending_breaks(session: ChatSession) -> tuple[PendingBreak, ...]:
    """What happened since the session's last request that lets the next one share less of it."""
    pending = ChatSession.objects.filter(pk=session.pk).values_list("pending_breaks", flat=True).get()
    return tuple(pending or ())


def previous_request(session: ChatSession) -> PreviousRequest:
    """The session's last request as kept, with the breaks recorded since (read once per action). The bytes are
    kept as an action ends; where the session's last recorded request is not the one kept, they are unknown."""
    last = LastRequest.objects.filter(session_id=session.pk).first()
    body = bytes(last.body) if last is not None else b""
    sent = (
        ModelRequest.objects.filter(session_id=session.pk).order_by("-id").values_list("body_sha256", flat=True).first()
    )
    known = sent is None or (last is not None and hashlib.sha256(body).hexdigest() == sent)
    return PreviousRequest(
        body=body if known else b"",
        turn_number=last.turn_number if last is not None and known else None,
        pending=pending_breaks(session),
        known=known,
    )


def finished_requests(*, session: ChatSession) -> QuerySet[ModelRequest]:
    """The session's requests that are no longer being sent: the bars of its chart."""
    return ModelRequest.objects.filter(session=session).exclude(status=RequestStatus.SENDING)


def last_time_to_first_token(requests: QuerySet[ModelRequest]) -> float | None:
    """The time to first token of the newest of ``requests`` that has one: where the chart's line goes on from."""
    newest = requests.exclude(time_to_first_token=None).order_by("-id")
    return newest.values_list("time_to_first_token", flat=True).first()
