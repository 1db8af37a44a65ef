"""Running a reply loop's action to its end in a test, and reading what it yielded."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from chat.agent.events import Compacted, ReplyEvent, TextDelta, TurnEnded, TurnsTakenBack
from sessions_app.models import Generation, Turn
from testing.drive import run_to_end


@dataclass
class Ran:
    events: list[ReplyEvent]

    @property
    def turn(self) -> Turn:
        ended = [event.turn for event in self.events if isinstance(event, TurnEnded)]
        assert ended, f"the action ended no turn: {self.events}"
        return ended[-1]

    @property
    def taken_back(self) -> TurnsTakenBack:
        taken = [event for event in self.events if isinstance(event, TurnsTakenBack)]
        assert taken, f"the action took nothing back: {self.events}"
        return taken[-1]

    @property
    def compacted(self) -> Generation:
        generations = [event.generation for event in self.events if isinstance(event, Compacted)]
        assert generations, f"the action compacted nothing: {self.events}"
        return generations[-1]

    @property
    def text(self) -> str:
        return "".join(event.text for event in self.events if isinstance(event, TextDelta))


Each = Callable[[ReplyEvent], None]


def run(action: AsyncGenerator[ReplyEvent, None], *, each: Each | None = None) -> Ran:
    """Iterate ``action`` to its end (its store calls on the test's thread, inside the test's transaction), calling
    ``each`` with every event as it comes (on the test's thread too: it may change the store, set a cancel)."""
    return Ran(run_to_end(action, each=each))
