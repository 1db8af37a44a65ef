"""Every cache miss explained: what a request should have found cached on the server, and why it did not.

Where the server offers its chat template and tokenizer (llama.cpp's ``/apply-template`` and ``/tokenize``),
the tokens a request shares with the session's previous request are what Cachet expects the server to reuse.
A shortfall has one of three causes:

- *harness*: the request's bytes changed where no cause allows it (a bug; the byte check says "unexpected");
- *template*: the same messages, but the server's template rendered them differently than it did for the
  previous request (a template that drops earlier reasoning, say): the first such message and both
  renderings are kept;
- *server*: the same tokens, not reused (evicted, another session took the slot, a restart).

``classify`` is the pure judgement; ``check_request`` asks the server and calls it, after the answer, never
failing: a server that cannot be asked gives no check.
"""

from __future__ import annotations

import base64
import json
import logging
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chat.agent import server_api

logger = logging.getLogger(__name__)

HARNESS = "harness"
TEMPLATE = "template"
SERVER = "server"

# llama.cpp evaluates the last prompt token again when all of a prompt is cached.
REUSE_SLACK = 1
RENDERING_CHARS = 4000
CHECK_TIMEOUT = 5.0


@dataclass(frozen=True)
class Divergence:
    """Where two renderings of a request's shared messages part: the first message rendered differently."""

    message: int
    before: str
    after: str
    same_bytes: bool


@dataclass(frozen=True)
class CacheCheck:
    """A request's expected cache use and, where the server reused less, the class and the tokens lost."""

    expected_cached: int
    miss: str
    tokens_lost: int
    message: int | None = None
    before: str = ""
    after: str = ""


def shared_prefix(first: Sequence[Any], second: Sequence[Any]) -> int:
    """How many items, from the first, two sequences have in common (slices compared, not items one by one)."""
    low, high = 0, min(len(first), len(second))
    while low < high:
        middle = (low + high + 1) // 2
        if first[low:middle] == second[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _strings(message: Mapping[str, Any]) -> tuple[str, list[str]]:
    """A message's reasoning and, in the order templates write them, its content and calls' names and arguments."""
    reasoning = message.get("reasoning_content")
    main: list[str] = []
    content = message.get("content")
    parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
    for part in parts:  # a message with images: its text parts (an image is the template's marker)
        text = part.get("text") if isinstance(part, Mapping) and part.get("type") == "text" else None
        if isinstance(text, str) and text.strip():
            main.append(text.strip())
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            main.extend(str(function[key]) for key in ("name", "arguments") if str(function.get(key) or ""))
    return (reasoning.strip() if isinstance(reasoning, str) else ""), main


def message_ends(messages: Sequence[Mapping[str, Any]], text: str) -> list[int]:
    """Where each message's rendering ends in ``text``, as far as its own strings show: each message's
    content and calls are looked for in order after the previous message's, its reasoning before them; a
    message none of whose strings is found ends where the one before it did."""
    ends: list[int] = []
    cursor = 0
    for message in messages:
        reasoning, main = _strings(message)
        start = cursor
        end = cursor
        first_main: int | None = None
        for string in main:
            found = text.find(string, cursor)
            if found >= 0:
                first_main = found if first_main is None else first_main
                end = max(end, found + len(string))
                cursor = found + len(string)
        if reasoning:
            found = text.find(reasoning, start, len(text) if first_main is None else first_main)
            if found >= 0:
                end = max(end, found + len(reasoning))
                cursor = max(cursor, end)
        ends.append(end)
    return ends


def divergence(
    previous_messages: Sequence[Mapping[str, Any]],
    current_messages: Sequence[Mapping[str, Any]],
    previous_text: str,
    current_text: str,
    *,
    promised: int,
) -> tuple[Divergence, int] | None:
    """Where the renderings part inside the first ``promised`` messages (those the request should share with
    the one before), with the end of those messages in ``previous_text``; ``None`` where they do not."""
    promised = min(promised, len(previous_messages), len(current_messages))
    if promised <= 0:
        return None
    parted = shared_prefix(previous_text, current_text)
    previous_ends = message_ends(previous_messages[:promised], previous_text)
    promised_end = previous_ends[-1]
    if parted > promised_end:
        return None
    index = next(i for i, end in enumerate(previous_ends) if end >= parted)
    current_ends = message_ends(current_messages[:promised], current_text)
    previous_start = previous_ends[index - 1] if index else 0
    current_start = current_ends[index - 1] if index else 0
    same_bytes = shared_prefix(previous_messages[: index + 1], current_messages[: index + 1]) > index
    found = Divergence(
        message=index,
        before=previous_text[previous_start : max(previous_ends[index], parted + 1)][:RENDERING_CHARS],
        after=current_text[current_start : max(current_ends[index], parted + 1)][:RENDERING_CHARS],
        same_bytes=same_bytes,
    )
    return found, promised_end


def classify(
    *,
    expected_cached: int,
    reported_cached: int | None,
    harness_break: bool,
    parted: Divergence | None,
    promised_tokens: int | None,
) -> CacheCheck:
    """The class of a request's cache shortfall, from the tokens it shares with the previous request
    (``expected_cached``), what the server reported, whether its bytes broke where nothing allows it, and where
    the renderings of the messages it should share part (``parted``, ``promised_tokens`` of them before)."""
    reported = reported_cached if reported_cached is not None else expected_cached
    served = min(expected_cached, reported)
    if parted is not None and promised_tokens is not None and promised_tokens > expected_cached:
        miss = TEMPLATE if parted.same_bytes and not harness_break else HARNESS
        return CacheCheck(
            expected_cached=expected_cached,
            miss=miss,
            tokens_lost=promised_tokens - served,
            message=parted.message,
            before=parted.before,
            after=parted.after,
        )
    if harness_break:
        return CacheCheck(expected_cached=expected_cached, miss=HARNESS, tokens_lost=expected_cached - served)
    if reported + REUSE_SLACK < expected_cached:
        return CacheCheck(expected_cached=expected_cached, miss=SERVER, tokens_lost=expected_cached - reported)
    return CacheCheck(expected_cached=expected_cached, miss="", tokens_lost=0)


def _messages_and_tools(body: bytes) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        return None
    tools = request.get("tools")
    return request["messages"], tools if isinstance(tools, list) else []


def check_request(
    *,
    base_url: str,
    api_key: str | None,
    previous_body: bytes,
    body: bytes,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]],
    promised_messages: int,
    previous_messages: Sequence[dict[str, Any]] | None = None,
    previous_tools: Sequence[dict[str, Any]] = (),
    harness_break: bool,
    reported_cached: int | None,
) -> CacheCheck | None:
    """Ask the server how it renders this request and the previous one, and judge the cache use;
    ``None`` where there is no previous request or the server offers no template or tokenizer.
    ``previous_messages`` and ``previous_tools``: those of ``previous_body``, where the caller has them (else
    they are read from it)."""
    if not previous_body:
        return None
    try:
        # This request first: where the server renders nothing, the previous body (as large as this one) is
        # not parsed at all, in a thread that shares the interpreter with the reply and the relay.
        now = server_api.rendered_prompt(
            base_url, messages, tools=tools, body=body, api_key=api_key, timeout=CHECK_TIMEOUT
        )
        if now is None:
            return None
        if previous_messages is None:
            previous = _messages_and_tools(previous_body)
            if previous is None:
                return None
            previous_messages, previous_tools = previous
        before = server_api.rendered_prompt(
            base_url,
            previous_messages,
            tools=previous_tools,
            body=previous_body,
            api_key=api_key,
            timeout=CHECK_TIMEOUT,
        )
        if before is None:
            return None
        expected = shared_prefix(before.tokens, now.tokens)
        found = divergence(previous_messages, messages, before.text, now.text, promised=promised_messages)
        promised_tokens: int | None = None
        if found is not None:
            counted = server_api.tokenize(base_url, before.text[: found[1]], api_key=api_key, timeout=CHECK_TIMEOUT)
            promised_tokens = len(counted) if counted is not None else None
    except server_api.ServerAPIError as error:
        logger.info("no cache check for %s: %s", base_url, error)
        return None
    return classify(
        expected_cached=expected,
        reported_cached=reported_cached,
        harness_break=harness_break,
        parted=found[0] if found is not None else None,
        promised_tokens=promised_tokens,
    )


@dataclass(frozen=True)
class CheckSpec:
    """What the cache check of one request needs, as a queued job's arguments carry it (``as_json``): the request,
    the server, both bodies, the messages its bytes promised to share, and whether its break was unexpected.
    ``previous_known``: the previous body is one this process built (its messages parse as sent)."""

    request_id: int
    base_url: str
    previous_body: bytes
    body: bytes
    promised_messages: int
    harness_break: bool
    previous_known: bool = False
    bar: int = 0  # the request's bar on the chart, and the time to first token its line comes from
    previous_ttft: float | None = None

    def as_json(self) -> dict[str, Any]:
        """The spec as JSON, the bodies compressed (a long session's request is hundreds of kilobytes)."""
        return {
            "request_id": self.request_id,
            "base_url": self.base_url,
            "previous_body": _packed(self.previous_body),
            "body": _packed(self.body),
            "promised_messages": self.promised_messages,
            "harness_break": self.harness_break,
            "previous_known": self.previous_known,
            "bar": self.bar,
            "previous_ttft": self.previous_ttft,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckSpec:
        return cls(
            request_id=int(data["request_id"]),
            base_url=str(data["base_url"]),
            previous_body=_unpacked(str(data["previous_body"])),
            body=_unpacked(str(data["body"])),
            promised_messages=int(data["promised_messages"]),
            harness_break=bool(data["harness_break"]),
            previous_known=bool(data.get("previous_known", False)),
            bar=int(data.get("bar", 0)),
            previous_ttft=None if data.get("previous_ttft") is None else float(data["previous_ttft"]),
        )


def _packed(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 6)).decode("ascii")


def _unpacked(text: str) -> bytes:
    return zlib.decompress(base64.b64decode(text))


def spec_checked(spec: CheckSpec, *, api_key: str | None, reported_cached: int | None) -> CacheCheck | None:
    """Ask the server and judge the request of ``spec`` (synchronous: it waits on the server, and reads no
    store); ``None`` where there is nothing to say."""
    parsed = _messages_and_tools(spec.body)
    if parsed is None:
        return None
    messages, tools = parsed
    return check_request(
        base_url=spec.base_url,
        api_key=api_key,
        previous_body=spec.previous_body,
        body=spec.body,
        messages=messages,
        tools=tools,
        promised_messages=spec.promised_messages,
        harness_break=spec.harness_break,
        reported_cached=reported_cached,
    )


def _request_of(spec: CheckSpec) -> tuple[str | None, int | None] | None:
    """The endpoint's API key and the cached tokens the server reported, of the request of ``spec``."""
    from sessions_app.models import ModelRequest

    request = ModelRequest.objects.select_related("session__endpoint").filter(pk=spec.request_id).first()
    if request is None:
        return None
    return request.session.endpoint.api_key or None, request.cached_tokens


def spec_stored(spec: CheckSpec, check: CacheCheck) -> Any:
    """Store ``check`` on the request of ``spec``; the request as stored."""
    from sessions_app.models import ModelRequest
    from sessions_app.services.requests import request_record_cache_check

    return request_record_cache_check(
        request=ModelRequest.objects.get(pk=spec.request_id),
        expected_cached_tokens=check.expected_cached,
        miss=check.miss,
        tokens_lost=check.tokens_lost,
        message=check.message,
        before=check.before,
        after=check.after,
    )


async def run_check(spec: CheckSpec) -> Any:
    """Check the request of ``spec`` and store the check: the request as stored, or ``None`` where there was
    nothing to store. The server is asked off the event loop (asyncio's executor); the store is read and written
    on the caller's store thread. A check that fails is logged and fails nothing else."""
    from asgiref.sync import sync_to_async

    try:
        known = await sync_to_async(_request_of, thread_sensitive=True)(spec)
        if known is None:
            return None
        api_key, reported = known
        check = await sync_to_async(spec_checked, thread_sensitive=False)(
            spec, api_key=api_key, reported_cached=reported
        )
        if check is None:
            return None
        return await sync_to_async(spec_stored, thread_sensitive=True)(spec, check)
    except Exception:
        logger.exception("the cache check of request %s failed", spec.request_id)
        return None
