"""What the model endpoints list at ``/v1/models``: asked all at once with a short timeout and kept a little
while, for the start-up lines, the new-session form and a session's model menu."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from time import monotonic

from chat.agent.model import ModelError, ModelHTTPError, ModelProtocolError, failure_reason, list_models
from sessions_app.models import ModelEndpoint

FALLBACK_MODEL = "default"  # the model asked for where nobody named one and the server lists none
LIST_TIMEOUT = 2.0
KEPT_SECONDS = 30.0
FAILURE_KEPT_SECONDS = 5.0
MAX_ASKED_AT_ONCE = 8


@dataclass(frozen=True)
class Listing:
    """What one server said at ``/v1/models``: its model ids, or why it listed none."""

    models: tuple[str, ...]
    problem: str = ""
    answered: bool = True

    @property
    def listed(self) -> bool:
        return not self.problem


@dataclass(frozen=True)
class EndpointModels:
    """An endpoint and what its server listed."""

    endpoint: ModelEndpoint
    listing: Listing

    @property
    def names(self) -> tuple[str, ...]:
        """The models to offer: the endpoint's own model first where the server does not list it, then the listed."""
        own = self.endpoint.model
        listed = self.listing.models
        return (own, *listed) if own and own not in listed else listed

    @property
    def preferred(self) -> str:
        """The model a session on this endpoint takes when nobody names one; empty when nothing is known."""
        return self.endpoint.model or (self.listing.models[0] if self.listing.models else "")


_kept: dict[tuple[str, str], tuple[float, Listing]] = {}
_kept_lock = threading.Lock()


def listing_of(*, base_url: str, api_key: str, timeout: float = LIST_TIMEOUT) -> Listing:
    """Ask one server for its models now."""
    try:
        models = list_models(base_url=base_url, api_key=api_key or None, timeout=timeout)
    except (ModelHTTPError, ModelProtocolError) as error:
        return Listing((), problem=failure_reason(error), answered=True)
    except ModelError as error:
        return Listing((), problem=failure_reason(error), answered=False)
    return Listing(tuple(models))


def _fresh(entry: tuple[float, Listing] | None, now: float, kept: float) -> bool:
    if entry is None:
        return False
    at, listing = entry
    return now - at < (kept if listing.listed else min(kept, FAILURE_KEPT_SECONDS))


def endpoints_models(
    endpoints: Sequence[ModelEndpoint], *, timeout: float = LIST_TIMEOUT, kept: float = KEPT_SECONDS
) -> list[EndpointModels]:
    """Each endpoint with what its server lists, in the order given: the servers not asked in the last ``kept``
    seconds (5 after a failure) are asked all at once, so the whole takes at most about ``timeout``."""
    keys = [(endpoint.base_url.rstrip("/"), endpoint.api_key) for endpoint in endpoints]
    now = monotonic()
    with _kept_lock:
        found = {key: _kept[key][1] for key in set(keys) if _fresh(_kept.get(key), now, kept)}
    missing = [key for key in dict.fromkeys(keys) if key not in found]
    if missing:
        with ThreadPoolExecutor(max_workers=min(MAX_ASKED_AT_ONCE, len(missing))) as pool:
            listings = list(pool.map(lambda key: listing_of(base_url=key[0], api_key=key[1], timeout=timeout), missing))
        with _kept_lock:
            for key, listing in zip(missing, listings, strict=True):
                _kept[key] = (monotonic(), listing)
                found[key] = listing
    return [EndpointModels(endpoint, found[key]) for endpoint, key in zip(endpoints, keys, strict=True)]


def endpoint_models(endpoint: ModelEndpoint, *, timeout: float = LIST_TIMEOUT) -> EndpointModels:
    return endpoints_models([endpoint], timeout=timeout)[0]


def endpoints_forget() -> None:
    """Drop every kept listing, so the next look asks the servers again."""
    with _kept_lock:
        _kept.clear()
