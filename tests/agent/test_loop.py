from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat.agent.events import BranchFlipped, ReplyEvent, ResultStored, TextDelta, TurnEnded
from chat.agent.loop import ReplyLoop
from chat.agent.model import Cancel, Timeouts
from chat.tools import tool_list
from sessions_app.errors import FolderRefused, NotAMember, ReplyInProgress
from sessions_app.models import (
    BreakCause,
    ChatSession,
    Generation,
    ModelEndpoint,
    ModelRequest,
    RequestKind,
    Result,
    Turn,
    TurnStatus,
    Workspace,
)
from sessions_app.selectors.requests import build_request
from sessions_app.services.locks import reply_lock
from sessions_app.services.sessions import session_start
from sessions_app.services.turns import turn_start
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db(transaction=True)

FAST = Timeouts(connect=2.0, first_token=1.5, between_chunks=1.0)


def _loop(session: ChatSession, **kwargs: Any) -> ReplyLoop:
    return ReplyLoop(ChatSession.objects.get(pk=session.pk), client_timeouts=FAST, **kwargs)


def _messages(body: bytes) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = json.loads(body)["messages"]
    return messages


def test_text_reply_is_stored_with_its_request(scripted: ScriptedServer, scripted_session: ChatSession) -> None:
    scripted.push(Step(text="Hello **there**.", reasoning="thinking"))
    outcome = run(_loop(scripted_session).send("hi", date="2026-11-29"))
    turn = outcome.turn
    assert turn.status == TurnStatus.DONE
    assert turn.reply_text == "Hello **there**."
    assert outcome.text == "Hello **there**."
    kinds = [type(event).__name__ for event in outcome.events if type(event).__name__ != "TextDelta"]
    assert kinds[:2] == ["TurnStarted", "RequestStarted"]
    assert kinds[-3:] == ["RequestFinished", "StepStored", "TurnEnded"]
    assert "Date: 2026-11-29." in turn.message
    request = ModelRequest.objects.get(session=scripted_session)
    assert request.break_cause == BreakCause.FIRST
    assert request.bytes_sent == len(scripted.requests[0])
    assert request.body_sha256 == hashlib.sha256(scripted.requests[0]).hexdigest()
    assert request.prompt_tokens and request.completion_tokens
    assert request.time_to_first_token is not None and request.total_time is not None
    assert request.usage is not None and request.timings is not None
    assert turn.steps.get().reasoning == "thinking"


def test_tool_steps_run_in_order_and_continue_the_prefix(
    scripted: ScriptedServer, scripted_session: ChatSession, workspace_dir: Path
) -> None:
    (workspace_dir / "app.py").write_text("import os\nprint('a')\n")
    scripted.push(
        Step(
            text="Reading.",
            tool_calls=[("read", {"path": "app.py"}), ("grep", {"pattern": "print"})],
            chunk_size=2,
        ),
        Step(tool_calls=[("edit", {"path": "app.py", "old_string": "'a'", "new_string": "'b'"})]),
        Step(tool_calls=[("read", {"path": "app.py"}), ("nope", {}), ("read", '{"path": ')]),
        Step(text="Done."),
    )
    turn = run(_loop(scripted_session).send("change a to b")).turn
    assert turn.status == TurnStatus.DONE
    assert turn.reply_text == "Reading.\n\nDone."
    assert (workspace_dir / "app.py").read_text() == "import os\nprint('b')\n"
    results = list(Result.objects.filter(session=scripted_session).order_by("number"))
    assert [r.tool for r in results] == ["read", "grep", "edit", "read", "nope", "read"]
    assert results[0].inserted_text.startswith("[#0001 app.py lines 1-2 of 2 sha ")
    assert results[1].inserted_text == f"[#0002]\n{workspace_dir}/app.py:2: print('a')"
    assert "Earlier reads of this file are stale: #0001." in results[2].inserted_text
    assert results[3].kind == "read"
    assert results[4].inserted_text.startswith("[#0005] There is no tool named nope.")
    assert results[5].inserted_text.startswith("[#0006] The arguments of read are not valid JSON")
    bodies = scripted.requests
    assert len(bodies) == 4
    for earlier, later in itertools.pairwise(bodies):
        assert later.startswith(earlier[:-2])
    assert [r.break_cause for r in ModelRequest.objects.filter(session=scripted_session).order_by("id")] == [
        BreakCause.FIRST,
        "",
        "",
        "",
    ]
    last = _messages(bodies[-1])
    step_roles = ["assistant", "tool", "tool", "assistant", "tool", "assistant", "tool", "tool", "tool"]
    assert [m["role"] for m in last] == ["system", "user", *step_roles]
    assert last[2]["tool_calls"][1]["function"]["arguments"] == '{"pattern": "print"}'


def test_next_turn_carries_earlier_replies_as_text_only(
    scripted: ScriptedServer, scripted_session: ChatSession, workspace_dir: Path
) -> None:
    (workspace_dir / "a.txt").write_text("one\n")
    scripted.push(Step(tool_calls=[("read", {"path": "a.txt"})]), Step(text="It says one."), Step(text="Yes."))
    loop = _loop(scripted_session)
    run(loop.send("what is in a.txt?"))
    run(loop.send("sure?"))
    second = _messages(scripted.requests[2])
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2] == {"role": "assistant", "content": "It says one."}
    assert "Today's date" not in second[3]["content"]
    request = ModelRequest.objects.filter(session=scripted_session).order_by("-id").first()
    assert request is not None and request.break_cause == BreakCause.NEW_TURN
    first_user_end = scripted.requests[1].index(b'"role":"assistant"')
    assert request.shared_prefix_bytes >= first_user_end - 2


def test_single_step_replies_never_break_the_prefix(scripted: ScriptedServer, scripted_session: ChatSession) -> None:
    scripted.push(Step(text="one"), Step(text="two"), Step(text="three"))
    loop = _loop(scripted_session)
    for words in ("a", "b", "c"):
        run(loop.send(words))
    causes = list(
        ModelRequest.objects.filter(session=scripted_session).order_by("id").values_list("break_cause", flat=True)
    )
    assert causes == [BreakCause.FIRST, "", ""]
    requests = ModelRequest.objects.filter(session=scripted_session).order_by("id")
    assert [r.cached_tokens is not None and r.cached_tokens > 0 for r in requests] == [False, True, True]


def test_undo_rewind_and_regenerate_explain_their_breaks(
    scripted: ScriptedServer, scripted_session: ChatSession, workspace_dir: Path
) -> None:
    (workspace_dir / "f.txt").write_text("x\n")
    scripted.push(*(Step(text=f"reply {n}") for n in range(1, 4)))
    loop = _loop(scripted_session)
    for words in ("one", "two", "three"):
        run(loop.send(words))
    taken = run(loop.undo()).taken_back
    assert [t.number for t in taken.turns] == [3]
    scripted.push(Step(text="reply 4"))
    run(loop.send("four"))
    assert ModelRequest.objects.filter(session=scripted_session).order_by("-id")[0].break_cause == BreakCause.UNDO
    run(loop.rewind(2))
    scripted.push(Step(text="reply 5"))
    fifth = run(loop.send("five")).turn
    assert fifth.number == 5
    assert ModelRequest.objects.filter(session=scripted_session).order_by("-id")[0].break_cause == BreakCause.REWIND
    scripted.push(Step(text="reply 5 again"))
    outcome = run(loop.regenerate())
    assert outcome.turn.number == 6 and outcome.turn.message == fifth.message
    regenerated = ModelRequest.objects.filter(session=scripted_session).order_by("-id")[0]
    assert regenerated.break_cause == "", "asking again with the same message continues the prefix"
    live = Turn.objects.filter(session=scripted_session).exclude(status=TurnStatus.TAKEN_BACK)
    assert [t.number for t in live.order_by("number")] == [1, 6]
    assert [m["role"] for m in _messages(scripted.requests[-1])] == ["system", "user", "assistant", "user"]


def _texts(body: bytes) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in _messages(body)[1:]]


def _last_cause(session: ChatSession) -> str:
    return str(ModelRequest.objects.filter(session=session).order_by("-id")[0].break_cause)


def test_edit_branches_and_a_flip_builds_the_next_request_from_the_flipped_branch(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    scripted.push(*(Step(text=f"reply {n}") for n in range(1, 4)))
    loop = _loop(scripted_session, date="2026-11-30")
    for words in ("one", "two", "three"):
        run(loop.send(words))
    scripted.push(Step(text="reply uno"))
    edited = run(loop.edit(1, "uno"))
    assert [t.number for t in edited.taken_back.turns] == [3, 2, 1]
    assert (edited.turn.number, edited.turn.position, edited.turn.reply_text) == (4, 1, "reply uno")
    assert [role for role, _ in _texts(scripted.requests[-1])] == ["user"]
    assert _messages(scripted.requests[-1])[1]["content"].startswith("uno")
    assert _last_cause(scripted_session) == BreakCause.BRANCH
    flipped = [event for event in run(loop.flip(1)).events if isinstance(event, BranchFlipped)]
    assert [t.number for t in flipped[0].made_live] == [1, 2, 3]
    assert [t.number for t in flipped[0].taken_back] == [4]
    scripted.push(Step(text="reply 4"))
    run(loop.send("four"))
    texts = _texts(scripted.requests[-1])
    assert [text for role, text in texts if role == "assistant"] == ["reply 1", "reply 2", "reply 3"]
    assert texts[-1][1].startswith("four")
    assert _last_cause(scripted_session) == BreakCause.BRANCH


def test_regenerate_keeps_the_first_reply_and_a_flip_brings_it_back(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    scripted.push(Step(text="first answer"), Step(text="second answer"))
    loop = _loop(scripted_session)
    first = run(loop.send("question")).turn
    again = run(loop.regenerate()).turn
    assert (again.parent_id, again.position) == (first.parent_id, first.position) == (None, 1)
    run(loop.flip(first.number))
    scripted.push(Step(text="ok"))
    run(loop.send("go on"))
    assert [text for role, text in _texts(scripted.requests[-1]) if role == "assistant"] == ["first answer"]
    assert _last_cause(scripted_session) == "", "it goes on from the message the regenerate sent, so nothing breaks"


def test_a_flip_back_to_a_compacted_branch_starts_from_its_summary(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    scripted.push(Step(text="reply 1"), Step(text="reply 2"), Step(text="Summary of one and two."))
    loop = _loop(scripted_session)
    run(loop.send("one"))
    run(loop.send("two"))
    run(loop.compact())
    scripted.push(Step(text="reply deux"))
    run(loop.edit(2, "deux"))
    texts = _texts(scripted.requests[-1])
    assert texts[0][1].startswith("one") and texts[1:] == [("assistant", "reply 1"), ("user", "deux")]
    assert "Summary of one and two." not in _messages(scripted.requests[-1])[0]["content"]
    run(loop.flip(2))
    scripted.push(Step(text="reply 3"))
    run(loop.send("three"))
    after = _messages(scripted.requests[-1])
    assert "Summary of one and two." in after[0]["content"]
    assert [m["role"] for m in after] == ["system", "user"]
    assert _last_cause(scripted_session) == BreakCause.BRANCH


def test_an_edit_can_restore_the_files_the_replaced_turns_changed(
    scripted: ScriptedServer, scripted_session: ChatSession, workspace_dir: Path
) -> None:
    scripted.push(Step(tool_calls=[("write", {"path": "new.txt", "content": "x\n"})]), Step(text="Written."))
    loop = _loop(scripted_session)
    run(loop.send("write new.txt"))
    scripted.push(Step(text="Not writing."))
    edited = run(loop.edit(1, "do not write anything", restore=True))
    assert edited.taken_back.restored and edited.taken_back.edits == 1
    assert not (workspace_dir / "new.txt").exists()
    assert edited.turn.reply_text == "Not writing."


def test_regenerating_a_compacted_turn_asks_without_the_summary(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    scripted.push(Step(text="reply 1"), Step(text="Summary of one."), Step(text="reply 1 again"))
    loop = _loop(scripted_session)
    run(loop.send("one"))
    run(loop.compact())
    run(loop.regenerate())
    again = _messages(scripted.requests[-1])
    assert "Summary of one." not in again[0]["content"]
    assert [m["role"] for m in again] == ["system", "user"] and again[1]["content"].startswith("one")


def test_undo_restores_files_unless_they_changed(
    scripted: ScriptedServer, scripted_session: ChatSession, workspace_dir: Path
) -> None:
    (workspace_dir / "a.txt").write_text("a\n")
    (workspace_dir / "b.txt").write_text("b\n")
    scripted.push(
        Step(
            tool_calls=[
                ("write", {"path": "a.txt", "content": "A\n"}),
                ("write", {"path": "b.txt", "content": "B\n"}),
                ("write", {"path": "new.txt", "content": "new\n"}),
            ]
        ),
        Step(text="written"),
    )
    loop = _loop(scripted_session)
    run(loop.send("write them"))
    (workspace_dir / "b.txt").write_text("changed by someone\n")
    conflicts = run(loop.undo(restore=True)).taken_back.conflicts
    assert (workspace_dir / "a.txt").read_text() == "a\n"
    assert not (workspace_dir / "new.txt").exists()
    assert (workspace_dir / "b.txt").read_text() == "changed by someone\n"
    assert len(conflicts) == 1 and "b.txt" in conflicts[0]


def test_compaction_starts_a_generation_with_the_table(
    scripted: ScriptedServer, scripted_session: ChatSession, workspace_dir: Path
) -> None:
    (workspace_dir / "a.txt").write_text("one\ntwo\n")
    scripted.push(Step(tool_calls=[("read", {"path": "a.txt"})]), Step(text="ok"), Step(text="We read a.txt."))
    loop = _loop(scripted_session)
    run(loop.send("read a.txt"))
    system = run(loop.compact()).compacted.system_prompt
    assert "We read a.txt." in system
    assert "| a.txt | 1-2 of 2 |" in system
    compaction_request = _messages(scripted.requests[-1])
    assert compaction_request[-1]["role"] == "user"
    assert compaction_request[:-1] == [*_messages(scripted.requests[-2])[:2], {"role": "assistant", "content": "ok"}]
    scripted.push(Step(text="after"))
    run(loop.send("go on"))
    after = _messages(scripted.requests[-1])
    assert [m["role"] for m in after] == ["system", "user"]
    assert "Date: " in after[1]["content"]
    kinds = list(
        ModelRequest.objects.filter(session=scripted_session).order_by("id").values_list("kind", "break_cause")
    )
    assert kinds[-2] == (RequestKind.COMPACTION, BreakCause.NEW_TURN)
    assert kinds[-1] == (RequestKind.REPLY, BreakCause.COMPACTION)
    run(loop.undo())
    run(loop.undo())
    session = ChatSession.objects.get(pk=scripted_session.pk)
    assert session.generation_number == 1
    assert Generation.objects.get(session=session, number=2).taken_back


def test_the_compaction_notice_names_turns_by_their_place_as_the_page_does(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    from chat.web.display import CompactionView
    from chat.web.fragments import compaction_put

    scripted.push(Step(text="one"), Step(text="two"), Step(text="two again"), Step(text="We talked twice."))
    loop = _loop(scripted_session)
    run(loop.send("one"))
    run(loop.send("two"))
    run(loop.undo())
    run(loop.send("two again"))
    generation = run(loop.compact()).compacted
    assert generation.covers_through_turn == 3, "stored as turn 3"
    shown = compaction_put(CompactionView(generation)).html
    assert "Compacted: the turns up to 2 are summarized for the model" in shown


def test_empty_summary_changes_nothing(scripted: ScriptedServer, scripted_session: ChatSession) -> None:
    from sessions_app.errors import EmptySummary

    scripted.push(Step(text="hi"), Step(text="  ", tool_calls=[("read", {"path": "x"})]))
    loop = _loop(scripted_session)
    run(loop.send("hello"))
    with pytest.raises(EmptySummary):
        run(loop.compact())
    assert ChatSession.objects.get(pk=scripted_session.pk).generation_number == 1
    assert not Result.objects.filter(session=scripted_session).exists()


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("http500", "500"),
        ("malformed", "malformed"),
        ("cut", "closed"),
        ("stall", "first token"),
        ("garbage", ""),
        ("refuse", ""),
    ],
)
def test_faults_fail_the_turn_and_lose_nothing(
    scripted: ScriptedServer, scripted_session: ChatSession, workspace_dir: Path, fault: str, message: str
) -> None:
    (workspace_dir / "a.txt").write_text("a\n")
    scripted.push(Step(tool_calls=[("read", {"path": "a.txt"})]), Step(text="partial text here", fault=fault))
    turn = run(_loop(scripted_session).send("please read")).turn
    assert turn.status == TurnStatus.FAILED
    assert turn.error
    assert message.lower() in turn.error.lower()
    assert turn.words == "please read"
    assert Result.objects.filter(turn=turn).count() == 1
    failed = ModelRequest.objects.filter(session=scripted_session).order_by("-id")[0]
    assert failed.status == "failed" and failed.error == turn.error
    scripted.push(Step(tool_calls=[("read", {"path": "a.txt"})]), Step(text="Now it works."))
    outcome = run(_loop(scripted_session).regenerate())
    assert outcome.turn.status == TurnStatus.DONE and outcome.turn.reply_text == "Now it works."
    assert Result.objects.filter(session=scripted_session).count() == 2


def test_server_down_is_a_clear_error(scripted_session: ChatSession) -> None:
    endpoint = scripted_session.endpoint
    endpoint.base_url = "http://127.0.0.1:9/v1"
    endpoint.save()
    turn = run(_loop(scripted_session).send("anyone there?")).turn
    assert turn.status == TurnStatus.FAILED
    assert "127.0.0.1:9" in turn.error
    assert Turn.objects.get(pk=turn.pk).message.startswith("anyone there?")


def test_stop_interrupts_the_reply_and_keeps_what_came(scripted: ScriptedServer, scripted_session: ChatSession) -> None:
    scripted.push(Step(text="word " * 200, chunk_size=5, delay=0.05))
    cancel = Cancel()
    deltas = 0

    def stop_at_the_fifth_piece(event: ReplyEvent) -> None:
        nonlocal deltas
        if isinstance(event, TextDelta):
            deltas += 1
            if deltas == 5:
                cancel.set()

    turn = run(_loop(scripted_session, cancel=cancel).send("talk"), each=stop_at_the_fifth_piece).turn
    assert turn.status == TurnStatus.INTERRUPTED
    assert turn.reply_text.startswith("word word")
    assert len(turn.reply_text) < len("word " * 200), "stopped in the middle of the answer, not at its end"
    assert scripted.remaining == 0 and len(scripted.requests) == 1, "no request after the Stop"


def test_stop_ends_a_running_grep_and_its_rg(
    scripted: ScriptedServer,
    scripted_session: ChatSession,
    workspace_dir: Path,
    rg_children: Any,
    request: pytest.FixtureRequest,
) -> None:
    line = b"the quick brown fox jumps over the lazy dog 0123456789 and then some more words here\n"
    with (workspace_dir / "big.txt").open("wb") as handle:
        for _ in range(100):
            handle.write(line * ((1 << 20) // len(line)))
    request.addfinalizer((workspace_dir / "big.txt").unlink)
    scripted.push(Step(tool_calls=[("grep", {"pattern": r"(\w+\s+){20}$"})]), Step(text="Not asked."))
    cancel = Cancel()
    seen: dict[int, str] = {}

    def stop_when_rg_runs() -> None:
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            seen.update(rg_children())
            time.sleep(0.001)
        cancel.set()

    watcher = threading.Thread(target=stop_when_rg_runs, daemon=True)
    watcher.start()
    turn = run(_loop(scripted_session, cancel=cancel).send("find the long lines")).turn
    watcher.join(timeout=5)
    assert seen, "rg never ran"
    assert turn.status == TurnStatus.INTERRUPTED
    result = Result.objects.get(session=scripted_session)
    assert result.inserted_text == "[#0001] grep was stopped before it finished."
    assert rg_children() == {}
    assert len(scripted.requests) == 1


def test_two_sends_at_once_the_second_is_refused(scripted: ScriptedServer, scripted_session: ChatSession) -> None:
    scripted.push(Step(text="slow " * 40, chunk_size=2, delay=0.02))
    errors: list[Exception] = []

    def send_first() -> None:
        from django.db import connection

        try:
            run(_loop(scripted_session).send("first"))
        finally:
            connection.close()

    first = threading.Thread(target=send_first)
    first.start()
    deadline = time.monotonic() + 5
    while not Turn.objects.filter(session=scripted_session).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        run(_loop(scripted_session).send("second"))
    except ReplyInProgress as error:
        errors.append(error)
    first.join()
    assert len(errors) == 1 and "already running" in str(errors[0])
    assert [t.words for t in Turn.objects.filter(session=scripted_session)] == ["first"]


def test_a_reply_left_open_by_a_dead_process_is_marked_interrupted(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    orphan = turn_start(session=scripted_session, words="lost", today="2026-11-29", instructions=None)
    scripted.push(Step(text="fine"))
    turn = run(_loop(scripted_session).send("again")).turn
    assert Turn.objects.get(pk=orphan.pk).status == TurnStatus.INTERRUPTED
    assert turn.status == TurnStatus.DONE


def test_reply_lock_is_exclusive(scripted_session: ChatSession) -> None:
    with reply_lock(scripted_session):
        errors: list[Exception] = []

        def other() -> None:
            from django.db import connection

            try:
                with reply_lock(scripted_session):
                    pass
            except ReplyInProgress as error:
                errors.append(error)
            finally:
                connection.close()

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert len(errors) == 1


def test_forbidden_and_unknown_calls_still_take_ids(
    scripted: ScriptedServer, scripted_session: ChatSession, workspace_dir: Path
) -> None:
    from sessions_app.services.sessions import session_set_mode

    session_set_mode(session=scripted_session, mode="plan")
    scripted.push(Step(tool_calls=[("write", {"path": "x.txt", "content": "x"})]), Step(text="cannot"))
    turn = run(_loop(scripted_session).send("write x")).turn
    result = Result.objects.get(turn=turn)
    assert result.inserted_text.startswith("[#0001] write is not available in plan mode")
    assert not (workspace_dir / "x.txt").exists()
    assert "The permission mode is plan: you can read and search" in turn.message


def test_step_limit_ends_the_reply(scripted: ScriptedServer, scripted_session: ChatSession) -> None:
    scripted.push(*(Step(tool_calls=[("list", {})]) for _ in range(3)))
    turn = run(_loop(scripted_session, max_steps=3).send("loop forever")).turn
    assert turn.status == TurnStatus.DONE
    assert "3 steps" in turn.reply_text
    assert len(scripted.requests) == 3


def test_nul_bytes_from_the_model_are_stored_as_a_stand_in(
    scripted: ScriptedServer, scripted_session: ChatSession
) -> None:
    scripted.push(Step(text="bad\x00byte", tool_calls=[("read", '{"path": "a\\u0000b"}')]), Step(text="ok\x00"))
    turn = run(_loop(scripted_session).send("garbage please")).turn
    assert turn.status == TurnStatus.DONE
    assert turn.reply_text == "bad\u2400byte\n\nok\u2400"
    assert "\x00" not in Result.objects.get(turn=turn).arguments_raw


def test_tool_list_and_system_prompt_bytes_never_change_within_a_generation(
    scripted: ScriptedServer, scripted_session: ChatSession, workspace_dir: Path
) -> None:
    from sessions_app.services.sessions import session_set_mode

    (workspace_dir / "AGENTS.md").write_text("Be brief.\n")
    scripted.push(Step(tool_calls=[("list", {})]), Step(text="one"), Step(text="two"), Step(text="three"))
    loop = _loop(scripted_session)
    run(loop.send("first"))
    session_set_mode(session=scripted_session, mode="plan")
    (workspace_dir / "AGENTS.md").write_text("Be very brief.\n")
    second = run(loop.send("second")).turn
    assert "The permission mode is now plan:" in second.message
    assert "Be very brief." in second.message
    session_set_mode(session=scripted_session, mode="full")
    run(loop.send("third"))
    bodies = [json.loads(body) for body in scripted.requests]
    tools = {json.dumps(body["tools"]) for body in bodies}
    systems = {body["messages"][0]["content"] for body in bodies}
    assert len(tools) == 1 and len(systems) == 1
    assert [t["function"]["name"] for t in bodies[0]["tools"]][-1] == "run"
    assert all(b"2026" not in body.split(b'"messages"')[0] for body in scripted.requests)


@pytest.mark.allow_unexpected_break
def test_unexpected_break_is_logged_loudly_in_debug(
    scripted: ScriptedServer, scripted_session: ChatSession, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from sessions_app.models import Generation

    settings.DEBUG = True
    scripted.push(Step(text="one"), Step(text="two"))
    loop = _loop(scripted_session)
    run(loop.send("first"))
    Generation.objects.filter(session=scripted_session).update(system_prompt="rewritten behind the store's back")
    with caplog.at_level("ERROR"):
        run(loop.send("second"))
    last = ModelRequest.objects.filter(session=scripted_session).order_by("-id")[0]
    assert last.break_cause == BreakCause.UNEXPECTED
    assert any("expected at least" in record.getMessage() for record in caplog.records)


def _first_user_offset(session: ChatSession) -> int:
    """Where the first user message starts in the request the session's last turn sent."""
    turn = Turn.objects.filter(session=session).order_by("-number").first()
    built = build_request(ChatSession.objects.get(pk=session.pk), current=turn, model_name=session.model_name)
    return built.message_offsets[1]


def test_sessions_in_other_workspaces_and_with_other_models_send_the_same_prefix(
    scripted: ScriptedServer, user: Any, tmp_path: Path
) -> None:
    endpoint = ModelEndpoint.objects.create(
        name="scripted", base_url=scripted.base_url, model="scripted", context_window=100_000
    )
    sessions = []
    for name, model_name in (("alpha", "scripted"), ("beta-workspace", "scripted"), ("gamma", "other-model-7b")):
        folder = tmp_path / name
        folder.mkdir()
        workspace = Workspace.objects.create(
            name=name, folder=str(folder.resolve()), allow_commands=True, open_to_everyone=True
        )
        sessions.append(
            session_start(
                owner=user,
                workspace=workspace,
                endpoint=endpoint,
                model_name=model_name,
                tools=tool_list(allow_commands=True),
                mode="plan" if name == "gamma" else "edit",
            )
        )
    scripted.push(Step(text="one"), Step(text="two"), Step(text="three"))
    for session in sessions:
        run(_loop(session).send("hi", date="2026-11-29"))
    alpha, beta, gamma = scripted.requests
    offsets = [_first_user_offset(session) for session in sessions]
    assert offsets[0] == offsets[1]
    assert alpha[: offsets[0]] == beta[: offsets[1]]
    assert alpha[: offsets[0]].endswith(b'"},')
    # past the request's own "model" field, another model sends the same bytes too
    assert alpha[alpha.index(b',"stream"') : offsets[0]] == gamma[gamma.index(b',"stream"') : offsets[2]]
    first = [_messages(body)[1]["content"] for body in (alpha, beta, gamma)]
    assert first[0] == first[1].replace("beta-workspace", "alpha")
    assert first[2].startswith(
        'hi\n\n<note>\nWorkspace: "gamma".\n\nYour model: other-model-7b.\n\n'
        "The permission mode is plan: you can read and search, not change files"
    )
    assert first[2].endswith("\n\nDate: 2026-11-29.\n</note>")
    assert len({generation.system_prompt for generation in Generation.objects.all()}) == 1


def test_a_model_change_is_stated_on_the_next_message(scripted: ScriptedServer, scripted_session: ChatSession) -> None:
    from sessions_app.services.sessions import session_change_model

    scripted.push(Step(text="one"), Step(text="two"), Step(text="three"))
    first = run(_loop(scripted_session).send("one", date="2026-11-29")).turn
    assert "Your model: scripted." in first.message
    session_change_model(session=scripted_session, endpoint=scripted_session.endpoint, model_name="bigger-model")
    second = run(_loop(scripted_session).send("two", date="2026-11-29")).turn
    assert second.message == "two\n\n<note>\nYour model: bigger-model.\n</note>"
    third = run(_loop(scripted_session).send("three", date="2026-11-29")).turn
    assert third.message == "three"
    bodies = scripted.requests
    assert [json.loads(body)["model"] for body in bodies] == ["scripted", "bigger-model", "bigger-model"]
    assert len({_messages(body)[0]["content"] for body in bodies}) == 1
    assert _messages(bodies[2])[1:4] == _messages(bodies[1])[1:4]
    causes = [r.break_cause for r in ModelRequest.objects.filter(session=scripted_session).order_by("id")]
    assert causes == [BreakCause.FIRST, BreakCause.MODEL_CHANGE, ""]


def test_commands_switched_off_mid_session_answer_the_unavailable_text(
    scripted: ScriptedServer, scripted_session: ChatSession, workspace_dir: Path
) -> None:
    from sessions_app.services.sessions import session_set_mode

    session_set_mode(session=scripted_session, mode="full")
    scripted.push(
        Step(tool_calls=[("run", {"command": "echo ran > first.txt"})]),
        Step(tool_calls=[("run", {"command": "echo ran > second.txt"})]),
        Step(text="done"),
        Step(tool_calls=[("run", {"command": "echo ran > third.txt"})]),
        Step(text="still off"),
    )
    switched = False

    def switch_off(event: ReplyEvent) -> None:
        nonlocal switched
        if isinstance(event, ResultStored) and not switched:
            Workspace.objects.filter(pk=scripted_session.workspace_id).update(allow_commands=False)
            switched = True

    run(_loop(scripted_session).send("run things"), each=switch_off)
    run(_loop(scripted_session).send("again"))
    unavailable = (
        "run is not available: commands are switched off for this workspace now. Say which command you would "
        "run, so the person can run it."
    )
    results = list(Result.objects.filter(session=scripted_session).order_by("number"))
    assert [result.inserted_text for result in results[1:]] == [f"[#0002] {unavailable}", f"[#0003] {unavailable}"]
    assert (workspace_dir / "first.txt").exists()
    assert not (workspace_dir / "second.txt").exists() and not (workspace_dir / "third.txt").exists()
    tools = {json.dumps(json.loads(body)["tools"]) for body in scripted.requests}
    assert len(tools) == 1 and '"name":"run"' in next(iter(tools)).replace(" ", "")


def test_the_mode_and_the_membership_are_read_before_every_call_in_one_query(
    scripted: ScriptedServer, scripted_session: ChatSession, workspace_dir: Path
) -> None:
    from sessions_app.services.sessions import session_set_mode

    (workspace_dir / "a.txt").write_text("a\n")
    scripted.push(
        Step(tool_calls=[("read", {"path": "a.txt"})]),
        Step(tool_calls=[("write", {"path": "b.txt", "content": "b\n"})]),
        Step(text="done"),
    )

    def plan_after_the_read(event: ReplyEvent) -> None:
        if isinstance(event, ResultStored) and event.result.tool == "read":
            session_set_mode(session=scripted_session, mode="plan")  # the write that follows is refused

    with CaptureQueriesContext(connection) as queries:
        run(_loop(scripted_session).send("read, then write"), each=plan_after_the_read)
    mode_reads = [
        q for q in queries.captured_queries if q["sql"].startswith('SELECT "sessions_app_chatsession"."mode"')
    ]
    results = list(Result.objects.filter(session=scripted_session).order_by("number"))
    assert [result.tool for result in results] == ["read", "write"]
    assert results[1].inserted_text.startswith("[#0002] write is not available")
    assert not (workspace_dir / "b.txt").exists()
    assert len(mode_reads) == 2  # one before each call, the read's too
    assert all("sessions_app_workspace_members" in q["sql"] for q in mode_reads), "membership in the same query"


def _removed(session: ChatSession, other_user: Any) -> None:
    """Staff give the session's workspace a member who is not its owner, and it is not open to everyone: the owner
    may no longer use it."""
    Workspace.objects.filter(pk=session.workspace_id).update(open_to_everyone=False)
    Workspace.objects.get(pk=session.workspace_id).members.add(other_user)


REMOVED = "You are no longer a member of the workspace “ws”: this session is read-only."


def test_a_person_removed_from_the_workspace_can_take_no_action_in_its_session(
    scripted: ScriptedServer, scripted_session: ChatSession, other_user: Any, workspace_dir: Path
) -> None:
    (workspace_dir / "a.txt").write_text("a\n")
    scripted.push(Step(text="one"), Step(text="uno"))
    loop = _loop(scripted_session)
    run(loop.send("one"))
    run(loop.edit(1, "uno"))
    _removed(scripted_session, other_user)
    asked = len(scripted.requests)
    actions = {
        "send": lambda: loop.send("still here?"),
        "edit": lambda: loop.edit(1, "again"),
        "regenerate": lambda: loop.regenerate(),
        "undo": lambda: loop.undo(restore=True),
        "rewind": lambda: loop.rewind(1),
        "flip": lambda: loop.flip(1),
        "compact": lambda: loop.compact(),
    }
    for name, action in actions.items():
        with pytest.raises(NotAMember) as refused:
            run(action())
        assert str(refused.value) == REMOVED, name
    assert len(scripted.requests) == asked, "nothing was asked of the model"
    turns = list(Turn.objects.filter(session=scripted_session).order_by("number").values_list("number", "status"))
    assert turns == [(1, TurnStatus.TAKEN_BACK), (2, TurnStatus.DONE)]
    Workspace.objects.get(pk=scripted_session.workspace_id).members.add(scripted_session.owner)
    scripted.push(Step(text="back"))
    assert run(loop.send("back again")).turn.status == TurnStatus.DONE


def test_a_removal_during_a_reply_ends_it_before_its_next_tool_call_reads_included(
    scripted: ScriptedServer, scripted_session: ChatSession, other_user: Any, workspace_dir: Path
) -> None:
    (workspace_dir / "a.txt").write_text("a\n")
    scripted.push(
        Step(text="Reading.", tool_calls=[("read", {"path": "a.txt"})]),
        Step(
            text="Again.",
            tool_calls=[("read", {"path": "a.txt", "offset": 1}), ("write", {"path": "b.txt", "content": "b\n"})],
        ),
        Step(text="never asked"),
    )

    def remove_after_a_result(event: ReplyEvent) -> None:
        if isinstance(event, ResultStored):
            _removed(scripted_session, other_user)

    events = run(_loop(scripted_session).send("read, then write"), each=remove_after_a_result).events
    ended = [event.turn for event in events if isinstance(event, TurnEnded)]
    assert len(ended) == 1 and ended[0].status == TurnStatus.FAILED
    error = (
        "You are no longer a member of the workspace “ws”: the reply ended before its next tool call, and this "
        "session is read-only."
    )
    turn = Turn.objects.get(session=scripted_session)
    assert (turn.status, turn.error) == (TurnStatus.FAILED, error)
    assert [step.text for step in turn.steps.order_by("number")] == ["Reading.", "Again."], "what came is kept"
    assert [(r.number, r.tool) for r in Result.objects.filter(session=scripted_session)] == [(1, "read")]
    assert not (workspace_dir / "b.txt").exists(), "the remaining calls are not run"
    assert len(scripted.requests) == 2


def test_a_workspace_on_a_folder_now_forbidden_is_refused_at_use(
    scripted: ScriptedServer, scripted_session: ChatSession, settings: Any
) -> None:
    Workspace.objects.filter(pk=scripted_session.workspace_id).update(folder=str(settings.BASE_DIR))
    with pytest.raises(FolderRefused) as refused:
        run(_loop(scripted_session).send("what is in here?"))
    assert str(refused.value) == (
        f"The workspace “ws” is on a folder Cachet may not use ({settings.BASE_DIR} is Cachet's code): this "
        "session is read-only until staff change the folder in the admin."
    )
    assert scripted.requests == [] and not Turn.objects.exists()
