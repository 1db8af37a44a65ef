"""The models a server lists (``/v1/models``, or Ollama's ``models``), asked with the process's shared client."""

from __future__ import annotations

import httpx

from chat.agent.model.errors import (
    ModelHTTPError,
    ModelProtocolError,
    ModelTimeout,
    ModelUnavailable,
    describe,
    error_excerpt,
    one_line,
)
from chat.agent.model.stream import headers
from chat.agent.model.transport import shared_client


def list_models(*, base_url: str, api_key: str | None, timeout: float = 5.0) -> list[str]:
    """The model ids `{base_url}/models` lists."""
    url = base_url.rstrip("/") + "/models"
    response = _get(url, api_key=api_key, timeout=timeout)
    if response.status_code != 200:
        excerpt = error_excerpt(response.content)
        raise ModelHTTPError(
            f"The model server at {url} answered HTTP {response.status_code}: {excerpt}",
            url=url,
            status=response.status_code,
            excerpt=excerpt,
        )
    try:
        data = response.json()
    except ValueError:
        raise ModelProtocolError(
            f"The model server at {url} answered something that is not JSON: {one_line(response.text, 120)}",
            url=url,
        ) from None
    ids = _model_ids(data)
    if ids is None:
        excerpt = one_line(response.text, 120)
        raise ModelProtocolError(f"The model server at {url} answered JSON without a model list: {excerpt}", url=url)
    return ids


def _model_ids(data: object) -> list[str] | None:
    """The ids of an OpenAI model list (``data``), else the names of Ollama's (``models``); ``None`` for neither."""
    if not isinstance(data, dict):
        return None
    entries = data.get("data")
    ids = (
        [e["id"] for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]
        if isinstance(entries, list)
        else []
    )
    models = data.get("models")
    if not ids and isinstance(models, list):
        names = [entry.get("model") or entry.get("name") for entry in models if isinstance(entry, dict)]
        ids = [name for name in names if isinstance(name, str)]
    if ids or "data" in data or "models" in data:
        return ids
    return None


def _get(url: str, *, api_key: str | None, timeout: float) -> httpx.Response:
    try:
        return shared_client().get(url, headers=headers(api_key, "application/json"), timeout=timeout)
    except (httpx.ConnectError, httpx.ConnectTimeout) as error:
        message = f"Cannot reach the model server at {url}: {describe(error)}."
        raise ModelUnavailable(message, url=url) from error
    except httpx.TimeoutException as error:
        message = f"The model server at {url} did not answer within {timeout:g} s."
        raise ModelTimeout(message, url=url, which="read", seconds=timeout) from error
    except httpx.HTTPError as error:
        message = f"Cannot talk to the model server at {url}: {describe(error)}."
        raise ModelUnavailable(message, url=url) from error
