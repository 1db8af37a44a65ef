"""Stopping a request from another thread.

``Cancel`` is a ``threading.Event`` whose ``set()`` also runs the hooks registered by whatever waits on the model
at that moment: a stream waiting for the server's next bytes is woken at once, with no polling. A plain
``threading.Event`` is still accepted where a cancel is asked for, for callers not yet moved to ``Cancel``: a
stream given one looks at it every ``PLAIN_EVENT_SECONDS`` while it waits, as the client always did before.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

PLAIN_EVENT_SECONDS = 0.05  # how often a wait looks at a plain event (a ``Cancel`` wakes it instead)


class Cancel(threading.Event):
    """An event that wakes, when set, what waits on it (see ``woken_by``)."""

    def __init__(self) -> None:
        super().__init__()
        self._hooks: list[Callable[[], None]] = []
        self._hooks_lock = threading.Lock()

    def set(self) -> None:
        """Set the event and run the hooks registered now (each once, on the calling thread)."""
        super().set()
        with self._hooks_lock:
            hooks = list(self._hooks)
        for hook in hooks:
            hook()

    @contextlib.contextmanager
    def hooked(self, hook: Callable[[], None]) -> Iterator[None]:
        """Run ``hook`` when the event is set while the block runs (at once, where it is set already)."""
        with self._hooks_lock:
            self._hooks.append(hook)
        try:
            if self.is_set():
                hook()
            yield
        finally:
            with self._hooks_lock:
                self._hooks.remove(hook)


def longest_wait(cancel: threading.Event | None) -> float:
    """How long a wait may last before it looks at ``cancel`` again: as long as it likes, unless ``cancel`` is a
    plain event, which cannot wake it."""
    return PLAIN_EVENT_SECONDS if cancel is not None and not isinstance(cancel, Cancel) else float("inf")


@contextlib.contextmanager
def woken_by(cancel: threading.Event | None, wake: Callable[[], None]) -> Iterator[None]:
    """Within the block, setting ``cancel`` calls ``wake`` (where ``cancel`` is a ``Cancel``; a plain event only
    says it is set when asked)."""
    if isinstance(cancel, Cancel):
        with cancel.hooked(wake):
            yield
    else:
        yield
