from __future__ import annotations

import threading

import pytest
from django.db import connection

from sessions_app.hygiene.outcomes import OutputOutcome
from sessions_app.models import ChatSession, Result, Turn
from sessions_app.services.results import result_insert
from sessions_app.services.turns import turn_start


@pytest.mark.django_db(transaction=True)
def test_result_numbers_never_repeat_under_eight_threads(chat_session: ChatSession) -> None:
    turn = turn_start(session=chat_session, words="go", today="2026-11-29", instructions=None)
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def insert_many(worker: int) -> None:
        try:
            barrier.wait()
            for index in range(25):
                result_insert(
                    turn=Turn.objects.get(pk=turn.pk),
                    step=None,
                    call_id=f"call_{worker}_{index}",
                    tool="run",
                    arguments={"command": f"echo {worker} {index}"},
                    arguments_raw="{}",
                    outcome=OutputOutcome(text=f"{worker} {index}"),
                )
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=insert_many, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    numbers = list(Result.objects.filter(session=chat_session).values_list("number", flat=True))
    assert sorted(numbers) == list(range(1, 201))
    chat_session.refresh_from_db()
    assert chat_session.next_result_number == 201
    texts = set(Result.objects.filter(session=chat_session).values_list("inserted_text", flat=True))
    assert len(texts) == 200
    assert all(text.startswith(f"[#{n:04x}]") for n, text in Result.objects.values_list("number", "inserted_text"))


@pytest.mark.django_db
def test_a_deleted_session_leaves_its_owners_sight_and_keeps_everything_stored(chat_session: ChatSession) -> None:
    from sessions_app.services.compaction import compaction_apply
    from sessions_app.services.sessions import session_delete
    from sessions_app.services.turns import turn_finish

    turn = turn_start(session=chat_session, words="go", today="2026-11-29", instructions=None)
    result_insert(
        turn=turn, step=None, call_id="c", tool="run", arguments={}, arguments_raw="{}", outcome=OutputOutcome(text="x")
    )
    turn_finish(turn=turn)
    compaction_apply(session=chat_session, summary="We ran x.")
    session_delete(session=chat_session)
    from sessions_app.selectors.sessions import session_get, session_list

    assert session_get(owner=chat_session.owner, session_id=chat_session.pk) is None
    assert not session_list(owner=chat_session.owner).exists()
    assert ChatSession.objects.get(pk=chat_session.pk).deleted_at is not None, "the admin still sees it"
    assert Result.objects.count() == 1 and Turn.objects.count() == 1
