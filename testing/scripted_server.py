"""A scripted OpenAI-compatible model server on loopback, for tests and manual runs.

Each `POST /v1/chat/completions` takes the next `Step` of the script and answers it, streamed
the way llama-server streams (or as one JSON object when the request has `"stream": false`).
`GET /v1/models` lists the one model (or the ones given as `listed`). When the script is used up the server answers the
`when_empty` step, by default the plain text `(script empty)`, so a loop that asks once more
than a test scripted still ends; tests that want to be strict pass
`when_empty=Step(fault="http500", text="script exhausted")` or check `.requests`.

Prompt caching is imitated: the request's messages and tools are rendered with a ChatML-like
template and split into crude tokens (words with their leading space, punctuation, runs of
blanks); `cached_tokens` is the longest token prefix shared with any earlier processed request,
at most the prompt's length minus one (as llama-server always evaluates the last token again).

A small context, as llama.cpp has one: `ScriptedServer(n_ctx=N)` refuses a request whose prompt takes N tokens
or more with llama.cpp's HTTP 400 (`exceed_context_size_error`, with `n_prompt_tokens` and `n_ctx`), and answers
what llama.cpp offers beside the OpenAI API: `GET /props` (`default_generation_settings.n_ctx`), `POST
/apply-template` (the ChatML-like prompt above) and `POST /tokenize` (the crude tokens, each as a stable
number; no BOS is added, so a prompt's count equals the `prompt_tokens` it is billed). `server_api=False` keeps
the window but offers none of the three, like a server that says nothing about itself; `server_api_delay`
makes `/apply-template` and `/tokenize` take that many seconds, as they do on a long prompt, and
`server_api_held` (a `threading.Event`) holds their answers until it is set: a test sets it once it has seen
what must happen while they run (`wait_requests(N)`: the Nth chat request has come).

Images: `vision=True` (`--vision`) says in `/props` `modalities` that the model reads images, as llama.cpp started
with a vision projector does; without it, a request with an image part is refused as llama.cpp refuses it (HTTP
500, `image input is not supported`).

`like` states the window as another server does, in its own place, instead of `/props` (and then offers no
`/apply-template` or `/tokenize`): `vllm` and `sglang` (`max_model_len` in `/v1/models`), `ollama` (a running
model's `context_length` in `/api/ps`; `ollama-idle`: none running, `num_ctx` in `/api/show`'s `parameters`),
`lmstudio` (`/api/v1/models`, a loaded instance's `config.context_length`; `lmstudio-0.3`: `/api/v0/models`,
`loaded_context_length`), or `openai` (nowhere; a trained length beside it, as some list, which is not the window).

Faults: `refuse` (read the request, close without answering), `reset` (read only the request's head, then
reset the connection: a request still being written fails to get out; it is not recorded), `http500` (a
llama-server-style JSON error; the step's text is its message), `malformed` (a `data: {not json` event mid-stream),
`cut` (some text, then the connection closes without `[DONE]`), `stall` (the role delta, then
silence until the server closes or 60 s pass), `keepalive` (like `stall`, but an SSE comment every
`delay` seconds, 0.1 s at least) and `garbage` (200 with an HTML body). A step's text holding a lone
surrogate (`"\\ud83d"`) goes out as a JSON escape, as from a server that splits a character between events.

A streamed step with `pause_at` positions (`(N, …)`) stops after its first N deltas, and at each further
position, until `resume()` is called once for that pause: a test sees the answer in the middle however fast
or slow the machine is.

Run `python -m testing.scripted_server --port 8080 --script FILE.json` to serve a JSON list
of step objects (`{"text": ..., "reasoning": ..., "tool_calls": [[name, args], ...], "fault": ...,
"chunk_size": ..., "delay": ..., "pause_at": ...}`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from chat.agent import server_api

FAULTS = frozenset({"refuse", "reset", "http500", "malformed", "cut", "stall", "keepalive", "garbage"})
STALL_SECONDS = 60.0
_TOKEN = re.compile(r"<\|im_(?:start|end)\|>|\s?\w+|\s?[^\w\s]|\s+")


@dataclass
class Step:
    """One scripted answer."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    fault: str | None = None
    chunk_size: int = 3
    delay: float = 0.0
    pause_at: tuple[int, ...] = ()
    finish_reason: str | None = None  # what the answer ends with; by default "tool_calls" or "stop"

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; known: {', '.join(sorted(FAULTS))}")
        if self.chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Step:
        """A step from its JSON form; a tool call is `[name, args]` or `{"name", "arguments"}`."""
        calls: list[tuple[str, dict[str, Any] | str]] = []
        for call in data.get("tool_calls", []):
            if isinstance(call, Mapping):
                calls.append((str(call["name"]), call.get("arguments", {})))
            else:
                name, arguments = call
                calls.append((str(name), arguments))
        return cls(
            text=str(data.get("text", "")),
            reasoning=str(data.get("reasoning", "")),
            tool_calls=calls,
            fault=data.get("fault"),
            chunk_size=int(data.get("chunk_size", 3)),
            delay=float(data.get("delay", 0.0)),
            pause_at=tuple(int(position) for position in data.get("pause_at", ())),
            finish_reason=data.get("finish_reason"),
        )


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def render_prompt(request: Mapping[str, Any]) -> str:
    """The request's messages and tools as one ChatML-like prompt string."""
    messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    tools = request.get("tools") or []
    out: list[str] = []
    first_is_system = bool(messages) and messages[0].get("role") == "system"
    if first_is_system or tools:
        system = _content_text(messages[0].get("content")) if first_is_system else ""
        if tools:
            listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
            system += f"\n\n# Tools\n<tools>\n{listed}\n</tools>"
        out.append(f"<|im_start|>system\n{system}<|im_end|>\n")
    for position, message in enumerate(messages):
        role = str(message.get("role", ""))
        if position == 0 and first_is_system:
            continue
        body = _content_text(message.get("content"))
        if role == "assistant":
            reasoning = message.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                body = f"<think>\n{reasoning}\n</think>\n{body}"
            for call in message.get("tool_calls") or []:
                function = call.get("function", {}) if isinstance(call, dict) else {}
                shown = {"name": function.get("name"), "arguments": function.get("arguments")}
                body += f"\n<tool_call>\n{json.dumps(shown, ensure_ascii=False)}\n</tool_call>"
        elif role == "tool":
            role, body = "user", f"<tool_response>\n{body}\n</tool_response>"
        out.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


def _json_bytes(data: object) -> bytes:
    """UTF-8 JSON as llama-server writes it; with ASCII escapes where a lone surrogate cannot be UTF-8."""
    try:
        return json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(data).encode()


def tokenize(text: str) -> list[str]:
    """Crude deterministic tokens; joined they give `text` back."""
    return _TOKEN.findall(text)


def token_id(token: str) -> int:
    """The number `/tokenize` gives a crude token: stable across runs and servers."""
    return zlib.crc32(token.encode("utf-8", "surrogatepass")) & 0xFFFFFF


NO_VISION = "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"
"""What llama.cpp answers (HTTP 500) to an image sent to a server started without a vision projector."""


def _has_image(request: dict[str, Any]) -> bool:
    messages = request.get("messages")
    return isinstance(messages, list) and any(
        isinstance(part, dict) and part.get("type") == "image_url"
        for message in messages
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for part in message["content"]
    )


def exceeds_context(n_prompt_tokens: int, n_ctx: int) -> dict[str, Any]:
    """llama.cpp's answer to a prompt that does not fit its context (HTTP 400), as its server writes it."""
    message = (
        f"request ({n_prompt_tokens} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it"
    )
    return {
        "error": {
            "code": 400,
            "message": message,
            "type": "exceed_context_size_error",
            "n_prompt_tokens": n_prompt_tokens,
            "n_ctx": n_ctx,
        }
    }


def _shared_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 256  # a hundred replies connect at once; the default backlog of 5 makes some wait 1 s

    def __init__(self, address: tuple[str, int], owner: ScriptedServer) -> None:
        self.owner = owner
        super().__init__(address, _Handler)


class _Closed(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # each event goes out when written, as a streaming server sends it
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        self.server.owner._track(self.connection, add=False)
        with contextlib.suppress(OSError):
            super().finish()

    @property
    def _owner(self) -> ScriptedServer:
        return self.server.owner

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/")

    def _send_json(self, status: int, data: object, *, content_type: str = "application/json") -> None:
        payload = json.dumps(data).encode() if not isinstance(data, bytes) else data
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _error(self, status: int, message: str, kind: str) -> None:
        self._send_json(status, {"error": {"code": status, "message": message, "type": kind}})

    def do_GET(self) -> None:
        path = self._path()
        owner = self._owner
        stated = owner.n_ctx if owner.n_ctx is not None else 0
        if path in ("/v1/models", "/models"):
            models: list[dict[str, Any]] = [
                {"id": name, "object": "model", "created": 0, "owned_by": owner.like} for name in owner.listed
            ]
            for entry in models:
                if owner.like in ("vllm", "sglang") and stated:
                    entry.update(root=entry["id"], max_model_len=stated)
                elif owner.like == "openai":
                    entry["meta"] = {"n_ctx_train": 131072}  # the trained length, not the window
            self._send_json(200, {"object": "list", "data": models})
        elif path == "/api/ps" and owner.like.startswith("ollama"):
            running = [] if owner.like == "ollama-idle" else owner.listed
            self._send_json(200, {"models": [{"name": n, "model": n, "context_length": stated} for n in running]})
        elif path == "/api/v1/models" and owner.like == "lmstudio":
            instances = [{"id": owner.model, "config": {"context_length": stated}}]
            listed = [
                {"type": "llm", "key": n, "max_context_length": 131072, "loaded_instances": instances}
                for n in owner.listed
            ]
            self._send_json(200, {"models": listed})
        elif path == "/api/v0/models" and owner.like == "lmstudio-0.3":
            listed = [
                {"id": n, "state": "loaded", "max_context_length": 131072, "loaded_context_length": stated}
                for n in owner.listed
            ]
            self._send_json(200, {"object": "list", "data": listed})
        elif path in ("/health", "/v1/health"):
            self._send_json(200, {"status": "ok"})
        elif path == "/props" and self._owner.server_api:
            settings = {"n_ctx": self._owner.n_ctx or 0, "params": {"n_predict": -1}}
            modalities = {"vision": self._owner.vision, "video": self._owner.vision, "audio": False}
            props = {"default_generation_settings": settings, "total_slots": 1, "chat_template": ""}
            self._send_json(200, {**props, "modalities": modalities})
        else:
            self._error(404, f"File Not Found: {path}", "not_found_error")

    def do_POST(self) -> None:
        path = self._path()
        owner = self._owner
        if path in ("/v1/chat/completions", "/chat/completions") and owner._take_reset():
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path in ("/tokenize", "/apply-template") and owner.server_api:
            self._server_api(path, raw)
            return
        if path == "/api/show" and owner.like.startswith("ollama"):
            parameters = f'num_ctx {owner.n_ctx}\nstop "<|im_end|>"' if owner.n_ctx else 'stop "<|im_end|>"'
            self._send_json(200, {"parameters": parameters, "model_info": {"qwen3.context_length": 131072}})
            return
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"File Not Found: {path}", "not_found_error")
            return
        number = owner._record(raw)
        try:
            request = json.loads(raw)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError:
            self._error(400, "Failed to parse the request body as JSON", "invalid_request_error")
            return
        if not owner.vision and _has_image(request):
            self._error(500, NO_VISION, "server_error")
            return
        prompt = tokenize(render_prompt(request))
        if owner.n_ctx is not None and len(prompt) >= owner.n_ctx:
            self._send_json(400, exceeds_context(len(prompt), owner.n_ctx))
            return
        step = owner._next_step()
        if step.fault == "refuse":
            self.close_connection = True
            return
        if step.fault == "http500":
            self._error(500, step.text or "scripted server error", "server_error")
            return
        if step.fault == "garbage":
            page = b"<html><head><title>502 Bad Gateway</title></head><body>Bad Gateway</body></html>"
            self._send_json(200, page, content_type="text/html")
            return
        cached = owner._cache(prompt)
        answer = _Answer(step, number, owner.model, len(prompt), cached)
        try:
            if request.get("stream"):
                self._stream(answer)
            else:
                self._whole(answer)
        except (_Closed, OSError):
            self.close_connection = True

    def _server_api(self, path: str, raw: bytes) -> None:
        try:
            request = json.loads(raw)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError:
            self._error(400, "Failed to parse the request body as JSON", "invalid_request_error")
            return
        try:
            self._wait(self._owner.server_api_delay)
            self._held(self._owner.server_api_held)
        except _Closed:
            self.close_connection = True
            return
        if path == "/apply-template":
            self._send_json(200, {"prompt": render_prompt(request)})
        else:
            content = request.get("content")
            text = content if isinstance(content, str) else ""
            self._send_json(200, {"tokens": [token_id(token) for token in tokenize(text)]})

    def _wait(self, seconds: float) -> None:
        if seconds > 0 and self._owner._closing.wait(seconds):
            raise _Closed

    def _held(self, gate: threading.Event | None) -> None:
        while gate is not None and not gate.wait(0.05):
            if self._owner._closing.is_set():
                raise _Closed

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _event(self, data: object) -> None:
        self._chunk(b"data: " + _json_bytes(data) + b"\n\n")

    def _stream(self, answer: _Answer) -> None:
        step = answer.step
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._event(answer.chunk({"role": "assistant", "content": None}))
        deltas = list(answer.deltas())
        if step.fault == "malformed" and not deltas:
            self._chunk(b"data: {not json\n\n")
        if step.fault in ("stall", "keepalive"):
            deadline = time.monotonic() + STALL_SECONDS
            while time.monotonic() < deadline:
                if step.fault == "keepalive":
                    self._chunk(b": keep-alive\n\n")
                self._wait(min(max(step.delay, 0.1), max(deadline - time.monotonic(), 0.0)))
            raise _Closed
        cut_at = max(1, len(deltas) // 2) if step.fault == "cut" else None
        for position, delta in enumerate(deltas):
            if position == cut_at:
                raise _Closed
            if position in step.pause_at:
                self._owner._pause()
            self._wait(step.delay)
            self._event(answer.chunk(delta))
            if step.fault == "malformed" and position == 0:
                self._chunk(b"data: {not json\n\n")
        if cut_at is not None:
            raise _Closed
        self._wait(step.delay)
        self._event(answer.chunk({}, finish_reason=answer.finish_reason))
        self._event(answer.usage_chunk())
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _whole(self, answer: _Answer) -> None:
        step = answer.step
        if step.fault in ("stall", "keepalive"):
            self._wait(STALL_SECONDS)
            raise _Closed
        payload = _json_bytes(answer.whole())
        if step.fault == "malformed":
            payload = b"{not json"
        self._wait(step.delay)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if step.fault == "cut":
            self.wfile.write(payload[: len(payload) // 2])
            raise _Closed
        self.wfile.write(payload)


@dataclass
class _Answer:
    step: Step
    number: int
    model: str
    prompt_tokens: int
    cached_tokens: int

    @property
    def finish_reason(self) -> str:
        if self.step.finish_reason is not None:
            return self.step.finish_reason
        return "tool_calls" if self.step.tool_calls else "stop"

    def arguments(self) -> list[tuple[str, str]]:
        return [
            (name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
            for name, args in self.step.tool_calls
        ]

    def call_id(self, index: int) -> str:
        return f"call_{self.number}_{index}"

    def deltas(self) -> Iterator[dict[str, Any]]:
        size = self.step.chunk_size
        for piece in _pieces(self.step.reasoning, size):
            yield {"reasoning_content": piece}
        for piece in _pieces(self.step.text, size):
            yield {"content": piece}
        for index, (name, arguments) in enumerate(self.arguments()):
            head = {"index": index, "id": self.call_id(index), "type": "function"}
            yield {"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]}
            for piece in _pieces(arguments, size):
                yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}

    def chunk(self, delta: dict[str, Any], *, finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "choices": [{"finish_reason": finish_reason, "index": 0, "delta": delta}],
            "created": int(time.time()),
            "id": f"chatcmpl-scripted-{self.number}",
            "model": self.model,
            "system_fingerprint": "scripted",
            "object": "chat.completion.chunk",
        }

    def completion_tokens(self) -> int:
        generated = self.step.reasoning + self.step.text + "".join(a for _, a in self.arguments())
        return max(1, len(tokenize(generated)))

    def usage(self) -> dict[str, Any]:
        completion = self.completion_tokens()
        return {
            "completion_tokens": completion,
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def timings(self) -> dict[str, Any]:
        prompt_n = self.prompt_tokens - self.cached_tokens
        predicted_n = self.completion_tokens()
        prompt_ms = prompt_n * 0.25
        predicted_ms = predicted_n * 2.0
        return {
            "cache_n": self.cached_tokens,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n,
            "predicted_per_second": 1000.0 * predicted_n / predicted_ms,
        }

    def usage_chunk(self) -> dict[str, Any]:
        chunk = self.chunk({})
        chunk["choices"] = []
        chunk["usage"] = self.usage()
        chunk["timings"] = self.timings()
        return chunk

    def whole(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.step.text}
        if self.step.reasoning:
            message["reasoning_content"] = self.step.reasoning
        if self.step.tool_calls:
            message["tool_calls"] = [
                {"id": self.call_id(i), "type": "function", "function": {"name": name, "arguments": args}}
                for i, (name, args) in enumerate(self.arguments())
            ]
        return {
            "choices": [{"finish_reason": self.finish_reason, "index": 0, "message": message}],
            "created": int(time.time()),
            "id": f"chatcmpl-scripted-{self.number}",
            "model": self.model,
            "system_fingerprint": "scripted",
            "object": "chat.completion",
            "usage": self.usage(),
            "timings": self.timings(),
        }


LIKE = ("llama.cpp", "vllm", "sglang", "ollama", "ollama-idle", "lmstudio", "lmstudio-0.3", "openai")


class ScriptedServer:
    """The scripted server, running in a background thread while used as a context manager."""

    def __init__(
        self,
        script: Iterable[Step] | None = None,
        *,
        model: str = "scripted",
        host: str = "127.0.0.1",
        port: int = 0,
        when_empty: Step | None = None,
        listed: Sequence[str] | None = None,
        n_ctx: int | None = None,
        server_api: bool | None = None,
        server_api_delay: float = 0.0,
        server_api_held: threading.Event | None = None,
        like: str = "llama.cpp",
        vision: bool = False,
    ) -> None:
        if like not in LIKE:
            raise ValueError(f"unknown server {like!r}; known: {', '.join(LIKE)}")
        self.model = model
        self.n_ctx = n_ctx
        self.vision = vision  # reads images, as llama.cpp with a vision projector: else refuses them as it does
        self.like = like
        self.server_api_delay = server_api_delay
        self.server_api_held = server_api_held
        self.server_api = (n_ctx is not None and like == "llama.cpp") if server_api is None else server_api
        self.listed = list(listed) if listed is not None else [model]
        self._host = host
        self.when_empty = when_empty or Step(text="(script empty)")
        self._script: deque[Step] = deque(script or [])
        self._requests: list[bytes] = []
        self._history: list[list[str]] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._resumes = threading.Semaphore(0)
        self._pauses = 0
        self._paused = threading.Condition(self._lock)
        self._requested = threading.Condition(self._lock)
        self._connections: set[socket.socket] = set()
        self._httpd = _HTTPServer((host, port), self)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}/v1"

    @property
    def requests(self) -> list[bytes]:
        """The raw bodies of the chat requests received so far, in order."""
        with self._lock:
            return list(self._requests)

    @property
    def remaining(self) -> int:
        """How many scripted steps are still unused."""
        with self._lock:
            return len(self._script)

    def push(self, *steps: Step) -> None:
        """Append steps to the script."""
        with self._lock:
            self._script.extend(steps)

    def wait_paused(self, count: int = 1, timeout: float = 30.0) -> bool:
        """Whether answers have come to ``count`` pauses (``pause_at``) since the server started, within ``timeout``."""
        with self._paused:
            return self._paused.wait_for(lambda: self._pauses >= count, timeout)

    def wait_requests(self, count: int, timeout: float = 30.0) -> bool:
        """Whether ``count`` chat requests have come since the server started, within ``timeout``."""
        with self._requested:
            return self._requested.wait_for(lambda: len(self._requests) >= count, timeout)

    def resume(self) -> None:
        """Let the stream that is paused (or the next one to pause) go on."""
        self._resumes.release()

    def start(self) -> ScriptedServer:
        """Serve in a background thread."""
        server_api.forget(self.base_url)  # a server that had this port before may have offered other endpoints
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving now, cutting stalled and open connections."""
        self._closing.set()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _track(self, connection: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def _record(self, body: bytes) -> int:
        with self._requested:
            self._requests.append(body)
            self._requested.notify_all()
            return len(self._requests)

    def _pause(self) -> None:
        with self._paused:
            self._pauses += 1
            self._paused.notify_all()
        while not self._resumes.acquire(timeout=0.05):
            if self._closing.is_set():
                raise _Closed

    def _take_reset(self) -> bool:
        with self._lock:
            if self._script and self._script[0].fault == "reset":
                self._script.popleft()
                return True
            return False

    def _next_step(self) -> Step:
        with self._lock:
            return self._script.popleft() if self._script else self.when_empty

    def _cache(self, prompt: list[str]) -> int:
        with self._lock:
            shared = max((_shared_prefix(prompt, earlier) for earlier in self._history), default=0)
            self._history.append(prompt)
        return max(0, min(shared, len(prompt) - 1))


def load_script(path: Path) -> list[Step]:
    """Steps from a JSON file holding a list of step objects."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of steps")
    return [Step.from_dict(item) for item in data]


def main(argv: list[str] | None = None) -> None:
    """Serve a script from the command line until interrupted."""
    parser = argparse.ArgumentParser(description="Serve a scripted OpenAI-compatible model.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--script", type=Path, help="JSON file: a list of step objects")
    parser.add_argument("--model", default="scripted")
    parser.add_argument(
        "--n-ctx", type=int, help="a context of this many tokens, with /props, /tokenize, /apply-template"
    )
    parser.add_argument("--vision", action="store_true", help="read images, as llama.cpp with a vision projector")
    args = parser.parse_args(argv)
    script = load_script(args.script) if args.script else []
    with ScriptedServer(
        script, model=args.model, host=args.host, port=args.port, n_ctx=args.n_ctx, vision=args.vision
    ) as server:
        print(f"serving {len(script)} step(s) at {server.base_url} (Ctrl-C stops)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
