"""Which slot a session's request asks for: the one holding its prefix, else the least recently used free one;
a slot busy with another session's request is left to it, and a worker that died frees its slot in time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from chat.tools import tool_list
from sessions_app.models import ChatSession, ModelEndpoint, ServerSlot, Workspace
from sessions_app.services.placement import SlotTaken, slot_release, slot_saved, slot_take
from sessions_app.services.sessions import session_start

pytestmark = pytest.mark.django_db

URL = "http://model.lan:8080/v1"


def _sessions(user: Any, workspace: Workspace, endpoint: ModelEndpoint, count: int) -> list[ChatSession]:
    tools = tool_list(allow_commands=False)
    return [
        session_start(owner=user, workspace=workspace, endpoint=endpoint, model_name="m", tools=tools)
        for _ in range(count)
    ]


def _taken(session: ChatSession, previous: int | None = None, slots: int = 2) -> SlotTaken:
    taken = slot_take(session=session, url=URL, slots=slots, previous=previous)
    if taken.slot is not None:
        slot_release(url=URL, slot=taken.slot)
    return taken


def test_sessions_taking_turns_keep_their_own_slots(user: Any, workspace: Workspace, endpoint: ModelEndpoint) -> None:
    a, b = _sessions(user, workspace, endpoint, 2)
    assert _taken(a) == SlotTaken(0, "")
    assert _taken(b) == SlotTaken(1, "")  # never used: nothing to save
    for _ in range(3):
        assert _taken(a, previous=0) == SlotTaken(0, "")
        assert _taken(b, previous=1) == SlotTaken(1, "")


def test_a_session_whose_slot_was_taken_over_gets_the_least_recently_used_one(
    user: Any, workspace: Workspace, endpoint: ModelEndpoint
) -> None:
    a, b, c = _sessions(user, workspace, endpoint, 3)
    _taken(a)
    _taken(b)
    assert _taken(c) == SlotTaken(0, "", evicted=a.pk), "slot 0 was used least recently: c takes it over from a"
    slot_saved(url=URL, session_id=a.pk, tokens=2048)  # the worker saved a's prefix before c's request
    assert _taken(a, previous=0) == SlotTaken(1, "slot", evicted=b.pk, saved_tokens=2048), "held nowhere: put back"


def test_a_slot_busy_with_another_session_is_left_to_it(
    user: Any, workspace: Workspace, endpoint: ModelEndpoint
) -> None:
    a, b = _sessions(user, workspace, endpoint, 2)
    _taken(a)
    _taken(b)
    assert slot_take(session=b, url=URL, slots=2, previous=1) == SlotTaken(1, "")  # b's request runs there
    assert slot_take(session=a, url=URL, slots=2, previous=0) == SlotTaken(0, "")
    assert slot_take(session=a, url=URL, slots=2, previous=0) == SlotTaken(0, ""), "its own request before is no rival"
    c = _sessions(user, workspace, endpoint, 1)[0]
    assert slot_take(session=c, url=URL, slots=2, previous=None) == SlotTaken(None, ""), "all busy: the server chooses"
    ServerSlot.objects.filter(url=URL, slot=1).update(busy_until=timezone.now() - timedelta(seconds=1))
    taken = slot_take(session=c, url=URL, slots=2, previous=None)
    assert taken == SlotTaken(1, "", evicted=b.pk), "a died worker's slot passes"
