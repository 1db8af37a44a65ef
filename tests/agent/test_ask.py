from __future__ import annotations

import io
import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from sessions_app.models import (
    BreakCause,
    ChatSession,
    ModelEndpoint,
    ModelRequest,
    Result,
    Turn,
    TurnStatus,
    Workspace,
)
from sessions_app.services.locks import reply_lock
from testing.scripted_server import ScriptedServer, Step

pytestmark = pytest.mark.django_db(transaction=True)

LAST_LINE = re.compile(r"^session=(\d+) turn=(\d+) requests=(\d+) prompt_tokens=(\d+) cached_tokens=(\d+)$")


def ask(*args: str) -> tuple[str, dict[str, int]]:
    out = io.StringIO()
    try:
        err = io.StringIO()
        call_command("ask", *args, stdout=out, stderr=err)
    except SystemExit as exit_:
        assert exit_.code == 0, out.getvalue() + "\nSTDERR " + err.getvalue()
    lines = out.getvalue().rstrip("\n").split("\n")
    match = LAST_LINE.match(lines[-1])
    assert match, lines[-1]
    names = ("session", "turn", "requests", "prompt_tokens", "cached_tokens")
    return out.getvalue(), dict(zip(names, map(int, match.groups()), strict=True))


def test_twenty_turns_through_ask(user: Any, workspace_dir: Path, scripted: ScriptedServer) -> None:
    for n in range(1, 6):
        (workspace_dir / f"m{n}.py").write_text("".join(f"line {i} of module {n}\n" for i in range(1, 40)))
    base = ("--user", user.username, "--endpoint", scripted.base_url, "--model", "scripted")
    scripted.push(Step(tool_calls=[("read", {"path": "m1.py"})]), Step(text="Module 1 has 39 lines."))
    output, first = ask(*base, "--workspace", str(workspace_dir), "What is in m1.py?")
    assert "Module 1 has 39 lines." in output
    assert first["turn"] == 1 and first["requests"] == 2
    session_id = str(first["session"])
    in_session = ("--user", user.username, "--session", session_id)
    totals = {"requests": first["requests"], "cached": first["cached_tokens"]}
    for turn in range(2, 21):
        n = turn % 5 + 1
        if turn == 10:
            _, undone = ask(*in_session, "--undo")
            assert undone["requests"] == 0
        if turn == 15:
            scripted.push(Step(text="Summary: we read and edited modules."))
            _, compacted = ask(*in_session, "--compact")
            assert compacted["requests"] == 1
            totals["requests"] += 1
        if turn % 4 == 0:
            edit = {"path": f"m{n}.py", "old_string": "line 7 ", "new_string": f"LINE 7/{turn} "}
            scripted.push(
                Step(tool_calls=[("grep", {"pattern": "line 3 "})]),
                Step(tool_calls=[("edit", edit)]),
                Step(text=f"Edited m{n}.py."),
            )
        elif turn % 4 == 1:
            reads: list[tuple[str, dict[str, Any] | str]] = [
                ("read", {"path": f"m{n}.py"}),
                ("read", {"path": f"m{n}.py", "offset": 3, "limit": 5}),
            ]
            scripted.push(Step(tool_calls=reads), Step(text="Read twice."))
        else:
            scripted.push(Step(text=f"Answer {turn}."))
        output, figures = ask(*in_session, f"Turn {turn} please")
        assert figures["turn"] == (turn if turn < 10 else turn - 1), "its place: turn 9 was taken back"
        totals["requests"] += figures["requests"]
        totals["cached"] += figures["cached_tokens"]
    session = ChatSession.objects.get(pk=int(session_id))
    assert session.generation_number == 2
    turns = Turn.objects.filter(session=session)
    assert turns.count() == 20 and turns.filter(status=TurnStatus.TAKEN_BACK).count() == 1
    assert turns.exclude(status=TurnStatus.TAKEN_BACK).filter(status=TurnStatus.DONE).count() == 19
    numbers = list(Result.objects.filter(session=session).order_by("number").values_list("number", flat=True))
    assert numbers == list(range(1, len(numbers) + 1))
    assert Result.objects.filter(session=session, kind="stub").exists()
    requests = ModelRequest.objects.filter(session=session)
    assert requests.count() == totals["requests"]
    causes = set(requests.values_list("break_cause", flat=True))
    assert BreakCause.UNEXPECTED not in causes
    assert {BreakCause.FIRST, BreakCause.NEW_TURN, BreakCause.UNDO, BreakCause.COMPACTION} <= causes
    assert totals["cached"] > 0


def test_unknown_user_is_refused() -> None:
    with pytest.raises(CommandError, match="no user"):
        call_command("ask", "--user", "ghost", "hello", stdout=io.StringIO())


def test_other_users_session_is_refused(user: Any, other_user: Any, chat_session: ChatSession) -> None:
    with pytest.raises(CommandError, match="has no session"):
        call_command(
            "ask", "--user", other_user.username, "--session", str(chat_session.pk), "hi", stdout=io.StringIO()
        )


def _refused(*args: str) -> str:
    """The one-line error ``ask`` stops with."""
    with pytest.raises(CommandError) as refused:
        call_command("ask", *args, stdout=io.StringIO(), stderr=io.StringIO())
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_ask_refuses_a_session_whose_workspace_its_user_was_removed_from(
    user: Any, other_user: Any, workspace_dir: Path, scripted: ScriptedServer
) -> None:
    scripted.push(Step(text="Hello."))
    base = ("--user", user.username, "--endpoint", scripted.base_url, "--model", "scripted")
    _, first = ask(*base, "--workspace", str(workspace_dir), "hi")
    session = ChatSession.objects.get(pk=first["session"])
    workspace = session.workspace
    workspace.members.remove(user)
    workspace.members.add(other_user)
    in_session = ("--user", user.username, "--session", str(session.pk))
    removed = f"You are no longer a member of the workspace “{workspace.name}”: this session is read-only."
    for action in (("again?",), ("--undo",), ("--regenerate",), ("--compact",), ("--rewind", "1"), ("--mode", "full")):
        assert _refused(*in_session, *action) == removed
    assert ChatSession.objects.get(pk=session.pk).mode == "edit"
    assert list(Turn.objects.values_list("words", "status")) == [("hi", TurnStatus.DONE)]
    assert len(scripted.requests) == 1
    assert _refused(*base, "--workspace", str(workspace_dir), "let me back in") == (
        f"The workspace {workspace.name!r} exists and is not one {user.username} may use here."
    )
    assert list(workspace.members.all()) == [other_user], "ask never joins a workspace again"


def test_ask_takes_a_folder_outside_the_roots_but_never_a_forbidden_one(
    user: Any, settings: Any, tmp_path: Path
) -> None:
    base = ("--user", user.username, "--endpoint", "http://127.0.0.1:9/v1", "--model", "m")
    (tmp_path / "to-etc").symlink_to("/etc")
    code = Path(settings.BASE_DIR)
    for folder, reason in (
        ("/", "/ is the root of the file system"),
        ("/etc", "/etc is a system folder"),
        (str(code), f"{code} is Cachet's code"),
        (str(code / "chat"), f"{code}/chat lies inside Cachet's code ({code})"),
        (str(tmp_path / "to-etc"), "/etc is a system folder"),
    ):
        assert _refused(*base, "--workspace", folder, "hi") == f"Cachet may not use {folder} as a workspace: {reason}."
    Workspace.objects.create(name="old", folder="/etc", open_to_everyone=True)  # made before the folder rules
    assert _refused(*base, "--workspace", "old", "hi") == (
        "The workspace 'old' is on a folder Cachet may not use: /etc is a system folder."
    )
    assert not ChatSession.objects.exists()


def test_failed_reply_exits_non_zero_and_keeps_the_message(user: Any, workspace_dir: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as exit_:
        call_command(
            "ask",
            "--user",
            user.username,
            "--workspace",
            str(workspace_dir),
            "--endpoint",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
            "hello?",
            stdout=out,
            stderr=err,
        )
    assert exit_.value.code == 1
    assert "127.0.0.1:9" in err.getvalue()
    assert LAST_LINE.match(out.getvalue().rstrip("\n").split("\n")[-1])
    assert Turn.objects.get(words="hello?").status == TurnStatus.FAILED


def test_undo_says_what_it_took_back_and_restored(user: Any, workspace_dir: Path, scripted: ScriptedServer) -> None:
    base = ("--user", user.username, "--endpoint", scripted.base_url, "--model", "scripted")
    scripted.push(Step(text="Hello."))
    _, first = ask(*base, "--workspace", str(workspace_dir), "hi")
    in_session = ("--user", user.username, "--session", str(first["session"]))
    scripted.push(Step(tool_calls=[("write", {"path": "new.txt", "content": "x\n"})]), Step(text="Written."))
    ask(*in_session, "write new.txt")
    assert (workspace_dir / "new.txt").exists()
    output, _ = ask(*in_session, "--undo", "--restore-files")
    assert "Took back turn 2; the files it changed were restored." in output
    assert not (workspace_dir / "new.txt").exists()
    output, _ = ask(*in_session, "--rewind", "1")
    assert "Took back turn 1." in output


def test_turns_are_numbered_by_their_place_as_the_page_labels_them(
    user: Any, workspace_dir: Path, scripted: ScriptedServer
) -> None:
    base = ("--user", user.username, "--endpoint", scripted.base_url, "--model", "scripted")
    scripted.push(Step(text="One."), Step(text="Two."), Step(text="Two again."), Step(text="Three."))
    _, first = ask(*base, "--workspace", str(workspace_dir), "one")
    in_session = ("--user", user.username, "--session", str(first["session"]))
    ask(*in_session, "two")
    ask(*in_session, "--undo")
    _, again = ask(*in_session, "two again")
    assert again["turn"] == 2, "stored as turn 3, it is the conversation's second"
    _, third = ask(*in_session, "three")
    assert third["turn"] == 3
    output, _ = ask(*in_session, "--rewind", "3")
    assert "Took back turn 3." in output
    assert [turn.words for turn in Turn.objects.exclude(status=TurnStatus.TAKEN_BACK).order_by("number")] == [
        "one",
        "two again",
    ]
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError, match=r"No live turn is left from turn 3 on; nothing was taken back\."):
        call_command("ask", *in_session, "--rewind", "3", stdout=out, stderr=err)


def test_ask_without_an_endpoint_uses_the_default_one(user: Any, workspace_dir: Path, scripted: ScriptedServer) -> None:
    ModelEndpoint.objects.create(name="an-older-one", base_url="http://127.0.0.1:9/v1", model="old")
    ModelEndpoint.objects.create(name="default", base_url=scripted.base_url, model="scripted")
    scripted.push(Step(text="Hello from the default."))
    output, figures = ask("--user", user.username, "--workspace", str(workspace_dir), "Hi")
    assert "Hello from the default." in output
    assert ChatSession.objects.get(pk=figures["session"]).endpoint.name == "default"


def test_ask_moves_a_session_to_another_model_or_endpoint_before_its_action(
    user: Any, workspace_dir: Path, scripted: ScriptedServer
) -> None:
    scripted.push(Step(text="One."))
    _, first = ask(
        "--user", user.username, "--workspace", str(workspace_dir), "--endpoint", scripted.base_url, "--model", "a", "1"
    )
    in_session = ("--user", user.username, "--session", str(first["session"]))
    scripted.push(Step(text="Two."))
    output, _ = ask(*in_session, "--model", "b", "2")
    assert output.startswith(f"Model: b at {scripted.base_url} (the next request reads the conversation again).\n")
    with ScriptedServer(model="c", listed=["c", "d"]) as other:
        other.push(Step(text="Three."))
        output, _ = ask(*in_session, "--endpoint", other.base_url, "3")
        assert f"Model: c at {other.base_url} (the next request reads the conversation again)." in output
        assert json.loads(other.requests[0])["model"] == "c"
    again, _ = ask(*in_session, "--endpoint", other.base_url, "--model", "c", "--undo")
    assert "Model:" not in again, "the same endpoint and model again change nothing"
    session = ChatSession.objects.get(pk=first["session"])
    assert (session.endpoint.base_url, session.model_name, session.generation_number) == (other.base_url, "c", 3)
    assert list(session.generations.order_by("number").values_list("model_name", flat=True)) == ["a", "b", "c"]
    requests = ModelRequest.objects.filter(session=session).order_by("id")
    assert list(requests.values_list("model_name", "break_cause")) == [
        ("a", BreakCause.FIRST),
        ("b", BreakCause.MODEL_CHANGE),
        ("c", BreakCause.MODEL_CHANGE),
    ]


def test_ask_does_not_change_the_model_while_a_reply_runs(user: Any, chat_session: ChatSession) -> None:
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with reply_lock(chat_session):
                held.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        with pytest.raises(CommandError, match="A reply is already running in this session"):
            call_command(
                "ask",
                "--user",
                user.username,
                "--session",
                str(chat_session.pk),
                "--model",
                "other",
                "--undo",
                stdout=io.StringIO(),
            )
    finally:
        release.set()
        holder.join()
    chat_session.refresh_from_db()
    assert (chat_session.model_name, chat_session.generation_number) == ("scripted", 1)


def test_ask_without_a_workspace_works_in_the_persons_own(
    user: Any, other_user: Any, scripted: ScriptedServer, tmp_path: Path, settings: Any
) -> None:
    settings.CACHET_WORKSPACE_ROOTS = [tmp_path]
    Workspace.objects.create(name="scratch", folder=str(tmp_path / "scratch"))
    scripted.push(Step(text="Hi, Ada."), Step(text="Hi, Bob."))
    base = ("--endpoint", scripted.base_url, "--model", "scripted", "Hello")
    _, ada = ask("--user", user.username, *base)
    _, bob = ask("--user", other_user.username, *base)
    ada_workspace = ChatSession.objects.get(pk=ada["session"]).workspace
    bob_workspace = ChatSession.objects.get(pk=bob["session"]).workspace
    assert (ada_workspace.owner, bob_workspace.owner) == (user, other_user), "never the shared scratch folder"
    assert ada_workspace.folder != bob_workspace.folder


def test_ask_sets_a_sessions_instructions_and_sampling(
    user: Any, workspace_dir: Path, scripted: ScriptedServer
) -> None:
    base = ("--user", user.username, "--endpoint", scripted.base_url, "--model", "scripted")
    scripted.push(Step(text="Salut."), Step(text="Ok."))
    started = ("--workspace", str(workspace_dir), "--instructions", "Answer in French.", "--temperature", "0.5")
    _, figures = ask(*base, *started, "Hi")
    first = json.loads(scripted.requests[-1])
    assert first["messages"][-1]["content"].endswith("Instructions for this session:\nAnswer in French.\n</note>")
    assert first["temperature"] == 0.5 and "max_tokens" not in first
    in_session = ("--user", user.username, "--session", str(figures["session"]))
    ask(*in_session, "--instructions", "", "--max-tokens", "100", "Again")
    second = json.loads(scripted.requests[-1])
    assert second["messages"][-1]["content"].endswith("This session's earlier instructions no longer apply.\n</note>")
    assert (second["temperature"], second["max_tokens"]) == (0.5, 100), "what is not given stays"
    with pytest.raises(CommandError, match=r"The temperature is from 0 to 2\."):
        call_command("ask", *in_session, "--temperature", "3", "x", stdout=io.StringIO(), stderr=io.StringIO())
