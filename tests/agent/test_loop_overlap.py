"""Between two requests of a reply the model server waits only for what the next request needs: the answer, the step
and its results stored (none of them waiting for the disk unless a call may change something), the request
recorded; each is shown as soon as it is stored. The last request's bytes are kept once, as the action ends."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat.agent import loop as loop_module
from chat.agent.events import (
    ReplyEvent,
    RequestFinished,
    RequestStarted,
    ResultStored,
    StepStored,
    TextDelta,
    TurnEnded,
    TurnStarted,
)
from chat.agent.loop import ReplyLoop
from chat.agent.model import Cancel, HttpModel, ModelStream
from sessions_app.errors import StoreError
from sessions_app.models import BreakCause, ChatSession, LastRequest, ModelRequest, RequestStatus, TurnStatus
from sessions_app.selectors.requests import RequestBuilder, previous_request
from sessions_app.services.durability import WITHOUT_WAITING
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db(transaction=True)


def _two_reads_then_answer(scripted: ScriptedServer, workspace_dir: Path) -> None:
    (workspace_dir / "a.py").write_text("print('a')\n")
    scripted.push(Step(tool_calls=[("read", {"path": "a.py"})]))
    scripted.push(Step(tool_calls=[("read", {"path": "a.py", "offset": 1, "limit": 1})]))
    scripted.push(Step(text="Done."))


def test_a_step_and_its_results_are_shown_as_soon_as_they_are_stored(
    scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path
) -> None:
    _two_reads_then_answer(scripted, workspace_dir)
    kinds: list[str] = []
    recorded_when_step_shown: list[int] = []
    unfinished_when_step_shown: list[int] = []

    def seen(event: ReplyEvent) -> None:
        if not isinstance(event, TextDelta):
            kinds.append(type(event).__name__)
        if isinstance(event, StepStored):
            requests = ModelRequest.objects.filter(session=scripted_session)
            recorded_when_step_shown.append(requests.count())
            unfinished_when_step_shown.append(requests.filter(status=RequestStatus.SENDING).count())

    run(ReplyLoop(scripted_session).send("read it twice"), each=seen)
    assert kinds == [
        "TurnStarted",
        "RequestStarted",
        "ToolCalled",
        "RequestFinished",
        "StepStored",
        "ResultStored",
        "RequestStarted",
        "ToolCalled",
        "RequestFinished",
        "StepStored",
        "ResultStored",
        "RequestStarted",
        "RequestFinished",
        "StepStored",
        "TurnEnded",
    ], "the events keep their order"
    assert recorded_when_step_shown == [1, 2, 3], "a step is shown before the next request is recorded"
    assert unfinished_when_step_shown == [0, 0, 0], "…and after its own request's record"
    assert len(scripted.requests) == 3
    assert all(r.status == RequestStatus.DONE for r in ModelRequest.objects.filter(session=scripted_session))


def test_the_last_requests_bytes_are_kept_once_as_the_action_ends(
    scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path
) -> None:
    _two_reads_then_answer(scripted, workspace_dir)
    with CaptureQueriesContext(connection) as queries:
        run(ReplyLoop(scripted_session).send("read it twice"))
    kept = [q["sql"] for q in queries.captured_queries if "sessions_app_lastrequest" in q["sql"]]
    assert len([sql for sql in kept if sql.startswith("INSERT")]) == 1, kept
    last = ModelRequest.objects.filter(session=scripted_session).order_by("-id").first()
    body = bytes(LastRequest.objects.get(session=scripted_session).body)
    assert last is not None and hashlib.sha256(body).hexdigest() == last.body_sha256
    assert body == scripted.requests[-1]
    scripted.push(Step(text="Again."))
    run(ReplyLoop(scripted_session).send("and now?"))
    newest = ModelRequest.objects.filter(session=scripted_session).order_by("-id").first()
    assert newest is not None and newest.break_cause == BreakCause.NEW_TURN
    assert newest.shared_prefix_bytes >= newest.expected_shared_bytes > 0


def test_a_reply_stopped_between_steps_records_everything_and_keeps_the_last_request(
    scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path
) -> None:
    (workspace_dir / "a.py").write_text("print('a')\n")
    scripted.push(Step(tool_calls=[("read", {"path": "a.py"})]))
    scripted.push(Step(text="x" * 400, chunk_size=4, delay=0.01))
    cancel = Cancel()

    def stop_at_the_text(event: ReplyEvent) -> None:
        if isinstance(event, TextDelta):
            cancel.set()

    seen = run(ReplyLoop(scripted_session, cancel=cancel).send("read, then talk"), each=stop_at_the_text).events
    assert isinstance(seen[0], TurnStarted) and isinstance(seen[-1], TurnEnded)
    assert seen[-1].turn.status == TurnStatus.INTERRUPTED
    assert [type(e) for e in seen if isinstance(e, StepStored | ResultStored | RequestFinished | RequestStarted)] == [
        RequestStarted,
        RequestFinished,
        StepStored,
        ResultStored,
        RequestStarted,
        RequestFinished,
    ]
    statuses = list(
        ModelRequest.objects.filter(session=scripted_session).order_by("id").values_list("status", flat=True)
    )
    assert statuses == [RequestStatus.DONE, RequestStatus.FAILED]
    previous = previous_request(scripted_session)
    assert previous.known and previous.body == scripted.requests[-1]


def test_a_closed_action_still_records_the_answer_it_held(
    scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path
) -> None:
    _two_reads_then_answer(scripted, workspace_dir)

    async def closed_after_a_result() -> None:
        action = ReplyLoop(scripted_session).send("read it twice")
        async for event in action:
            if isinstance(event, ResultStored):
                break  # the step's answer and result are out
        await action.aclose()

    async_to_sync(closed_after_a_result)()
    statuses = list(
        ModelRequest.objects.filter(session=scripted_session).order_by("id").values_list("status", flat=True)
    )
    assert statuses[0] == RequestStatus.DONE and RequestStatus.SENDING not in statuses, statuses
    assert previous_request(scripted_session).known


COMMIT = "COMMIT"


def _statements(session: ChatSession, words: str, monkeypatch: Any) -> list[str]:
    """The statements of one send, with a ``COMMIT`` where each transaction ended (after each statement run
    outside ``atomic``, which is a transaction of its own)."""
    statements: list[str] = []

    def note(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        alone = not connection.in_atomic_block
        try:
            return execute(sql, params, many, context)
        finally:
            if alone:
                statements.append(COMMIT)

    commit = connection._commit  # type: ignore[attr-defined]

    def noted_commit() -> None:
        commit()
        statements.append(COMMIT)

    monkeypatch.setattr(connection, "_commit", noted_commit)
    with connection.execute_wrapper(note):
        run(ReplyLoop(session).send(words))
    return statements


def _at(statements: list[str], part: str) -> list[int]:
    return [i for i, sql in enumerate(statements) if part in sql]


def _waits(statements: list[str], index: int) -> bool:
    """Whether the transaction of the statement at ``index`` waits for the disk as it commits."""
    begun = max([i for i, sql in enumerate(statements) if sql == COMMIT and i < index], default=-1) + 1
    ended = min([i for i, sql in enumerate(statements) if sql == COMMIT and i > index], default=len(statements))
    return not any(WITHOUT_WAITING in sql for sql in statements[begun:ended])


def test_a_reply_that_only_reads_waits_for_the_disk_once_as_its_turn_ends(
    scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path, monkeypatch: Any
) -> None:
    (workspace_dir / "a.py").write_text("print('a')\n")
    scripted.push(Step(tool_calls=[("read", {"path": "a.py"}), ("read", {"path": "a.py", "limit": 1})]))
    scripted.push(Step(text="Done."))
    statements = _statements(scripted_session, "read it", monkeypatch)
    results = _at(statements, 'INSERT INTO "sessions_app_result"')
    requests = _at(statements, 'INSERT INTO "sessions_app_modelrequest"')
    answers = _at(statements, 'UPDATE "sessions_app_modelrequest" SET "status"')
    steps = _at(statements, 'INSERT INTO "sessions_app_step"')
    finishes = _at(statements, 'UPDATE "sessions_app_turn" SET "reply_text"')
    assert len(results) == 2 and len(requests) == 2 and len(answers) == 2 and len(steps) == 2
    assert len(finishes) == 1
    assert not any(_waits(statements, i) for i in results), "a result's commit does not wait…"
    assert not any(_waits(statements, i) for i in requests), "…nor the record of the request that carries it…"
    assert not any(_waits(statements, i) for i in answers), "…nor an answer's record…"
    assert not any(_waits(statements, i) for i in steps), "…nor a step that only reads or ends the reply"
    assert finishes[0] > steps[-1] and _waits(statements, finishes[0]), "the turn's end waits, and takes them along"


@pytest.mark.parametrize("tool", ["write", "edit", "run"])
def test_a_step_whose_call_may_change_something_is_on_disk_before_the_call_runs(
    scripted_session: ChatSession, scripted: ScriptedServer, workspace_dir: Path, tool: str, monkeypatch: Any
) -> None:
    (workspace_dir / "a.py").write_text("print('a')\n")
    arguments = {
        "write": {"path": "b.py", "content": "b = 1\n"},
        "edit": {"path": "a.py", "old_string": "'a'", "new_string": "'b'"},
        "run": {"command": "true"},
    }[tool]
    scripted.push(Step(tool_calls=[("read", {"path": "a.py"}), (tool, arguments)]))
    scripted.push(Step(text="Done."))
    statements = _statements(scripted_session, "change it", monkeypatch)
    steps = _at(statements, 'INSERT INTO "sessions_app_step"')
    assert len(steps) == 2
    assert _waits(statements, steps[0]), "the step with the call waits for the disk"
    assert not _waits(statements, steps[1]), "the last step goes with the turn's end"


def test_a_new_turns_history_is_read_once(
    scripted_session: ChatSession, scripted: ScriptedServer, settings: Any
) -> None:
    settings.CACHET_CHECK_REQUESTS = False  # that check reads the history again at every step, by design
    scripted.push(Step(text="First."))
    run(ReplyLoop(scripted_session).send("one"))
    scripted.push(Step(text="Second."))
    with CaptureQueriesContext(connection) as queries:
        run(ReplyLoop(scripted_session).send("two"))
    reasoning_reads = [q["sql"] for q in queries.captured_queries if '"reasoning" AS "reasoning"' in q["sql"]]
    assert len(reasoning_reads) == 1, "the compaction check's history is the request's history"
    second = scripted_session.turns.order_by("-number").first()
    assert second is not None
    afresh = RequestBuilder(scripted_session, model_name=scripted_session.model_name, current=second, upto_step=0)
    assert scripted.requests[-1] == afresh.build().body


def test_a_request_whose_record_fails_is_stopped_and_the_turn_fails_with_the_words_kept(
    scripted_session: ChatSession, scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request is recorded before it goes out: where the record fails, nothing is sent."""
    scripted.push(Step(text="x" * 400, chunk_size=4, delay=0.05))  # five seconds of answer, never read
    streams: list[ModelStream] = []
    plain_stream = HttpModel.stream

    def watched(model: HttpModel, body: bytes, *, cancel: Cancel) -> ModelStream:
        stream = plain_stream(model, body, cancel=cancel)
        streams.append(stream)
        return stream

    def failing(**kwargs: Any) -> Any:
        raise StoreError("The database is unavailable; your message is kept.")

    monkeypatch.setattr(HttpModel, "stream", watched)
    monkeypatch.setattr(loop_module, "request_record_start", failing)
    events = run(ReplyLoop(scripted_session).send("hello there")).events
    ended = events[-1]
    assert isinstance(ended, TurnEnded) and ended.turn.status == TurnStatus.FAILED
    assert ended.turn.words == "hello there" and "database is unavailable" in ended.turn.error
    assert not ModelRequest.objects.filter(session=scripted_session).exists()
    assert streams == [] and scripted.requests == [], "nothing was sent"
