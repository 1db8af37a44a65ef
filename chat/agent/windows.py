"""The context window as the common model servers state it, each in its own place:

- llama.cpp: ``/props`` (``n_ctx`` of a slot);
- vLLM and SGLang: their OpenAI model list (``/v1/models``, ``max_model_len`` of each model);
- LM Studio: its own model list (``/api/v1/models``: the ``context_length`` a loaded instance runs with; before
  0.4, ``/api/v0/models``: ``loaded_context_length``);
- Ollama: its running models (``/api/ps``: ``context_length``), else the model's ``num_ctx`` parameter
  (``/api/show``).

Only what the server will actually give a request counts: the length a model was trained for (llama.cpp's
``n_ctx_train``, Ollama's ``model_info``, LM Studio's ``max_context_length``) is not the window it runs with, so a
server that states nothing else is not read, and the endpoint's configured window stands. Every call goes through
``server_api`` (the shared client; a path a server does not offer is remembered a while and not asked again).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from chat.agent import server_api
from chat.agent.server_api import ServerAPIError, server_root

__all__ = ["ReadWindow", "ServerAPIError", "read_window"]

NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class ReadWindow:
    """A window a server stated, and where (``how``: the server's kind and the field, as people look it up);
    ``vision``: whether it said its model reads images (``None``: it did not say)."""

    tokens: int
    how: str
    vision: bool | None = None


def _entries(data: object, key: str) -> list[dict[str, Any]]:
    entries = data.get(key) if isinstance(data, dict) else None
    return [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []


def _named(entries: Iterable[dict[str, Any]], model: str, *names: str) -> dict[str, Any] | None:
    """The entry for ``model`` (by any of the ``names`` fields, a tag-less Ollama name matching ``:latest``), else
    the only entry where there is one."""
    listed = list(entries)
    wanted = {model, f"{model}:latest"} if model and ":" not in model else {model}
    for entry in listed:
        if any(entry.get(name) in wanted for name in names):
            return entry
    return listed[0] if len(listed) == 1 else None


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _llama_cpp(base_url: str, model: str, api_key: str | None, timeout: float) -> ReadWindow | None:
    props = server_api.props(base_url, api_key=api_key, timeout=timeout)
    if props is None or props.context_window is None:
        return None
    return ReadWindow(props.context_window, "llama.cpp /props n_ctx", vision=props.vision)


def _openai_models(base_url: str, model: str, api_key: str | None, timeout: float) -> ReadWindow | None:
    path = base_url.rstrip("/")[len(server_root(base_url)) :] + "/models"
    data = server_api.get_json(base_url, path, api_key=api_key, timeout=timeout)
    entry = _named(_entries(data, "data"), model, "id", "root")
    tokens = _positive(entry.get("max_model_len")) if entry else None
    return ReadWindow(tokens, f"{path} max_model_len") if tokens else None


def _lm_studio(base_url: str, model: str, api_key: str | None, timeout: float) -> ReadWindow | None:
    listed = server_api.get_json(base_url, "/api/v1/models", api_key=api_key, timeout=timeout)
    entry = _named([e for e in _entries(listed, "models") if e.get("loaded_instances")], model, "key")
    for instance in _entries(entry, "loaded_instances") if entry else []:
        config = instance.get("config")
        tokens = _positive(config.get("context_length")) if isinstance(config, dict) else None
        if tokens:
            return ReadWindow(tokens, "LM Studio /api/v1/models loaded_instances context_length")
    if listed is not None:
        return None
    older = server_api.get_json(base_url, "/api/v0/models", api_key=api_key, timeout=timeout)  # before LM Studio 0.4
    entry = _named([e for e in _entries(older, "data") if e.get("state") == "loaded"], model, "id")
    tokens = _positive(entry.get("loaded_context_length")) if entry else None
    return ReadWindow(tokens, "LM Studio /api/v0/models loaded_context_length") if tokens else None


def _ollama(base_url: str, model: str, api_key: str | None, timeout: float) -> ReadWindow | None:
    running = server_api.get_json(base_url, "/api/ps", api_key=api_key, timeout=timeout)
    entry = _named(_entries(running, "models"), model, "model", "name")
    tokens = _positive(entry.get("context_length")) if entry else None
    if tokens:
        return ReadWindow(tokens, "Ollama /api/ps context_length")
    if running is None or not model:  # not Ollama, or no model to ask about
        return None
    shown = server_api.post_json(base_url, "/api/show", {"model": model}, api_key=api_key, timeout=timeout)
    parameters = shown.get("parameters") if isinstance(shown, dict) else None
    found = NUM_CTX.search(parameters) if isinstance(parameters, str) else None
    return ReadWindow(int(found.group(1)), "Ollama /api/show num_ctx") if found and int(found.group(1)) else None


READERS: tuple[Callable[[str, str, str | None, float], ReadWindow | None], ...] = (
    _llama_cpp,
    _openai_models,
    _lm_studio,
    _ollama,
)


def read_window(base_url: str, *, model: str, api_key: str | None, timeout: float) -> ReadWindow | None:
    """The context window the server at ``base_url`` states for ``model``; ``None`` where it states none. Raises
    ``ServerAPIError`` where the server cannot be reached."""
    for reader in READERS:
        found = reader(base_url, model, api_key, timeout)
        if found is not None:
            return found
    return None
