"""The REST API through Django's whole stack (middleware, django-ninja, the selectors), on the real Postgres: who
may call it, what each route reads and changes, and that another person's session is never found."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from chat.web.logins import failures_from
from sessions_app.models import ApiToken, ChatSession, Result, ResultKind, Step, Turn, TurnStatus
from sessions_app.services.tokens import api_token_create, api_token_revoke

pytestmark = pytest.mark.django_db


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture(autouse=True)
def _no_failures_carried() -> None:
    cache.clear()


@pytest.fixture
def reader(user: Any) -> str:
    return api_token_create(owner=user, name="script", access="read").secret


@pytest.fixture
def writer(user: Any) -> str:
    return api_token_create(owner=user, name="plugin", access="write").secret


@pytest.fixture
def bobs(other_user: Any) -> str:
    return api_token_create(owner=other_user, name="bob's", access="write").secret


def a_turn(session: ChatSession) -> Turn:
    """A finished turn with one step that called ``read``, and the stored result of that call (``#0001``)."""
    turn = Turn.objects.create(
        session=session,
        number=1,
        generation=session.generations.get(number=1),
        words="what is in notes.txt?",
        message="what is in notes.txt?",
        mode=session.mode,
        reply_text="It says hello.",
        status=TurnStatus.DONE,
    )
    step = Step.objects.create(
        turn=turn, number=1, text="", tool_calls=[{"id": "c1", "name": "read", "arguments": '{"path": "notes.txt"}'}]
    )
    Step.objects.create(turn=turn, number=2, text="It says hello.", finish_reason="stop")
    Result.objects.create(
        session=session,
        number=1,
        turn=turn,
        step=step,
        call_id="c1",
        tool="read",
        arguments_raw='{"path": "notes.txt"}',
        kind=ResultKind.READ,
        full_text="hello\n",
        inserted_text="[#0001 notes.txt lines 1-1 of 1]\nhello\n",
        path="notes.txt",
        first_line=1,
        last_line=1,
        total_lines=1,
    )
    return turn


def test_a_request_without_a_token_is_told_how_to_send_one() -> None:
    answer = Client().get("/api/v1/sessions")
    assert answer.status_code == 401
    assert "Authorization: Bearer" in answer.json()["detail"]
    assert answer["WWW-Authenticate"].startswith("Bearer")


def test_a_logged_in_browser_is_not_a_token(user: Any) -> None:
    """The API is for tokens only: a page's session cookie (and so a page on another site) does not reach it."""
    client = Client()
    client.force_login(user)
    assert client.get("/api/v1/sessions").status_code == 401


def test_a_wrong_or_revoked_token_is_refused_and_counted(user: Any, reader: str) -> None:
    assert Client().get("/api/v1/me", headers=bearer(reader)).status_code == 200
    token = ApiToken.objects.get(owner=user)
    api_token_revoke(token=token)
    answer = Client().get("/api/v1/me", headers=bearer(reader))
    assert answer.status_code == 401
    assert answer.json()["detail"] == "That token is not known, or was revoked."
    assert Client().get("/api/v1/me", headers=bearer("cachet_" + "x" * 43)).status_code == 401
    assert failures_from("127.0.0.1", kind="api") == 2


def test_wrong_tokens_are_throttled_before_any_is_looked_up(settings: Any, writer: str) -> None:
    settings.CACHET_LOGIN_IP_FAILURES_PER_MINUTE = 3
    settings.CACHET_LOGIN_REFUSAL_DELAY = 0
    client = Client()
    for _ in range(3):
        assert client.get("/api/v1/me", headers=bearer("cachet_guess")).status_code == 401
    refused = client.get("/api/v1/me", headers=bearer(writer))  # even the right one, from that address, for a minute
    assert refused.status_code == 429
    assert refused["Retry-After"] == "60"
    assert "try again in a minute" in refused.json()["detail"]
    other = Client(REMOTE_ADDR="10.1.2.3")
    assert other.get("/api/v1/me", headers=bearer(writer)).status_code == 200


def test_me_names_the_person_and_the_token(user: Any, reader: str) -> None:
    answer = Client().get("/api/v1/me", headers=bearer(reader))
    assert answer.json() == {"username": "ada", "staff": False, "token": {"name": "script", "access": "read"}}
    assert ApiToken.objects.get(owner=user).last_used_at is not None


def test_the_session_list_is_the_persons_own(
    chat_session: ChatSession, other_user: Any, reader: str, bobs: str
) -> None:
    listed = Client().get("/api/v1/sessions", headers=bearer(reader)).json()
    assert listed["count"] == 1
    item = listed["items"][0]
    assert item["id"] == chat_session.pk
    assert item["model"] == "scripted" and item["workspace"] == "ws" and item["running"] is False
    assert item["url"].endswith(f"/sessions/{chat_session.pk}/")
    assert item["totals"]["requests"] == 0
    assert Client().get("/api/v1/sessions", headers=bearer(bobs)).json() == {"count": 0, "items": []}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", "", None),
        ("patch", "", {"title": "mine now"}),
        ("delete", "", None),
        ("get", "/turns", None),
        ("get", "/turns/1", None),
        ("get", "/results/0001", None),
        ("get", "/export", None),
        ("get", "/events", None),
        ("post", "/messages", {"text": "hi"}),
        ("post", "/stop", None),
        ("post", "/undo", {}),
        ("post", "/rewind", {"turn": 1}),
        ("post", "/regenerate", {}),
    ],
)
def test_another_persons_session_is_not_found(
    chat_session: ChatSession, bobs: str, method: str, path: str, body: dict[str, Any] | None
) -> None:
    a_turn(chat_session)
    call = getattr(Client(), method)
    answer = call(
        f"/api/v1/sessions/{chat_session.pk}{path}", body, content_type="application/json", headers=bearer(bobs)
    )
    assert answer.status_code == 404, answer.content
    chat_session.refresh_from_db()
    assert chat_session.title == "" and chat_session.deleted_at is None


def test_a_read_only_token_reads_and_changes_nothing(chat_session: ChatSession, reader: str) -> None:
    client = Client()
    assert client.get(f"/api/v1/sessions/{chat_session.pk}", headers=bearer(reader)).status_code == 200
    for method, path in (("patch", ""), ("delete", ""), ("post", "/messages"), ("post", "/stop")):
        answer = getattr(client, method)(
            f"/api/v1/sessions/{chat_session.pk}{path}",
            {"text": "x"},
            content_type="application/json",
            headers=bearer(reader),
        )
        assert answer.status_code == 403, (method, path)
        assert "read-only" in answer.json()["detail"]
    chat_session.refresh_from_db()
    assert chat_session.deleted_at is None


def test_rename_pin_archive_and_delete(chat_session: ChatSession, writer: str) -> None:
    client = Client()
    url = f"/api/v1/sessions/{chat_session.pk}"
    changed = client.patch(
        url, {"title": "  Notes  ", "pinned": True}, content_type="application/json", headers=bearer(writer)
    )
    assert changed.status_code == 200
    assert (changed.json()["title"], changed.json()["pinned"]) == ("Notes", True)
    archived = client.patch(url, {"archived": True}, content_type="application/json", headers=bearer(writer)).json()
    assert (archived["archived"], archived["pinned"]) == (True, False)
    assert client.get("/api/v1/sessions", headers=bearer(writer)).json()["count"] == 0
    assert client.get("/api/v1/sessions?archived=true", headers=bearer(writer)).json()["count"] == 1
    assert client.delete(url, headers=bearer(writer)).status_code == 204
    assert client.get(url, headers=bearer(writer)).status_code == 404
    assert ChatSession.objects.filter(pk=chat_session.pk, deleted_at__isnull=False).exists()  # kept for the admin


def test_turns_show_steps_calls_and_their_result_ids(chat_session: ChatSession, reader: str) -> None:
    a_turn(chat_session)
    listed = Client().get(f"/api/v1/sessions/{chat_session.pk}/turns", headers=bearer(reader)).json()
    assert listed["count"] == 1
    turn = listed["items"][0]
    assert (turn["number"], turn["position"], turn["live"], turn["reply"]) == (1, 1, True, "It says hello.")
    assert turn["steps"][0]["tool_calls"] == [{"name": "read", "arguments": '{"path": "notes.txt"}', "result": "#0001"}]
    assert Client().get(f"/api/v1/sessions/{chat_session.pk}/turns/1", headers=bearer(reader)).json() == turn
    assert Client().get(f"/api/v1/sessions/{chat_session.pk}/turns/2", headers=bearer(reader)).status_code == 404


@pytest.mark.parametrize("rid", ["0001", "%230001", "1"])
def test_a_result_by_its_id_as_the_model_saw_it(chat_session: ChatSession, reader: str, rid: str) -> None:
    a_turn(chat_session)
    result = Client().get(f"/api/v1/sessions/{chat_session.pk}/results/{rid}", headers=bearer(reader)).json()
    assert result["id"] == "#0001" and result["turn"] == 1 and result["full_text"] == "hello\n"
    assert result["inserted_text"].startswith("[#0001 notes.txt")
    assert result["status"] == "lines 1-1 of 1"


@pytest.mark.parametrize("rid", ["0002", "zz", "-1", "0"])
def test_a_result_that_is_not_there(chat_session: ChatSession, reader: str, rid: str) -> None:
    a_turn(chat_session)
    answer = Client().get(f"/api/v1/sessions/{chat_session.pk}/results/{rid}", headers=bearer(reader))
    assert answer.status_code == 404


def test_export_as_json_and_markdown(chat_session: ChatSession, reader: str) -> None:
    a_turn(chat_session)
    url = f"/api/v1/sessions/{chat_session.pk}/export"
    exported = Client().get(url, headers=bearer(reader))
    assert exported.status_code == 200
    data = json.loads(exported.getvalue())
    assert data["format"] == "cachet-session" and len(data["turns"]) == 1
    markdown = Client().get(url + "?format=markdown", headers=bearer(reader)).getvalue().decode()
    assert "what is in notes.txt?" in markdown
    assert Client().get(url + "?format=pdf", headers=bearer(reader)).status_code == 422


def test_a_body_not_of_the_schema_says_what_is_wrong(chat_session: ChatSession, writer: str) -> None:
    answer = Client().post(
        f"/api/v1/sessions/{chat_session.pk}/rewind",
        {"turn": "first"},
        content_type="application/json",
        headers=bearer(writer),
    )
    assert answer.status_code == 422
    assert answer.json()["detail"].startswith("The request is not as the schema says. turn:")


def test_the_schema_is_served_at_openapi_json() -> None:
    schema = Client().get("/api/v1/openapi.json").json()
    assert schema["info"]["title"] == "Cachet API"
    assert "/api/v1/sessions/{session_id}/messages" in schema["paths"]
    assert schema["components"]["securitySchemes"]["TokenAuth"]["scheme"] == "bearer"
