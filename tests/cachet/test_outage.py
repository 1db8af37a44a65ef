"""The outage middleware, error handler and websocket guard on their own; tests/cachet/test_db_outage.py runs
them against a Postgres that really stops."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.db import OperationalError
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from cachet.outage import (
    DATABASE_UNAVAILABLE_CLOSE,
    DatabaseUnavailableMiddleware,
    WebsocketDatabaseGuard,
    server_error,
)
from sessions_app.errors import DATABASE_UNAVAILABLE

DETAIL = 'connection to server on socket "/srv/cachet/pg/.s.PGSQL.5432" failed'


def _ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def _check_unavailable_page(response: HttpResponse) -> None:
    body = response.content.decode()
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert f"{DATABASE_UNAVAILABLE} Try again in a moment." in body
    assert "/srv/cachet" not in body and ".s.PGSQL" not in body
    assert 'href="/static/cachet/cachet.css"' in body  # styled like the other pages


def test_a_view_whose_database_is_away_answers_503(caplog: pytest.LogCaptureFixture) -> None:
    middleware = DatabaseUnavailableMiddleware(_ok)
    request = RequestFactory().get("/sessions/3/")
    response = middleware.process_exception(request, OperationalError(DETAIL))
    assert response is not None
    _check_unavailable_page(response)
    assert DETAIL in caplog.text and "GET /sessions/3/" in caplog.text
    assert middleware.process_exception(request, ValueError("other")) is None


def test_a_database_error_outside_a_view_answers_503_and_others_500() -> None:
    request = RequestFactory().get("/")
    try:
        raise OperationalError(DETAIL)
    except OperationalError:
        _check_unavailable_page(server_error(request))
    try:
        raise KeyError("x")
    except KeyError:
        assert server_error(request).status_code == 500


def _guarded(fail_after_accept: bool, error: Exception) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if fail_after_accept:
            await send({"type": "websocket.accept"})
        raise error

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    asyncio.run(WebsocketDatabaseGuard(app)({"type": "websocket", "path": "/ws/sessions/1/"}, receive, send))
    return sent


def test_a_websocket_whose_database_is_away_is_closed_with_its_code() -> None:
    close = {"type": "websocket.close", "code": DATABASE_UNAVAILABLE_CLOSE}
    assert _guarded(False, OperationalError(DETAIL)) == [{"type": "websocket.accept"}, close]
    assert _guarded(True, OperationalError(DETAIL)) == [{"type": "websocket.accept"}, close]
    with pytest.raises(ValueError):
        _guarded(False, ValueError("not the database"))
