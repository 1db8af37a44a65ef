"""Requests that fit: the model's context window, and the size of a request in tokens before it is sent.

The window is what the server says (``chat.agent.windows``: llama.cpp, vLLM, SGLang, Ollama and LM Studio each
say it in their own place), asked when an endpoint is first used, after its URL changed, every
:data:`WINDOW_KEPT_SECONDS`, after the server could not be reached, and before a request is refused or compacted
for its size (the server may have restarted with a larger window); where the server does not say, the endpoint's
configured ``context_window``. A request's size is counted with the server's own chat template and
tokenizer where it offers them (``/apply-template`` then ``/tokenize``), else estimated: the tokens the server
reported for the last request, scaled by the bytes this one shares with it, plus the new bytes at the session's
measured bytes per token (``loop.json`` ``bytes_per_token_before_usage`` before any request has usage). Well below
the window, a measured estimate stands alone: asking the server costs far more (``bench/count_bench.py``).
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from django.utils import timezone

from chat.agent import server_api, windows
from chat.agent.model import ModelHTTPError
from sessions_app import prompts
from sessions_app.models import ChatSession, LastRequest, ModelEndpoint, ModelRequest, RequestStatus
from sessions_app.selectors.requests import BuiltRequest, build_request, image_spans
from sessions_app.services.requests import shared_prefix_bytes
from sessions_app.services.setup import endpoint_window_forget, endpoint_window_record

logger = logging.getLogger(__name__)

WINDOW_KEPT_SECONDS = 600.0
WINDOW_TIMEOUT = 3.0
RATIO_REQUESTS = 50
# Below this share of the window a measured estimate is used as it is: the server's count (0.3 s at 10k tokens,
# 1.5 s at 93k on llama.cpp, bench/count_bench.py) only decides near the threshold, where the estimate's error
# (within 1-5 % a step later, measured) could change what is done.
EXACT_FROM = 0.7


@dataclass(frozen=True)
class Window:
    """An endpoint's context window in tokens: the one used, the configured one, what the server said, where it
    said it and when."""

    tokens: int
    configured: int
    read: int | None
    how: str = ""
    read_at: datetime | None = None

    @property
    def source(self) -> str:
        return "read from the server" if self.read else "configured"

    @property
    def described(self) -> str:
        """Where the window comes from, for a person: what was read, where and when, or that it is configured."""
        if self.read:
            when = f" at {self.read_at:%H:%M} UTC on {self.read_at:%Y-%m-%d}" if self.read_at else ""
            return f"read from the server ({self.how}){when}" if self.how else f"read from the server{when}"
        if self.read_at:
            asked = f"{self.read_at:%H:%M} UTC"
            return f"as configured for this endpoint: the server did not state its own when asked at {asked}"
        return "as configured for this endpoint: the server has not been asked"


def window_of(endpoint: ModelEndpoint) -> Window:
    """The window as last read, asking nothing."""
    here = endpoint.server_window_url == endpoint.base_url
    read = endpoint.server_context_window if here else None
    return Window(
        tokens=endpoint.window,
        configured=endpoint.context_window,
        read=read,
        how=endpoint.server_window_how if read else "",
        read_at=endpoint.server_window_read_at if here else None,
    )


def _stale(endpoint: ModelEndpoint) -> bool:
    if endpoint.server_window_url != endpoint.base_url or endpoint.server_window_read_at is None:
        return True
    return timezone.now() - endpoint.server_window_read_at > timedelta(seconds=WINDOW_KEPT_SECONDS)


def endpoint_window(
    endpoint: ModelEndpoint, *, model: str = "", refresh: bool = False, timeout: float = WINDOW_TIMEOUT
) -> Window:
    """The endpoint's window, asking its server first where the last answer is old, from another URL, or
    ``refresh`` is set (for ``model``, else the endpoint's). A server that cannot be reached leaves what was read
    before."""
    if refresh or _stale(endpoint):
        url = endpoint.base_url
        try:
            found = windows.read_window(
                url, model=model or endpoint.model, api_key=endpoint.api_key or None, timeout=timeout
            )
        except server_api.ServerAPIError as error:
            logger.debug("endpoint %s: cannot read the context window: %s", endpoint.name, error)
        else:
            said = found.vision if found else None
            learned = endpoint.server_reads_images if endpoint.server_window_url == url else None
            endpoint_window_record(
                endpoint=endpoint,
                url=url,
                tokens=found.tokens if found else None,
                how=found.how if found else "",
                vision=said if said is not None else learned,  # a server that says nothing keeps what it showed
            )
    return window_of(endpoint)


def window_learned(endpoint: ModelEndpoint, tokens: int) -> Window:
    """Keep the window a server stated in an error (llama.cpp's ``n_ctx`` when it refuses a request)."""
    vision = endpoint.server_reads_images if endpoint.server_window_url == endpoint.base_url else None
    endpoint_window_record(
        endpoint=endpoint, url=endpoint.base_url, tokens=tokens, how="the server's refusal", vision=vision
    )
    return window_of(endpoint)


IMAGES_REFUSED = "image input is not supported"  # llama.cpp's answer to an image sent to a server without a projector


def images_refused(error: Exception) -> bool:
    """Whether the server refused a request for the images it carried."""
    return isinstance(error, ModelHTTPError) and IMAGES_REFUSED in error.excerpt


def images_learned(endpoint: ModelEndpoint) -> None:
    """Keep that the server at the endpoint's URL does not read images, as it showed by refusing them: sessions
    that start, compact or move to it from now on send it none, whatever staff's setting says."""
    window = window_of(endpoint)
    endpoint_window_record(endpoint=endpoint, url=endpoint.base_url, tokens=window.read, how=window.how, vision=False)


def window_forget(endpoint: ModelEndpoint) -> None:
    """Ask the window again before its next use: the server could not be reached, and may come back another."""
    endpoint_window_forget(endpoint=endpoint)
    server_api.forget(endpoint.base_url)


@dataclass(frozen=True)
class CountedSize:
    """A request's size in tokens, and how it was found."""

    tokens: int
    how: Literal["tokenizer", "estimate", "guess"]  # guess: estimated before any request of the session had usage


class RequestTooLarge(Exception):
    """A request that cannot fit the model's window, even after compacting; ``str()`` says what to do, and where
    the window came from."""

    def __init__(self, needed: int, window: int, *, source: str = "", compacting_helps: bool = True) -> None:
        self.needed = needed
        self.window = window
        loop = prompts.loop_settings()
        text = loop.too_large_text if compacting_helps else loop.uncompactable_text
        super().__init__(text.format(needed=f"{needed:,}", window=f"{window:,}", source=source or "as configured"))


@dataclass(frozen=True)
class _Usage:
    body: bytes
    tokens: int


class RequestCounter:
    """Counts the requests of one session against its endpoint's window."""

    def __init__(self, session: ChatSession, *, window: Window) -> None:
        loop = prompts.loop_settings()
        endpoint = session.endpoint
        self.base_url = endpoint.base_url
        self.api_key = endpoint.api_key or None
        self.asks_server = True
        self.window = window
        self.auto_at = prompts.rules_config().compaction_auto_at
        self.answer_room = min(loop.answer_room_tokens, window.tokens - math.floor(self.auto_at * window.tokens))
        self.default_ratio = loop.bytes_per_token_before_usage
        self.image_tokens = loop.image_tokens_estimate
        done = ModelRequest.objects.filter(session=session, status=RequestStatus.DONE, prompt_tokens__gt=0)
        recent = list(
            done.order_by("-id").values_list("bytes_sent", "prompt_tokens", "images", "image_bytes")[:RATIO_REQUESTS]
        )
        self.bytes_seen = sum(sent - image_bytes for sent, _, _, image_bytes in recent)
        self.tokens_seen = sum(self._text_tokens(tokens or 0, images) for _, tokens, images, _ in recent)
        self.last: _Usage | None = None
        stored = LastRequest.objects.filter(session=session).values_list("body", flat=True).first()
        if recent and stored:
            body = bytes(stored)
            sha = hashlib.sha256(body).hexdigest()
            tokens = done.filter(body_sha256=sha).order_by("-id").values_list("prompt_tokens", flat=True).first()
            if tokens:
                self.last = _Usage(body, tokens)

    def _text_tokens(self, tokens: int, images: int) -> int:
        """Of a request's ``tokens``, those of its text: its images' at the estimate taken out."""
        return max(tokens - images * self.image_tokens, 1)

    @property
    def bytes_per_token(self) -> float:
        """The session's measured bytes per prompt token, or the default before any request has usage."""
        return self.bytes_seen / self.tokens_seen if self.tokens_seen else self.default_ratio

    def count(self, built: BuiltRequest) -> CountedSize:
        """``built``'s size in tokens: the server's count where it offers one, else the estimate; an estimate
        from measured usage that is well below the window (:data:`EXACT_FROM`) is not checked with the server."""
        estimate = self.estimate(built.body)
        if self.tokens_seen and estimate < EXACT_FROM * self.window.tokens:
            return CountedSize(estimate, "estimate")
        tokens = None
        if self.asks_server:
            try:
                tokens = server_api.prompt_tokens(
                    self.base_url, built.messages, tools=built.tools, body=built.body, api_key=self.api_key
                )
            except server_api.ServerAPIError as error:
                logger.debug("cannot count a request with the server's tokenizer: %s", error)
                self.asks_server = False
        if tokens is not None:  # an image is a marker in the template's text: its tokens are the estimate's
            return CountedSize(len(tokens) + len(image_spans(built.body)) * self.image_tokens, "tokenizer")
        return CountedSize(estimate, "estimate" if self.tokens_seen else "guess")

    def estimate(self, body: bytes) -> int:
        last = self.last
        return estimate_tokens(
            body,
            last_body=last.body if last else b"",
            last_tokens=last.tokens if last else 0,
            bytes_per_token=self.bytes_per_token,
            image_tokens=self.image_tokens,
        )

    def learned(self, body: bytes, prompt_tokens: int | None) -> None:
        """What the server reported for a request just sent."""
        if prompt_tokens:
            images = image_spans(body)
            self.bytes_seen += len(body) - sum(end - start for start, end in images)
            self.tokens_seen += self._text_tokens(prompt_tokens, len(images))
            self.last = _Usage(body, prompt_tokens)

    def fits(self, size: CountedSize) -> bool:
        """Whether a request of ``size`` leaves room for the answer in the window."""
        return size.tokens + self.answer_room <= self.window.tokens

    def past_threshold(self, size: CountedSize) -> bool:
        """Whether a request of ``size`` passes ``compaction.auto_at`` of the window."""
        return size.tokens > self.auto_at * self.window.tokens

    def too_large(self, size: CountedSize, *, compacting_helps: bool = True) -> RequestTooLarge:
        """The refusal of a request of ``size``; its advice leaves out Compact now where no compaction would fit."""
        return RequestTooLarge(
            size.tokens, self.window.tokens, source=self.window.described, compacting_helps=compacting_helps
        )


def switch_refusal(session: ChatSession, *, endpoint: ModelEndpoint, model_name: str) -> str:
    """Why the session may not move to ``model_name`` on ``endpoint``: its conversation, as its next request would
    carry it, would not fit that window as last read (estimated from the session's own bytes per token), so on
    that model it could neither go on nor be compacted; empty where it fits."""
    window = window_of(endpoint)
    counter = RequestCounter(session, window=window)
    built = build_request(session, current=None, model_name=model_name)
    size = CountedSize(counter.estimate(built.body), "estimate")
    if counter.fits(size):
        return ""
    return prompts.loop_settings().switch_too_small_text.format(
        model=model_name,
        endpoint=endpoint.name,
        needed=f"{size.tokens:,}",
        window=f"{window.tokens:,}",
        source=window.described,
        current=session.model_name,
    )


def estimate_tokens(
    body: bytes, *, last_body: bytes, last_tokens: int, bytes_per_token: float, image_tokens: int = 0
) -> int:
    """The last request's tokens for the bytes ``body`` shares with it, the rest at ``bytes_per_token``; each
    image's data counts ``image_tokens``, not its bytes (a model reads an image as a number of tokens its
    projector fixes, whatever the image's size in bytes)."""
    text_bytes, images = _text_and_images(body, len(body))
    if not last_body:
        return math.ceil(text_bytes / bytes_per_token) + images * image_tokens
    shared = shared_prefix_bytes(last_body, body)
    last_text, last_images = _text_and_images(last_body, len(last_body))
    shared_text, shared_images = _text_and_images(last_body, shared)
    last_text_tokens = max(last_tokens - last_images * image_tokens, 0)
    kept = (last_text_tokens * shared_text // last_text if last_text else 0) + shared_images * image_tokens
    return kept + math.ceil((text_bytes - shared_text) / bytes_per_token) + (images - shared_images) * image_tokens


def _text_and_images(body: bytes, upto: int) -> tuple[int, int]:
    """Of ``body``'s first ``upto`` bytes, how many are not images' data, and how many images lie wholly in them."""
    text, images = upto, 0
    for start, end in image_spans(body):
        if start >= upto:
            break
        text -= min(end, upto) - start
        images += end <= upto
    return text, images
