"""Where a session's next request goes: one of its endpoint's replicas (URLs serving the same model) and, where
that server reports slots (llama.cpp's ``/props`` ``total_slots``), one slot of it
(``sessions_app.services.placement``).

A session sticks to its replica; a new one is given one by its number, so that sessions spread over the
replicas. It moves only when its replica cannot be reached: that replica is then left alone for
:data:`DOWN_SECONDS` by this process, and the request goes to the next one, recorded as moved ("replica").

Where the server does not save slots and a session would take over a slot holding another's prefix (more
sessions than slots), the server is left to place requests itself for :data:`CROWDED_SECONDS`: a request
that names its slot bypasses llama.cpp's host-memory prompt cache (``--cache-ram``), which then keeps
returning sessions' prefixes better (four sessions on two slots: 1.13x the floor left to llama.cpp, 1.37x
placed by Cachet).

Where a session takes over a slot that held another's prefix and the server saves slots (llama.cpp's
``--slot-save-path``, asked once per server start with ``server_api.slot_saving``, which touches no slot; on a
server of one slot too), that
prefix is saved first, and a session that returns to a slot not holding its own has its saved prefix put back:
measured on the generated model, a slot of 6,830 tokens saved in 60 ms and was put back in 33 ms, where
computing it again took the returning request 4,816 tokens. A prefix under :data:`MIN_SAVED_TOKENS` is computed
again instead.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from time import monotonic

from chat.agent import server_api
from sessions_app.models import ChatSession, ModelRequest, Moved
from sessions_app.services.placement import SlotTaken, slot_release, slot_saved, slot_take

SLOTS_KEPT_SECONDS = 60.0  # how long a server's slot count is trusted before it is asked again
SLOTS_TIMEOUT = 3.0
DOWN_SECONDS = 30.0
CROWDED_SECONDS = 600.0  # how long a server that does not save slots is left to place requests itself
MIN_SAVED_TOKENS = 1024
SLOT_FILE_TIMEOUT = 60.0  # a large model's slot is hundreds of megabytes

_lock = threading.Lock()


@dataclass(frozen=True)
class _Known:
    """What a server said: when, its slots (0: it says none), whether it saves them, and how it was started."""

    asked_at: float
    slots: int
    saves: bool
    started_as: str


_slots: dict[str, _Known] = {}
_down: dict[str, float] = {}  # url: until when it is left alone
_crowded: dict[str, float] = {}  # url: until when its slots are left to it (more sessions than slots, none saved)


@dataclass(frozen=True)
class Placed:
    """Where a request goes: the server's base URL, the slot asked for (``None``: the server chooses), and why
    it is not where the session's request before went ("", "replica" or "slot")."""

    url: str
    slot: int | None = None
    moved: str = ""


def server_slots(url: str, *, api_key: str | None) -> tuple[int, bool]:
    """How many slots the server at ``url`` has (0 where it does not say), and whether it saves them. Its
    ``/props`` is read at most every minute; whether it saves slots is asked once per server start (the first time,
    again when ``/props`` says it was started otherwise, after it was out of reach, or after a save or restore it
    refused) and never changes a slot (``server_api.slot_saving``)."""
    with _lock:
        known = _slots.get(url)
    if known is not None and monotonic() - known.asked_at < SLOTS_KEPT_SECONDS:
        return known.slots, known.saves
    try:
        props = server_api.props(url, api_key=api_key, timeout=SLOTS_TIMEOUT)
        slots = props.total_slots if props is not None and props.total_slots else 0
        started_as = props.started_as if props is not None else ""
        if slots < 1:
            saves = False
        elif known is not None and known.slots == slots and known.started_as == started_as:
            saves = known.saves
        else:
            saves = server_api.slot_saving(url, api_key=api_key, timeout=SLOTS_TIMEOUT)
    except server_api.ServerAPIError:
        return 0, False  # out of reach: the request says so
    with _lock:
        _slots[url] = _Known(monotonic(), slots, saves, started_as)
    return slots, saves


def forget_saving(url: str) -> None:
    """Ask again whether the server at ``url`` saves slots: it refused a save or a restore."""
    with _lock:
        _slots.pop(url, None)


def mark_down(url: str) -> None:
    """Leave the replica at ``url`` alone for a while: it could not be reached."""
    with _lock:
        _down[url] = monotonic() + DOWN_SECONDS
        _slots.pop(url, None)


def _up(url: str) -> bool:
    with _lock:
        return _down.get(url, 0.0) <= monotonic()


def last_placed(session: ChatSession) -> Placed | None:
    """Where the session's last request went."""
    row = ModelRequest.objects.filter(session=session).order_by("-id").values_list("endpoint_url", "slot").first()
    return Placed(row[0], row[1]) if row is not None else None


def place(session: ChatSession, *, previous: Placed | None, avoid: frozenset[str] = frozenset()) -> Placed:
    """Where ``session``'s next request goes, after ``previous`` (its request before), never to ``avoid``."""
    endpoint = session.endpoint
    urls = [url for url in endpoint.urls if url not in avoid] or endpoint.urls
    up = [url for url in urls if _up(url)] or urls
    moved = ""
    if previous is not None and previous.url in up:
        url = previous.url
    else:
        url = up[session.pk % len(up)]
        if previous is not None and previous.url in endpoint.urls:
            moved = Moved.REPLICA
    api_key = endpoint.api_key or None
    slots, saves = server_slots(url, api_key=api_key)
    if slots < 1 or (slots == 1 and not saves):  # one slot and no saves: nothing to choose or keep
        return Placed(url, None, moved)
    if not saves and _is_crowded(url):
        return Placed(url, None, moved)
    before = previous.slot if previous is not None and previous.url == url else None
    taken = take_slot(session, url=url, slots=slots, previous=before, api_key=api_key, saves=saves)
    if taken.evicted is not None and not saves and taken.slot is not None:
        # More sessions than slots, and nothing can be saved: a slot asked for by id bypasses llama.cpp's
        # host-memory cache, which then keeps the prefixes better than taking slots from each other does.
        with _lock:
            _crowded[url] = monotonic() + CROWDED_SECONDS
        slot_release(url=url, slot=taken.slot)
        return Placed(url, None, moved)
    return Placed(url, taken.slot, moved or taken.moved)


def _is_crowded(url: str) -> bool:
    with _lock:
        return _crowded.get(url, 0.0) > monotonic()


def slot_file(session_id: int) -> str:
    """The file a session's prefix is saved in, under the server's ``--slot-save-path``."""
    return f"cachet-session-{session_id}.bin"


def take_slot(
    session: ChatSession, *, url: str, slots: int, previous: int | None, api_key: str | None, saves: bool
) -> SlotTaken:
    """Take a slot of the server at ``url`` for ``session``; where the server ``saves`` slots and another
    session's prefix was in it, save that first, and put the session's own saved prefix back."""
    taken = slot_take(session=session, url=url, slots=slots, previous=previous)
    if taken.slot is None or not saves:
        return taken
    try:
        if taken.evicted is not None:
            saved = server_api.slot_action(
                url, taken.slot, "save", slot_file(taken.evicted), api_key=api_key, timeout=SLOT_FILE_TIMEOUT
            )
            if saved is None:  # refused: the server may have been started again without saving
                forget_saving(url)
            tokens = saved.get("n_saved") if saved is not None else None
            if isinstance(tokens, int) and tokens >= MIN_SAVED_TOKENS:
                slot_saved(url=url, session_id=taken.evicted, tokens=tokens)
        if taken.saved_tokens >= MIN_SAVED_TOKENS:
            server_api.slot_action(
                url, taken.slot, "restore", slot_file(session.pk), api_key=api_key, timeout=SLOT_FILE_TIMEOUT
            )
    except server_api.ServerAPIError:
        pass  # out of reach: the request says so
    return taken


def placed_body(body: bytes, placed: Placed) -> bytes:
    """The request's bytes as sent to the slot: ``id_slot`` after everything else, so the prefix the server
    compares is the conversation's."""
    if placed.slot is None:
        return body
    assert body.endswith(b"}"), "a request body is a JSON object"
    return body[:-1] + b',"id_slot":%d}' % placed.slot


def release(request: ModelRequest) -> None:
    """The request is over: its slot is free again."""
    if request.slot is not None:
        slot_release(url=request.endpoint_url, slot=request.slot)


def forget() -> None:
    """Forget every slot count and replica left alone (tests)."""
    with _lock:
        _slots.clear()
        _down.clear()
        _crowded.clear()
