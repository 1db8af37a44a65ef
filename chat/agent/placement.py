"""Where a session's next request goes: one of its endpoint's replicas (URLs serving the same model) and, where
that server reports slots (llama.cpp's ``/props`` ``total_slots``), one slot of it
(``sessions_app.services.placement``).

A session sticks to its replica; a new one is given one by its number, so that sessions spread over the
replicas. It moves only when its replica cannot be reached: that replica is then left alone for
:data:`DOWN_SECONDS` by this process, and the request goes to the next one, recorded as moved ("replica").

A session that returns to a server where another session took its slot over (more sessions than slots) gets its
prefix back one of two ways. Where the server saves slots (llama.cpp's ``--slot-save-path``, asked once per
server start with ``server_api.slot_saving``, which touches no slot), the other session's prefix is saved to a
file first and the returning session's own put back: measured on the generated model, a slot of 6,830 tokens
saved in 60 ms and was put back in 33 ms, where computing it again took the returning request 4,816 tokens. A
prefix under :data:`MIN_SAVED_TOKENS` is computed again instead.

Where it does not, the slot is handed over first (``server_api.slot_handover``): a few tokens of no
conversation's go into it, so that llama.cpp moves what the slot held into its host-memory prompt cache
(``--cache-ram``, on by default) and loads the returning session's prefix from it. Left to itself, llama.cpp does
that only where the slot's prefix shares less than half its tokens with the request, and a short conversation
shares more than half with any other (the system prompt and tools): four sessions of 12 turns on two slots
processed 1.30x the floor left to llama.cpp's own choice, 1.00x handed over. A new session that takes over a
slot hands it over with the chat template's head instead, which saves the slot's prefix and loads no other: a
cached prefix loaded into a slot leaves the cache, so a new session that loaded another's (they share the system
prompt and tools) would leave that one nothing to come back to, and llama.cpp's own saves of idle slots come too
late where the next request is quicker than the server's release of the slot (and never, on a server of one
slot: there, handing over with foreign tokens made two sessions take each other's prefix at every turn, 1.67x
the floor). The new session computes the system prompt and tools itself, as it would on a server of its own. A
server whose handed-over slot served a request nothing from its cache (its prompt cache is
off, or it takes a named slot as it stands; three such before any served something) is left to place requests
itself once sessions outnumber its slots, for the rest of its run.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from time import monotonic

from chat.agent import server_api
from sessions_app.models import ChatSession, ModelRequest, Moved
from sessions_app.services.placement import SlotTaken, slot_release, slot_saved, slot_take

SLOTS_KEPT_SECONDS = 60.0  # how long a server's slot count is trusted before it is asked again
SLOTS_TIMEOUT = 3.0
DOWN_SECONDS = 30.0
CROWDED_SECONDS = 600.0  # how long a server that does not save slots is left to place requests itself
MIN_SAVED_TOKENS = 1024
HANDOVER_MISSES = 3  # handed-over slots that served nothing cached before any did: the server does not
MIN_HEAD_TOKENS = 2  # a request may share one token less with the template's head: still at least half of it
SLOT_FILE_TIMEOUT = 60.0  # a large model's slot is hundreds of megabytes

_lock = threading.Lock()


@dataclass(frozen=True)
class _Known:
    """What a server said: when, its slots (0: it says none), whether it saves them, and how it was started; and
    how its slots handed over fared: whether a request found anything cached after one, and how many found
    nothing while none had."""

    asked_at: float
    slots: int
    saves: bool
    started_as: str
    handover_served: bool = False
    handover_misses: int = 0

    @property
    def hands_over(self) -> bool:
        return self.handover_served or self.handover_misses < HANDOVER_MISSES


_slots: dict[str, _Known] = {}
_down: dict[str, float] = {}  # url: until when it is left alone
_crowded: dict[str, float] = {}  # url: until when its slots are left to it (more sessions than slots, none saved)
_handed_over: set[tuple[str, int]] = set()  # (url, slot): handed over for the request now running there


@dataclass(frozen=True)
class Placed:
    """Where a request goes: the server's base URL, the slot asked for (``None``: the server chooses), and why
    it is not where the session's request before went ("", "replica" or "slot")."""

    url: str
    slot: int | None = None
    moved: str = ""
    handover_tokens: int = 0  # computed by the server to hand the slot over (``server_api.slot_handover``)


@dataclass(frozen=True)
class ServerSlots:
    """What placement knows of a server: its slots (0: it says none), whether it saves them, and whether a slot
    handed over there is served from its prompt cache."""

    slots: int
    saves: bool
    hands_over: bool


def server_slots(url: str, *, api_key: str | None) -> ServerSlots:
    """What the server at ``url`` offers placement. Its ``/props`` is read at most every minute; whether it saves
    slots is asked once per server start (the first time, again when ``/props`` says it was started otherwise,
    after it was out of reach, or after a save or restore it refused) and never changes a slot
    (``server_api.slot_saving``); a handover that served nothing from the cache holds until the server's next
    start."""
    with _lock:
        known = _slots.get(url)
    if known is not None and monotonic() - known.asked_at < SLOTS_KEPT_SECONDS:
        return ServerSlots(known.slots, known.saves, known.hands_over)
    try:
        props = server_api.props(url, api_key=api_key, timeout=SLOTS_TIMEOUT)
        slots = props.total_slots if props is not None and props.total_slots else 0
        started_as = props.started_as if props is not None else ""
        same_start = known is not None and known.slots == slots and known.started_as == started_as
        if not same_start:
            server_api.forget_head(url)
        handovers = (known.handover_served, known.handover_misses) if known is not None and same_start else (False, 0)
        if slots < 1:
            saves = False
        elif known is not None and same_start:
            saves = known.saves
        else:
            saves = server_api.slot_saving(url, api_key=api_key, timeout=SLOTS_TIMEOUT)
    except server_api.ServerAPIError:
        return ServerSlots(0, False, False)  # out of reach: the request says so
    with _lock:
        _slots[url] = known = _Known(monotonic(), slots, saves, started_as, *handovers)
    return ServerSlots(slots, saves, known.hands_over)


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
    server = server_slots(url, api_key=api_key)
    left_to_server = not server.saves and not server.hands_over
    if server.slots < 1 or (left_to_server and (server.slots == 1 or _is_crowded(url))):
        return Placed(url, None, moved)
    before = previous.slot if previous is not None and previous.url == url else None
    taken = take_slot(session, url=url, slots=server.slots, previous=before, api_key=api_key, saves=server.saves)
    if taken.slot is None or taken.evicted is None or server.saves:
        return Placed(url, taken.slot, moved or taken.moved)
    if left_to_server:
        # More sessions than slots, nothing saved, and a named slot not served from the prompt cache: the server's
        # own choice keeps the prefixes better than taking slots from each other does.
        with _lock:
            _crowded[url] = monotonic() + CROWDED_SECONDS
        slot_release(url=url, slot=taken.slot)
        return Placed(url, None, moved)
    handover: str | tuple[int, ...] = server_api.HANDOVER_PROMPT
    if previous is None or previous.url != url:  # new here: save the slot's prefix, and take no cached one
        head = _template_head(url, api_key=api_key)
        if head is None and server.slots == 1:
            slot_release(url=url, slot=taken.slot)
            return Placed(url, None, moved)
        if head is None:
            return Placed(url, taken.slot, moved or taken.moved)
        handover = head
    try:
        computed = server_api.slot_handover(
            url, taken.slot, prompt=handover, api_key=api_key, timeout=SLOT_FILE_TIMEOUT
        )
    except server_api.ServerAPIError:
        return Placed(url, taken.slot, moved or taken.moved)  # out of reach: the request says so
    with _lock:
        if computed is None:  # no /completion here: its slots cannot be handed over
            _not_handing_over(url)
        elif handover == server_api.HANDOVER_PROMPT:
            _handed_over.add((url, taken.slot))
    return Placed(url, taken.slot, moved or taken.moved, handover_tokens=computed or 0)


def _template_head(url: str, *, api_key: str | None) -> tuple[int, ...] | None:
    try:
        head = server_api.template_head(url, api_key=api_key, timeout=SLOTS_TIMEOUT)
    except server_api.ServerAPIError:
        return None
    return head if head is not None and len(head) >= MIN_HEAD_TOKENS else None


def _not_handing_over(url: str) -> None:
    known = _slots.get(url)
    if known is not None:
        _slots[url] = replace(known, handover_misses=HANDOVER_MISSES)


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


def release(request: ModelRequest, *, cached_tokens: int | None) -> None:
    """The request is over (``cached_tokens``: as many of its prompt's as the server found cached, where it
    answered): its slot is free again."""
    if request.slot is not None:
        release_slot(url=request.endpoint_url, slot=request.slot, cached_tokens=cached_tokens)


def release_slot(*, url: str, slot: int, cached_tokens: int | None) -> None:
    """The request placed in ``slot`` of the server at ``url`` is over; where that slot was handed over for it,
    what the server found cached tells whether it serves a handed-over slot from its cache: one that found some
    settles it, :data:`HANDOVER_MISSES` that found none before any did settle it the other way (a prefix pushed
    out of a full cache finds none too)."""
    with _lock:
        handed_over = (url, slot) in _handed_over
        _handed_over.discard((url, slot))
        known = _slots.get(url)
        if handed_over and cached_tokens is not None and known is not None and not known.handover_served:
            if cached_tokens > 0:
                _slots[url] = replace(known, handover_served=True)
            else:
                _slots[url] = replace(known, handover_misses=known.handover_misses + 1)
    slot_release(url=url, slot=slot)


def forget() -> None:
    """Forget every slot count and replica left alone (tests)."""
    with _lock:
        _slots.clear()
        _down.clear()
        _crowded.clear()
        _handed_over.clear()
