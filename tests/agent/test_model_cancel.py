"""``Cancel``: a threading.Event whose ``set()`` wakes what waits on it."""

from __future__ import annotations

from chat.agent.model.cancel import Cancel, woken_by


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


def test_without_a_cancel_nothing_is_hooked() -> None:
    woken: list[bool] = []
    with woken_by(None, lambda: woken.append(True)):
        pass
    assert woken == []
