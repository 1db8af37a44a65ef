"""Which slot of a model server a session's next request asks for (``id_slot``), kept in Postgres so that every
worker places by the same record.

A slot holds the prefix of the session whose request it ran last. A session asks for the slot that holds its
prefix; where none does (it is new, or another session took its slot over), for the slot used least recently;
where the slot that holds it is busy with another request, for the least recently used free one. llama.cpp's
own placement compares prompts, and the system prompt every session shares makes every slot look like every
session's: two sessions taking turns on a two-slot server each processed 4,000-4,800 tokens a turn where 15 do
(``README``, "The model server").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from sessions_app.models import ChatSession, Moved, ServerSlot, SlotSave

BUSY_SECONDS = 900  # a request placed longer ago than this no longer holds its slot (its worker died)


@dataclass(frozen=True)
class SlotTaken:
    """The slot a request asks for, why it is not the one the session's request before asked for, the session
    whose prefix the slot held until now (another's: to save first, where the server can), and the tokens of this
    session's own prefix saved earlier (to put back first; 0: none saved)."""

    slot: int | None  # None: every slot is busy, the server chooses
    moved: str  # "" or Moved.SLOT
    evicted: int | None = None
    saved_tokens: int = 0


@transaction.atomic
def slot_take(*, session: ChatSession, url: str, slots: int, previous: int | None) -> SlotTaken:
    """Take a slot of the server at ``url`` (``slots`` in all) for ``session``'s next request; ``previous``: the
    slot its request before asked for there."""
    ServerSlot.objects.bulk_create([ServerSlot(url=url, slot=number) for number in range(slots)], ignore_conflicts=True)
    rows = list(ServerSlot.objects.select_for_update(no_key=True).filter(url=url, slot__lt=slots).order_by("slot"))
    now = timezone.now()
    # A session's own requests come one after another: a slot busy with its request before is free for it.
    free = [row for row in rows if row.busy_until is None or row.busy_until < now or row.session_id == session.pk]
    held = [row for row in free if row.session_id == session.pk]
    if held:
        chosen = held[0]
    elif free:
        chosen = min(free, key=lambda row: (row.used_at is not None, row.used_at or now, row.slot))
    else:
        return SlotTaken(None, Moved.SLOT if previous is not None else "")
    holder = chosen.session_id
    chosen.session_id = session.pk
    chosen.used_at = now
    chosen.busy_until = now + timedelta(seconds=BUSY_SECONDS)
    chosen.save(update_fields=["session", "used_at", "busy_until"])
    moved = Moved.SLOT if previous is not None and chosen.slot != previous else ""
    if holder == session.pk:
        return SlotTaken(chosen.slot, moved)
    saved = SlotSave.objects.filter(url=url, session=session).values_list("tokens", flat=True).first()
    return SlotTaken(chosen.slot, moved, evicted=holder, saved_tokens=saved or 0)


def slot_release(*, url: str, slot: int) -> None:
    """The request placed in ``slot`` is over: the slot is free, and holds its session's prefix."""
    ServerSlot.objects.filter(url=url, slot=slot).update(busy_until=None, used_at=timezone.now())


def slot_saved(*, url: str, session_id: int, tokens: int) -> None:
    """The session's prefix, ``tokens`` long, is saved out of its slot on the server at ``url``."""
    SlotSave.objects.update_or_create(
        url=url, session_id=session_id, defaults={"tokens": tokens, "saved_at": timezone.now()}
    )
