"""A session's sampling settings in the request: after everything else, as ``id_slot`` is, so the bytes that
hold the conversation (the prefix the server caches and Cachet compares) never change when they do."""

from __future__ import annotations

import json

from sessions_app.models import ChatSession, RequestKind

TITLE_MAX_TOKENS = 48  # a title's request: a few words, and room for a model that says a little more


def sampled_body(body: bytes, session: ChatSession, *, kind: str) -> bytes:
    """``body`` with the session's ``temperature`` and ``max_tokens``, where set. A compaction's summary request
    keeps the server's defaults: a reply's length limit must not cut the summary; a title's is short."""
    if kind == RequestKind.TITLE:
        return _with(body, b',"max_tokens":%d' % TITLE_MAX_TOKENS)
    if kind != RequestKind.REPLY:
        return body
    extra = b""
    if session.temperature is not None:
        extra += b',"temperature":' + json.dumps(session.temperature).encode()
    if session.max_tokens is not None:
        extra += b',"max_tokens":%d' % session.max_tokens
    return _with(body, extra)


def _with(body: bytes, extra: bytes) -> bytes:
    if not extra:
        return body
    assert body.endswith(b"}"), "a request body is a JSON object"
    return body[:-1] + extra + b"}"
