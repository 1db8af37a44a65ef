"""Stopping a request from any thread.

``Cancel`` is a ``threading.Event`` whose ``set()`` also runs the hooks registered by whatever waits on the model
at that moment: a stream waiting for the server's next bytes is interrupted at once, with no polling. Tools that
run long look at ``is_set()`` between their own waits.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


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


@contextlib.contextmanager
def woken_by(cancel: Cancel | None, wake: Callable[[], None]) -> Iterator[None]:
    """Within the block, setting ``cancel`` calls ``wake``."""
    if cancel is None:
        yield
        return
    with cancel.hooked(wake):
        yield
