from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpx

from chat.agent.model import Completion, ModelClient, ModelStream, StreamPiece

SYSTEM = "You are Cachet's test model. Answer briefly and keep to the point. " * 12


def chat_body(messages: list[dict[str, Any]], **extra: Any) -> bytes:
    body = {
        "model": "scripted",
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    return json.dumps(body, ensure_ascii=False).encode()


def first_turn(user: str = "Hello") -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def sse(*chunks: dict[str, Any] | str, newline: str = "\n") -> bytes:
    """An event stream body: dicts become `data: JSON` events, strings are sent as `data: STRING`."""
    out = []
    for chunk in chunks:
        data = chunk if isinstance(chunk, str) else json.dumps(chunk)
        out.append(f"data: {data}{newline}{newline}")
    return "".join(out).encode()


def delta_chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra}


def mock_client(
    body_parts: Iterable[bytes],
    *,
    status: int = 200,
    content_type: str = "text/event-stream",
    seen: list[httpx.Request] | None = None,
) -> ModelClient:
    """A client whose every request gets `body_parts` streamed back, one part per read."""
    parts = list(body_parts)

    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            request.read()
            seen.append(request)

        async def stream() -> AsyncIterator[bytes]:
            for part in parts:
                yield part

        return httpx.Response(status, headers={"Content-Type": content_type}, content=stream())

    return ModelClient(httpx.AsyncClient(transport=httpx.MockTransport(handler)))


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


async def collect(stream: ModelStream) -> tuple[Completion, list[StreamPiece]]:
    """Iterate a model stream to its end: its completion, and the pieces it yielded."""
    pieces = [piece async for piece in stream]
    assert stream.completion is not None
    return stream.completion, pieces
