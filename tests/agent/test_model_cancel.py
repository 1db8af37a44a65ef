"""``Cancel``: a threading.Event whose ``set()`` wakes what waits on it."""

from __future__ import annotations

import threading

from chat.agent.model.cancel import PLAIN_EVENT_SECONDS, Cancel, longest_wait, woken_by


def test_set_runs_the_hooks_registered_while_they_are() -> None:
    cancel = Cancel()
    woken: list[str] = []
    with woken_by(cancel, lambda: woken.append("a")):
        assert woken == []
        cancel.set()
        assert woken == ["a"]
    cancel.clear()
    cancel.set()
    assert woken == ["a"], "a hook whose block has ended is not run"


def test_a_hook_registered_on_a_set_cancel_runs_at_once() -> None:
    cancel = Cancel()
    cancel.set()
    woken: list[bool] = []
    with woken_by(cancel, lambda: woken.append(True)):
        assert woken == [True]


def test_a_plain_event_wakes_nothing_and_is_looked_at_often() -> None:
    event = threading.Event()
    woken: list[bool] = []
    with woken_by(event, lambda: woken.append(True)):
        event.set()
    assert woken == []
    assert longest_wait(event) == PLAIN_EVENT_SECONDS
    assert longest_wait(Cancel()) == float("inf")
    assert longest_wait(None) == float("inf")
