"""Export then import: the same tree, results and requests for another person, a session that goes on as the
original would, and bad files refused whole."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import DataError
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.agent.loop import ReplyLoop
from sessions_app.models import ChatSession, ModelRequest, Result, Turn, Workspace
from sessions_app.selectors.exports import GENERATIONS, export_chunks, session_export
from sessions_app.selectors.requests import build_request
from sessions_app.services.imports import ImportRejected, parse_export, read_upload, session_import
from testing.scripted_server import ScriptedServer, Step
from tests.agent.loop_helpers import run

pytestmark = pytest.mark.django_db
WHEN = datetime(2026, 11, 30, 21, 0, tzinfo=UTC)


def chatted(session: ChatSession, model: ScriptedServer) -> ChatSession:
    model.push(
        Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"}), ("grep", {"pattern": "line 1"})]),
        Step(text="The notes have **30** lines."),
        Step(text="First answer to the second."),
        Step(text="Second answer to the second."),
    )
    loop = ReplyLoop(session)
    run(loop.send("How long are the notes?", date="2026-11-30"))
    run(loop.send("And the last line?", date="2026-11-30"))
    run(loop.regenerate())
    session.refresh_from_db()
    return session


def exported(session: ChatSession) -> dict[str, Any]:
    return dict(json.loads("".join(export_chunks(session, exported_at=WHEN))))


def stored(session: ChatSession) -> dict[str, Any]:
    """The rows of the export, without what belongs to where the session lives."""
    data = exported(session)
    for key in ("workspace", "endpoint", "updated_at"):
        data["session"].pop(key)
    return data


def test_an_import_is_the_same_session_for_the_person_importing_it(
    live_session: ChatSession, model: ScriptedServer, other_user: Any
) -> None:
    original = chatted(live_session, model)
    raw = "".join(export_chunks(original, exported_at=WHEN)).encode()
    imported = session_import(owner=other_user, workspace=original.workspace, raw=raw)
    assert imported.pk != original.pk and imported.owner_id == other_user.pk and original.owner_id != other_user.pk
    assert stored(imported) == stored(original), "every row as it was: the tree, steps, results, requests, times"
    copies = Result.objects.filter(session=imported).order_by("number")
    originals = Result.objects.filter(session=original).order_by("number")
    assert [(r.number, r.full_text, r.inserted_text) for r in copies] == [
        (r.number, r.full_text, r.inserted_text) for r in originals
    ]
    assert [r.turn.session_id for r in copies] == [imported.pk, imported.pk]
    tree = Turn.objects.filter(session=imported).order_by("number")
    assert [(t.number, t.parent.number if t.parent else None, t.status) for t in tree] == [
        (1, None, "done"),
        (2, 1, "taken_back"),
        (3, 1, "done"),
    ]
    assert all(r.session_id == imported.pk for r in ModelRequest.objects.filter(turn__session=imported))
    before = build_request(original, current=None, model_name=original.model_name).body
    assert build_request(imported, current=None, model_name=imported.model_name).body == before


def test_the_sessions_settings_go_with_it(live_session: ChatSession, model: ScriptedServer, other_user: Any) -> None:
    original = chatted(live_session, model)
    ChatSession.objects.filter(pk=original.pk).update(instructions="Answer in French.", temperature=0.4, max_tokens=99)
    original.refresh_from_db()
    data = exported(original)
    assert (data["session"]["instructions"], data["session"]["temperature"], data["session"]["max_tokens"]) == (
        "Answer in French.",
        0.4,
        99,
    )
    imported = session_import(owner=other_user, workspace=original.workspace, raw=json.dumps(data).encode())
    assert (imported.instructions, imported.temperature, imported.max_tokens) == ("Answer in French.", 0.4, 99)
    too_hot = json.dumps({**data, "session": {**data["session"], "temperature": 3}})
    bad(too_hot, other_user, original.workspace, r"session\.temperature: a number from 0 to 2 is expected")
    del data["session"]["temperature"]
    earlier = session_import(owner=other_user, workspace=original.workspace, raw=json.dumps(data).encode())
    assert earlier.temperature is None, "a file from before temperature was exported: the server's own"


def test_a_file_written_before_fields_were_added_still_imports(
    live_session: ChatSession, model: ScriptedServer, other_user: Any
) -> None:
    """Version 1 files from before ``resumes_after_step`` and the resumed note fields: read as null or empty."""
    original = chatted(live_session, model)
    data = exported(original)
    added = [field for field in GENERATIONS.fields if field.added]
    assert {field.name for field in added} >= {"resumes_after_step", "resumed_turn", "resumed_message"}
    for generation in data["generations"]:
        for field in added:
            generation.pop(field.name)
    imported = session_import(owner=other_user, workspace=original.workspace, raw=json.dumps(data).encode())
    assert stored(imported) == stored(original)


def test_the_imported_session_goes_on_byte_for_byte_as_the_original_would(
    live_session: ChatSession, model: ScriptedServer, other_user: Any
) -> None:
    original = chatted(live_session, model)
    raw = "".join(export_chunks(original, exported_at=WHEN)).encode()
    imported = session_import(owner=other_user, workspace=original.workspace, raw=raw)
    for session in (original, imported):
        model.push(Step(text="Three.", tool_calls=[("recall", {"id": "#0001"})]), Step(text="Done."))
        turn = run(ReplyLoop(session).send("Third", date="2026-11-30")).turn
        assert (turn.status, turn.error) == ("done", ""), f"session {session.pk}'s send failed"
    sent = model.requests[-4:]
    assert sent[2] == sent[0], "the same bytes as the original continued"
    calls = re.compile(rb"call_\d+_")
    assert calls.sub(b"call_", sent[3]) == calls.sub(b"call_", sent[1]), "the same but the server's own call ids"
    recalled = Result.objects.get(session=imported, number=3)
    assert recalled.full_text == Result.objects.get(session=original, number=3).full_text
    assert recalled.full_text == Result.objects.get(session=imported, number=1).full_text
    fields = ("break_cause", "bytes_sent", "shared_prefix_bytes")
    went_on = list(ModelRequest.objects.filter(session=imported).order_by("-id").values_list(*fields)[:2])
    assert went_on == list(ModelRequest.objects.filter(session=original).order_by("-id").values_list(*fields)[:2])
    assert went_on[1][2] > 0, "the imported last request is the one the next is compared with"


def test_only_the_owner_exports(live_session: ChatSession, model: ScriptedServer, other_user: Any) -> None:
    chatted(live_session, model)
    assert session_export(owner=other_user, session_id=live_session.pk, exported_at=WHEN) is None
    chunks = session_export(owner=live_session.owner, session_id=live_session.pk, exported_at=WHEN)
    assert chunks is not None and json.loads("".join(chunks))["session"]["title"] == "How long are the notes?"


def bad(raw: bytes | str, owner: Any, workspace: Workspace, message: str) -> None:
    counts = (ChatSession.objects.count(), Turn.objects.count(), Result.objects.count())
    with pytest.raises(ImportRejected, match=message):
        session_import(owner=owner, workspace=workspace, raw=raw.encode() if isinstance(raw, str) else raw)
    assert (ChatSession.objects.count(), Turn.objects.count(), Result.objects.count()) == counts


def test_bad_files_are_refused_with_what_is_wrong_and_nothing_stored(
    live_session: ChatSession, model: ScriptedServer, other_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = exported(chatted(live_session, model))
    workspace = live_session.workspace
    bad(b"\xff\xfe", other_user, workspace, "not text in UTF-8")
    bad("{", other_user, workspace, "not valid JSON")
    bad("[]", other_user, workspace, "not a Cachet session export")
    bad(json.dumps({**data, "format": "other"}), other_user, workspace, "not a Cachet session export")
    bad(json.dumps({**data, "version": 2}), other_user, workspace, "has version 2; this Cachet reads version 1")

    def changed(path: tuple[str | int, ...], value: object, *, drop: bool = False) -> str:
        copy = json.loads(json.dumps(data))
        target = copy
        for key in path[:-1]:
            target = target[key]
        if drop:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return json.dumps(copy)

    bad(changed(("turns", 0, "words"), None, drop=True), other_user, workspace, r"turns\[0\]\.words: missing")
    bad(changed(("turns", 1, "parent"), 9), other_user, workspace, r"turns\[1\]\.parent: there is no earlier turn 9")
    bad(changed(("turns", 0, "status"), "gone"), other_user, workspace, r"turns\[0\]\.status: 'gone' is none of")
    bad(changed(("results", 0, "step"), 7), other_user, workspace, r"results\[0\]\.step: turn 1 has no step 7")
    bad(changed(("results", 1, "number"), 1), other_user, workspace, "results: 1 appears twice")
    bad(changed(("session", "next_result_number"), 2), other_user, workspace, "must be past the last result, 2")
    bad(changed(("steps", 0, "tool_calls"), [{"id": 1}]), other_user, workspace, r"steps\[0\]\.tool_calls\[0\]")
    bad(changed(("requests", 0, "started_at"), "yesterday"), other_user, workspace, "a date and time")
    bad(changed(("session", "title"), "x" * 201), other_user, workspace, "at most 200 characters")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise DataError("value too long for type character varying(8)")

    monkeypatch.setattr(Result.objects, "bulk_create", broken)
    bad(json.dumps(data), other_user, workspace, r"could not be stored \(value too long.*nothing was imported")


def test_only_a_workspace_the_person_may_use_and_only_so_big(
    live_session: ChatSession, model: ScriptedServer, other_user: Any, workspace_dir: Any
) -> None:
    raw = "".join(export_chunks(chatted(live_session, model), exported_at=WHEN)).encode()
    private = Workspace.objects.create(name="private", folder=str(workspace_dir))
    private.members.add(live_session.owner)
    bad(raw, other_user, private, "You may not use the workspace private")
    assert session_import(owner=live_session.owner, workspace=private, raw=raw).workspace == private

    class Upload:
        def read(self, size: int) -> bytes:
            return raw[:size]

    with pytest.raises(ImportRejected, match=r"The file is 2\.0 MB; an import is at most 1 MB"):
        read_upload(Upload(), size=2 * 1_048_576, limit=1_048_576)  # type: ignore[arg-type]
    with pytest.raises(ImportRejected, match="larger than 0 MB"):
        read_upload(Upload(), size=10, limit=100)  # type: ignore[arg-type]
    assert read_upload(Upload(), size=len(raw), limit=len(raw)) == raw  # type: ignore[arg-type]


EDITED = "".join(f"line {n}\n" for n in range(1, 31)).replace("line 1\n", "LINE 1\n", 1)


def edited(session: ChatSession, model: ScriptedServer) -> ChatSession:
    """A session whose live turn read and then edited ``notes.md``, with a later turn undone: its export holds
    an edit's ``changed_files`` and ``stale``, tool calls, and a pending break."""
    model.push(
        Step(text="Reading.", tool_calls=[("read", {"path": "notes.md"})]),
        Step(
            text="Fixing.",
            tool_calls=[("edit", {"path": "notes.md", "old_string": "line 1\n", "new_string": "LINE 1\n"})],
        ),
        Step(text="Fixed."),
        Step(text="Nothing else."),
    )
    loop = ReplyLoop(session)
    run(loop.send("Capitalise the first line", date="2026-11-30"))
    run(loop.send("Anything else?", date="2026-11-30"))
    run(loop.undo())
    session.refresh_from_db()
    return session


def undo_restoring(session: ChatSession, notes: Path) -> tuple[str, ...]:
    """Undo the imported session's live turn with its files restored, from the content its edit left."""
    notes.write_text(EDITED)
    return run(ReplyLoop(session).undo(restore=True)).taken_back.conflicts


def test_an_imported_edit_is_undone_with_its_file_restored(
    live_session: ChatSession, model: ScriptedServer, other_user: Any, notes: Path
) -> None:
    data = exported(edited(live_session, model))
    edit = next(result for result in data["results"] if result["kind"] == "edit")
    assert edit["stale"] == [1] and [change["action"] for change in edit["changed_files"]] == ["update"]
    assert [item["cause"] for item in data["session"]["pending_breaks"]] == ["undo"]
    imported = session_import(owner=other_user, workspace=live_session.workspace, raw=json.dumps(data).encode())
    assert undo_restoring(imported, notes) == ()
    assert notes.read_text() == EDITED.replace("LINE 1\n", "line 1\n")


def test_fields_read_later_are_refused_when_they_are_not_what_is_read(
    live_session: ChatSession, model: ScriptedServer, other_user: Any
) -> None:
    data = exported(edited(live_session, model))
    at = next(index for index, result in enumerate(data["results"]) if result["kind"] == "edit")
    change = f"results\\[{at}\\]\\.changed_files\\[0\\]"

    def refused(path: tuple[str | int, ...], value: object, message: str, *, drop: bool = False) -> None:
        bad(json.dumps(mutated(data, path, value, drop=drop)), other_user, live_session.workspace, message)

    edit: tuple[str | int, ...] = ("results", at)
    refused((*edit, "changed_files"), [1, "a.txt"], f"{change}: an object is expected")
    refused((*edit, "changed_files"), {"abs_path": "/x"}, rf"results\[{at}\]\.changed_files: a list is expected")
    refused((*edit, "changed_files", 0, "abs_path"), ["/x"], f"{change}\\.abs_path: a string is expected")
    refused((*edit, "changed_files", 0, "sha256"), 7, f"{change}\\.sha256: a string is expected")
    refused((*edit, "changed_files", 0, "previous_text"), 5, f"{change}\\.previous_text: a string is expected")
    refused((*edit, "changed_files", 0, "lines"), "30", f"{change}\\.lines: a whole number from 0 is expected")
    refused((*edit, "changed_files", 0, "action"), "rename", f"{change}\\.action: 'rename' is none of")
    refused((*edit, "changed_files", 0, "previous_text"), None, f"{change}\\.previous_text: missing", drop=True)
    refused((*edit, "changed_files", 0, "mode"), 420, f"{change}\\.mode: not a field of this object")
    refused((*edit, "stale"), ["#0001"], rf"results\[{at}\]\.stale\[0\]: a whole number from 1 is expected")
    refused(("session", "pending_breaks"), ["undo"], r"session\.pending_breaks\[0\]: an object is expected")
    refused(("session", "pending_breaks", 0, "turn"), "2", r"session\.pending_breaks\[0\]\.turn: a whole number")
    refused(("session", "pending_breaks", 0, "cause"), "new_turn", r"session\.pending_breaks\[0\]\.cause: 'new_turn'")
    refused(("generations", 0, "tools_json"), "[1]", r"generations\[0\]\.tools_json: a JSON list of tools")
    refused(("requests", 0, "usage"), [1], r"requests\[0\]\.usage: an object or null is expected")
    refused(("requests", 0, "total_time"), float("nan"), r"requests\[0\]\.total_time: a number from 0 is expected")
    refused(("requests", 0, "time_to_first_token"), -1, r"requests\[0\]\.time_to_first_token: a number from 0")
    refused((*edit, "stale"), [9], rf"results\[{at}\]\.stale\[0\]: there is no result 9")
    refused((*edit, "refers_to"), at + 1, rf"results\[{at}\]\.refers_to: there is no earlier result {at + 1}")


def mutated(data: dict[str, Any], path: tuple[str | int, ...], value: object, *, drop: bool = False) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(data))
    target: Any = copy
    for key in path[:-1]:
        target = target[key]
    if drop:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return copy


FREE = ("arguments", "usage", "timings")  # any JSON (an object or null for the last two): not read key by key


def leaves(value: object, path: tuple[str | int, ...] = ()) -> list[tuple[tuple[str | int, ...], object]]:
    """Every field of the export with its value, objects and lists included, outermost first."""
    found: list[tuple[tuple[str | int, ...], object]] = [(path, value)] if path else []
    if path and path[-1] in FREE:
        return found
    if isinstance(value, dict):
        for key, item in value.items():
            found += leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += leaves(item, (*path, index))
    return found


def place(path: tuple[str | int, ...]) -> str:
    return "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in path).lstrip(".")


WRONG: list[object] = [None, True, 7, -1, 1.5, "x", "", [], [7], ["x"], [None], [{}], {}, {"x": 1}]
PLACE = re.compile(r"^(session|last_request|generations|turns|steps|results|requests)(\[\d+\])?(\.\w+(\[\d+\])?)*: ")


def test_every_field_of_the_wrong_type_is_refused_at_its_place_or_undo_with_restore_still_works(
    live_session: ChatSession, model: ScriptedServer, other_user: Any, notes: Path
) -> None:
    """One field at a time, each field of a real export (every row, every key of an edit's changed files, each
    pending break) becomes a value of another type: refused naming where, or imported and undone with its
    files restored without an error."""
    data = exported(edited(live_session, model))
    accepted = refused = 0
    for path, value in leaves(data):
        if path[0] in ("format", "version"):
            continue
        for wrong in WRONG:
            if type(wrong) is type(value) and not isinstance(value, list):
                continue
            raw = json.dumps(mutated(data, path, wrong)).encode()
            try:
                parse_export(raw)
            except ImportRejected as error:
                refused += 1
                assert PLACE.match(str(error)), (place(path), wrong, str(error))
                if not isinstance(wrong, list | dict) and not isinstance(value, list | dict):
                    assert place(path).startswith(str(error).split(": ")[0]), (place(path), wrong, str(error))
                continue
            accepted += 1
            imported = session_import(owner=other_user, workspace=live_session.workspace, raw=raw)
            live = Turn.objects.filter(session=imported, status="done").exists()
            if live:
                undo_restoring(imported, notes)
    assert refused > 1000 and accepted > 20, (refused, accepted)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def test_any_json_in_any_field_is_refused_at_its_place_or_imported_and_undone(
    live_session: ChatSession, model: ScriptedServer, other_user: Any, notes: Path
) -> None:
    data = exported(edited(live_session, model))
    paths = [path for path, _ in leaves(data) if path[0] not in ("format", "version")]

    @settings(max_examples=150, deadline=None)
    @given(path=st.sampled_from(paths), value=JSON)
    def check(path: tuple[str | int, ...], value: object) -> None:
        raw = json.dumps(mutated(data, path, value)).encode()
        try:
            parse_export(raw)
        except ImportRejected as error:
            assert PLACE.match(str(error)), (place(path), value, str(error))
            return
        imported = session_import(owner=other_user, workspace=live_session.workspace, raw=raw)
        if Turn.objects.filter(session=imported, status="done").exists():
            undo_restoring(imported, notes)

    check()


def test_a_field_whose_name_is_no_name_is_refused_at_its_object(
    live_session: ChatSession, model: ScriptedServer, other_user: Any
) -> None:
    data = exported(edited(live_session, model))
    change = next(
        (index, result["changed_files"][0]) for index, result in enumerate(data["results"]) if result["changed_files"]
    )
    change[1][""] = None
    with pytest.raises(ImportRejected) as caught:
        session_import(owner=other_user, workspace=live_session.workspace, raw=json.dumps(data).encode())
    assert str(caught.value).startswith(f'results[{change[0]}].changed_files[0]: "" is not a field of this object')


def test_an_import_beside_the_session_it_came_from_is_named_apart(
    live_session: ChatSession, model: ScriptedServer
) -> None:
    """Imported by the person who has the original, a session kept its title, and the list showed two entries of
    one name; it is named apart. Imported by another person, or after the original is deleted, it keeps it."""
    original = chatted(live_session, model)
    ChatSession.objects.filter(pk=original.pk).update(title="Parser notes")
    original.refresh_from_db()
    raw = "".join(export_chunks(original, exported_at=WHEN)).encode()
    again = session_import(owner=original.owner, workspace=original.workspace, raw=raw)
    assert (original.title, again.title) == ("Parser notes", "Parser notes (imported)")
    ChatSession.objects.filter(pk__in=[original.pk, again.pk]).update(deleted_at=WHEN)
    assert session_import(owner=original.owner, workspace=original.workspace, raw=raw).title == "Parser notes"
