"""When the database goes away: pages answer 503 with one line a person can act on, websockets close cleanly,
and the detail (a socket path, a host) goes to the log only. Nothing here holds state, so the next request
after Postgres is back just works."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseServerError
from django.template.loader import render_to_string
from django.views import defaults

from cachet.asgi_types import ASGIApp, Message, Receive, Scope, Send
from sessions_app.errors import DATABASE_UNAVAILABLE, is_database_unavailable

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
DATABASE_UNAVAILABLE_CLOSE = 4503  # an application's close code (4000-4999), as the consumer's 4401 and 4404


def unavailable_response(request: HttpRequest, error: BaseException) -> HttpResponse:
    """The 503 page; rendered without the request's context, which would ask the database who is logged in."""
    logger.error("database unavailable for %s %s: %s", request.method, request.path, error)
    body = render_to_string("503.html", {"message": DATABASE_UNAVAILABLE})
    response = HttpResponse(body, status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


class DatabaseUnavailableMiddleware:
    """Turns a database error raised by a view (or its template) into the 503 page."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if is_database_unavailable(exception):
            return unavailable_response(request, exception)
        return None


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: the 503 page for a database error raised outside a view (a middleware), else Django's."""
    error = sys.exc_info()[1]
    if error is not None and is_database_unavailable(error):
        return unavailable_response(request, error)
    response: HttpResponseServerError = defaults.server_error(request)
    return response


class WebsocketDatabaseGuard:
    """Wraps the websocket application: a database error while connecting (reading the login) or later closes
    the socket with :data:`DATABASE_UNAVAILABLE_CLOSE` instead of an exception inside the application."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = {"accepted": False, "closed": False}

        async def tracked_send(message: Message) -> None:
            if message["type"] == "websocket.accept":
                state["accepted"] = True
            elif message["type"] == "websocket.close":
                state["closed"] = True
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except Exception as error:
            if not is_database_unavailable(error):
                raise
            logger.error("database unavailable for websocket %s: %s", scope.get("path", ""), error)
            if state["closed"]:
                return
            if not state["accepted"]:
                await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": DATABASE_UNAVAILABLE_CLOSE})
