"""A clock the test moves, for code whose behaviour depends on time passing: deterministic, and no test waits."""

from __future__ import annotations

import time
from typing import Any


class Clock:
    """The ``time`` module as one module under test sees it (``monkeypatch.setattr(module, "time", clock)``):
    ``monotonic`` and ``time`` stand still until the test calls :meth:`advance`; everything else is the real
    module's."""

    def __init__(self) -> None:
        self.now = time.monotonic()
        self._wall_offset = time.time() - self.now

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now + self._wall_offset

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)
