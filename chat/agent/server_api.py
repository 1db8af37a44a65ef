"""What a llama.cpp-style server offers beside the OpenAI API: its context window (``/props``), its tokenizer
(``/tokenize``) and its chat template (``/apply-template``).

Each call answers ``None`` where the server does not offer it (404, 405, 501, or an answer of another shape),
so callers fall back to what they know without it; a server that cannot be reached raises ``ServerAPIError``.
What a server does not offer is remembered a while so it is not asked again on every request. Every call goes
through the process's one shared client (``chat.agent.model.transport.shared_client``), whose connections are
kept alive: a new client per call cost about 23 ms of CPU, a call on the shared one under 1 ms
(``bench/server_api_bench.py``). These calls only read, so one whose kept-alive connection the server had
closed meanwhile is asked once more, on a new connection.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from time import monotonic
from typing import Any

import httpx

from chat.agent.model.transport import shared_client

TIMEOUT = 10.0
UNOFFERED_KEPT_SECONDS = 300.0
NOT_OFFERED_STATUSES = frozenset({404, 405, 501})
KEPT_PROMPTS = 64


class ServerAPIError(Exception):
    """The server could not be asked (unreachable, timed out, or it failed with a server error)."""


@dataclass(frozen=True)
class ServerProps:
    """What ``/props`` says: the context window of one slot (``n_ctx``), the chat template, slots in all, how
    the server was started, and whether its model reads images (``modalities``; ``None``: it does not say)."""

    context_window: int | None
    chat_template: str
    total_slots: int | None
    started_as: str = ""  # how the server says it was started (model, build, slots, window): changes with a restart
    vision: bool | None = None


def server_root(base_url: str) -> str:
    """The server's own root for an OpenAI base URL: ``http://h:8080/v1`` → ``http://h:8080``."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


_unoffered: dict[tuple[str, str], float] = {}
_unoffered_lock = threading.Lock()


def _known_unoffered(root: str, path: str) -> bool:
    with _unoffered_lock:
        at = _unoffered.get((root, path))
        return at is not None and monotonic() - at < UNOFFERED_KEPT_SECONDS


def _mark_unoffered(root: str, path: str) -> None:
    with _unoffered_lock:
        _unoffered[(root, path)] = monotonic()


def may_render(base_url: str) -> bool:
    """False where the server is known not to offer its template or its tokenizer (asked lately)."""
    root = server_root(base_url)
    return not (_known_unoffered(root, "/apply-template") or _known_unoffered(root, "/tokenize"))


def forget(base_url: str) -> None:
    """Ask the server again on the next call: after its URL changed or it restarted."""
    root = server_root(base_url)
    with _unoffered_lock:
        for key in [key for key in _unoffered if key[0] == root]:
            del _unoffered[key]
        _rendered.pop(root, None)
    forget_head(base_url)


_rendered: dict[str, float] = {}  # server roots that rendered a prompt lately
_first_askers: dict[str, threading.Lock] = {}


@contextlib.contextmanager
def _one_asks_first(root: str) -> Iterator[bool]:
    """Until a server has rendered a prompt lately, one caller at a time asks it whether it renders at all, so
    callers that come together (the cache checks of a reply's first steps) do not each prepare a large request
    for a server that renders none. Yields whether the server rendered lately."""
    with _unoffered_lock:
        lock = None if _rendered_lately(root) else _first_askers.setdefault(root, threading.Lock())
    if lock is None:
        yield True
        return
    with lock:
        with _unoffered_lock:
            lately = _rendered_lately(root)
        yield lately


def _rendered_lately(root: str) -> bool:
    at = _rendered.get(root)  # the caller holds _unoffered_lock
    return at is not None and monotonic() - at < UNOFFERED_KEPT_SECONDS


def _mark_rendered(root: str) -> None:
    with _unoffered_lock:
        _rendered[root] = monotonic()


_PROBE = [{"role": "user", "content": "?"}]


DISCONNECTED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def _call(
    base_url: str,
    path: str,
    *,
    api_key: str | None,
    payload: dict[str, Any] | None,
    timeout: float,
    content: bytes | None = None,
) -> Any | None:
    """The server's JSON answer at ``path`` (GET, or POST of ``payload``, or of ``content``: JSON already encoded);
    ``None`` where the server does not offer it."""
    root = server_root(base_url)
    if _known_unoffered(root, path):
        return None
    headers = {"Accept": "application/json"}
    if content is not None:
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    url = root + path
    try:
        response = _ask(url, headers=headers, payload=payload, content=content, timeout=timeout)
    except httpx.HTTPError as error:
        raise ServerAPIError(f"Cannot ask {url}: {error.__class__.__name__}: {error}") from error
    if response.status_code in NOT_OFFERED_STATUSES:
        _mark_unoffered(root, path)
        return None
    if response.status_code >= 500:
        raise ServerAPIError(f"{url} answered HTTP {response.status_code}: {response.text[:200]}")
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        _mark_unoffered(root, path)
        return None


def _ask(
    url: str, *, headers: dict[str, str], payload: dict[str, Any] | None, content: bytes | None, timeout: float
) -> httpx.Response:
    client = shared_client()
    method = "GET" if payload is None and content is None else "POST"
    try:
        return client.request(method, url, json=payload, content=content, headers=headers, timeout=timeout)
    except DISCONNECTED:
        return client.request(method, url, json=payload, content=content, headers=headers, timeout=timeout)


def get_json(base_url: str, path: str, *, api_key: str | None = None, timeout: float = TIMEOUT) -> Any | None:
    """The server's JSON answer to a GET of ``path`` (from its root); ``None`` where it does not offer it."""
    return _call(base_url, path, api_key=api_key, payload=None, timeout=timeout)


def post_json(
    base_url: str, path: str, payload: dict[str, Any], *, api_key: str | None = None, timeout: float = TIMEOUT
) -> Any | None:
    """The server's JSON answer to a POST of ``payload`` to ``path``; ``None`` where it does not offer it."""
    return _call(base_url, path, api_key=api_key, payload=payload, timeout=timeout)


def slot_action(
    base_url: str, slot: int, action: str, filename: str, *, api_key: str | None = None, timeout: float = TIMEOUT
) -> dict[str, Any] | None:
    """llama.cpp's slot ``save`` or ``restore`` (``POST /slots/{slot}?action=…``, where the server was started with
    ``--slot-save-path``); ``None`` where it does not offer it or refused (a file that is not there)."""
    data = _call(
        base_url, f"/slots/{slot}?action={action}", api_key=api_key, payload={"filename": filename}, timeout=timeout
    )
    return data if isinstance(data, dict) else None


HANDOVER_PROMPT = "Cachet hands this slot over."


def slot_handover(
    base_url: str,
    slot: int,
    *,
    prompt: str | Sequence[int] = HANDOVER_PROMPT,
    api_key: str | None = None,
    timeout: float = TIMEOUT,
) -> int | None:
    """Put ``prompt`` (text, or tokens) into ``slot`` with llama.cpp's ``/completion``, nothing generated, so that
    llama.cpp saves what the slot held to its host-memory prompt cache (``--cache-ram``): it does where a request
    shares less than half of the slot's tokens. The default, a few tokens of no conversation's, makes the request
    that follows load the cached prompt that best matches it; a template's head (:func:`template_head`) makes it
    load none and compute its own. The tokens the server computed for it; ``None`` where it did not do it."""
    payload = {"prompt": prompt if isinstance(prompt, str) else list(prompt), "n_predict": 0, "id_slot": slot}
    data = _call(base_url, "/completion", api_key=api_key, payload=payload | {"cache_prompt": True}, timeout=timeout)
    if not isinstance(data, dict):
        return None
    timings = data.get("timings")
    computed = timings.get("prompt_n") if isinstance(timings, dict) else None
    return computed if isinstance(computed, int) and not isinstance(computed, bool) and computed >= 0 else 0


_heads: dict[str, tuple[int, ...]] = {}  # server root: the tokens every chat request there begins with
_HEAD_PROBES = ("a", "b")


def forget_head(base_url: str) -> None:
    """Ask for the server's template head again: it was started again, perhaps with another model."""
    with _unoffered_lock:
        _heads.pop(server_root(base_url), None)


def template_head(base_url: str, *, api_key: str | None = None, timeout: float = TIMEOUT) -> tuple[int, ...] | None:
    """The tokens every chat request to the server begins with (its chat template up to the system prompt's text,
    BOS included): what two renderings that differ only in the system prompt have in common. Asked once per
    server for the process; ``None`` where the server offers no template or tokenizer."""
    root = server_root(base_url)
    with _unoffered_lock:
        kept = _heads.get(root)
    if kept is not None:
        return kept
    renderings: list[list[int]] = []
    for text in _HEAD_PROBES:
        messages = [{"role": "system", "content": text}, {"role": "user", "content": "?"}]
        prompt = apply_template(base_url, messages, api_key=api_key, timeout=timeout)
        tokens = tokenize(base_url, prompt, api_key=api_key, timeout=timeout) if prompt is not None else None
        if tokens is None:
            return None
        renderings.append(tokens)
    first, second = renderings
    shared = 0
    while shared < min(len(first), len(second)) and first[shared] == second[shared]:
        shared += 1
    head = tuple(first[:shared])
    with _unoffered_lock:
        _heads[root] = head
    return head


SLOT_PROBE_ACTION = "cachet-capabilities"


def slot_saving(base_url: str, *, api_key: str | None = None, timeout: float = TIMEOUT) -> bool:
    """Whether the server saves and restores slots (llama.cpp started with ``--slot-save-path``), asked without
    touching any slot: llama.cpp refuses an action it does not know as ``Invalid action`` (400) when it saves slots,
    before it looks at a slot, and as not supported (501) when it does not; another server has no such address.
    (Asking by restoring a file that is not there, as before, emptied slot 0 on a server that saves slots.)"""
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    url = f"{server_root(base_url)}/slots/0?action={SLOT_PROBE_ACTION}"
    try:
        response = _ask(url, headers=headers, payload={}, content=None, timeout=timeout)
    except httpx.HTTPError as error:
        raise ServerAPIError(f"Cannot ask {url}: {error.__class__.__name__}: {error}") from error
    return response.status_code == 400 and b"nvalid action" in response.content


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def props(base_url: str, *, api_key: str | None = None, timeout: float = TIMEOUT) -> ServerProps | None:
    """The server's ``/props``, or ``None`` where it has none."""
    data = _call(base_url, "/props", api_key=api_key, payload=None, timeout=timeout)
    if not isinstance(data, dict):
        return None
    settings = data.get("default_generation_settings")
    n_ctx = _positive_int(settings.get("n_ctx")) if isinstance(settings, dict) else None
    if n_ctx is None:
        n_ctx = _positive_int(data.get("n_ctx"))
    template = data.get("chat_template")
    started_as = json.dumps(
        [data.get(key) for key in ("model_path", "build_info", "total_slots")] + [n_ctx], default=str
    )
    modalities = data.get("modalities")
    vision = modalities.get("vision") if isinstance(modalities, dict) else None
    return ServerProps(
        context_window=n_ctx,
        chat_template=template if isinstance(template, str) else "",
        total_slots=_positive_int(data.get("total_slots")),
        started_as=started_as,
        vision=vision if isinstance(vision, bool) else None,
    )


def tokenize(
    base_url: str, text: str, *, add_special: bool = True, api_key: str | None = None, timeout: float = TIMEOUT
) -> list[int] | None:
    """The server's tokens for ``text`` (with the BOS the server adds to a prompt where ``add_special``)."""
    payload = {"content": text, "add_special": add_special}
    data = _call(base_url, "/tokenize", api_key=api_key, payload=payload, timeout=timeout)
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list) or not set(map(type, tokens)) <= {int}:  # a third of a filter's time
        return None
    return tokens


def apply_template(
    base_url: str,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    body: bytes | None = None,
    api_key: str | None = None,
    timeout: float = TIMEOUT,
) -> str | None:
    """The prompt text the server's chat template makes of ``messages`` (and ``tools``), generation prompt added.
    With ``body``, the chat request's own bytes are sent as they are (the server reads the same fields from it,
    and encoding a long conversation again cost more than the rest of the check)."""
    if body is not None:
        data = _call(base_url, "/apply-template", api_key=api_key, payload=None, content=body, timeout=timeout)
    else:
        payload: dict[str, Any] = {"messages": list(messages)}
        if tools:
            payload["tools"] = list(tools)
        data = _call(base_url, "/apply-template", api_key=api_key, payload=payload, timeout=timeout)
    prompt = data.get("prompt") if isinstance(data, dict) else None
    return prompt if isinstance(prompt, str) else None


@dataclass(frozen=True)
class RenderedPrompt:
    """What the server reads for a chat request: its chat template's text and that text's tokens."""

    text: str
    tokens: tuple[int, ...]


_kept_prompts: OrderedDict[tuple[str, str], RenderedPrompt] = OrderedDict()
_rendering: dict[tuple[str, str], threading.Event] = {}  # renderings asked and not yet answered
_kept_prompts_lock = threading.Lock()


def rendered_prompt(
    base_url: str,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    body: bytes | None = None,
    api_key: str | None = None,
    timeout: float = TIMEOUT,
) -> RenderedPrompt | None:
    """The server's template applied to the request, then its tokenizer (BOS included); ``None`` where the
    server offers either not. The last few answers are kept by the request's content, so the size check before
    a request and the cache check after it ask the server once: by ``body``, the request's bytes, where the
    caller has them (hashing them costs a fifteenth of serializing ``messages`` again), else by ``messages``.
    A caller that comes while the same request is being rendered waits for that answer."""
    root = server_root(base_url)
    with _one_asks_first(root) as rendered_lately:
        if not may_render(base_url):
            return None
        if not rendered_lately:  # asked with one short message first, rather than with the whole request
            if apply_template(base_url, _PROBE, api_key=api_key, timeout=timeout) is None:
                return None
            _mark_rendered(root)
    if body is not None:
        key = (root, "body " + hashlib.sha256(body).hexdigest())
    else:
        key_source = json.dumps([list(messages), list(tools or ())], sort_keys=True, ensure_ascii=False)
        key = (root, "messages " + hashlib.sha256(key_source.encode("utf-8", "surrogatepass")).hexdigest())
    with _kept_prompts_lock:
        kept = _kept_prompts.get(key)
        if kept is not None:
            _kept_prompts.move_to_end(key)
            return kept
        asked = _rendering.get(key)
        if asked is None:
            _rendering[key] = asking = threading.Event()
    if asked is not None:  # another caller is asking for this same request: its answer is this one's
        asked.wait(timeout)
        with _kept_prompts_lock:
            kept = _kept_prompts.get(key)
        if kept is not None:
            return kept
        return _render(base_url, messages, tools=tools, body=body, api_key=api_key, timeout=timeout)
    try:
        answer = _render(base_url, messages, tools=tools, body=body, api_key=api_key, timeout=timeout)
        if answer is not None:
            with _kept_prompts_lock:
                _kept_prompts[key] = answer
                while len(_kept_prompts) > KEPT_PROMPTS:
                    _kept_prompts.popitem(last=False)
        return answer
    finally:
        with _kept_prompts_lock:
            del _rendering[key]
        asking.set()


def _render(
    base_url: str,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None,
    body: bytes | None,
    api_key: str | None,
    timeout: float,
) -> RenderedPrompt | None:
    prompt = apply_template(base_url, messages, tools=tools, body=body, api_key=api_key, timeout=timeout)
    if prompt is None:
        return None
    tokens = tokenize(base_url, prompt, add_special=True, api_key=api_key, timeout=timeout)
    if tokens is None:
        return None
    _mark_rendered(server_root(base_url))
    return RenderedPrompt(text=prompt, tokens=tuple(tokens))


def prompt_tokens(
    base_url: str,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    body: bytes | None = None,
    api_key: str | None = None,
    timeout: float = TIMEOUT,
) -> tuple[int, ...] | None:
    """The tokens the server reads for a chat request: its template applied, then its tokenizer (BOS included).

    ``None`` where the server offers either not; kept like ``rendered_prompt``.
    """
    rendered = rendered_prompt(base_url, messages, tools=tools, body=body, api_key=api_key, timeout=timeout)
    return rendered.tokens if rendered is not None else None
