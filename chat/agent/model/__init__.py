"""The client of OpenAI-compatible ``/v1/chat/completions`` servers, one job per module:

- ``errors``: the ``ModelError`` family and the wording of failures;
- ``sse``: decoding an event stream;
- ``assembly``: folding a stream's chunks into pieces and the whole answer (``Completion``);
- ``transport``: the HTTP clients;
- ``cancel``: stopping a request from any thread (``Cancel``);
- ``stream``: ``ModelStream``, its deadlines and its failures; ``HttpModel``;
- ``listing``: the models a server lists.
"""

from __future__ import annotations

from chat.agent.model.assembly import (
    Completion,
    ReasoningPiece,
    StreamAssembler,
    StreamPiece,
    TextPiece,
    ToolCall,
    ToolCallPiece,
)
from chat.agent.model.cancel import Cancel
from chat.agent.model.errors import (
    ModelCancelled,
    ModelContextExceeded,
    ModelError,
    ModelHTTPError,
    ModelProtocolError,
    ModelStreamCut,
    ModelTimeout,
    ModelUnavailable,
    context_exceeded,
    failure_reason,
)
from chat.agent.model.listing import list_models
from chat.agent.model.sse import SSEDecoder, SSEEvent
from chat.agent.model.stream import Answer, HttpModel, Model, ModelStream, Timeouts, stream_chat
from chat.agent.model.transport import ModelClient, new_client

__all__ = [
    "Answer",
    "Cancel",
    "Completion",
    "HttpModel",
    "Model",
    "ModelCancelled",
    "ModelClient",
    "ModelContextExceeded",
    "ModelError",
    "ModelHTTPError",
    "ModelProtocolError",
    "ModelStream",
    "ModelStreamCut",
    "ModelTimeout",
    "ModelUnavailable",
    "ReasoningPiece",
    "SSEDecoder",
    "SSEEvent",
    "StreamAssembler",
    "StreamPiece",
    "TextPiece",
    "Timeouts",
    "ToolCall",
    "ToolCallPiece",
    "context_exceeded",
    "failure_reason",
    "list_models",
    "new_client",
    "stream_chat",
]
