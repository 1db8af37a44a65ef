"""The login mark: a cookie that shows a request comes from a login, checked without the database.

The request body limits are decided before a body is read, under Daphne in Twisted's reactor, where no database
call may be made; the larger limits of Attach and Import are for people who are logged in. So each response to a
logged-in request carries, beside the session cookie, a mark: the session key signed with ``SECRET_KEY`` and the
time (:class:`django.core.signing.TimestampSigner`), valid for ``SESSION_COOKIE_AGE``. A session key is made anew
at each login and logout, so a mark fits only the session cookie of a login. Without one, a client gets the
ordinary limit at every address.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.core import signing
from django.db import DatabaseError
from django.http import HttpRequest
from django.http.cookie import parse_cookie
from django.http.response import HttpResponseBase
from django.utils.deprecation import MiddlewareMixin

MARKED = "login"
SALT = "cachet.login_mark"


def _signer(session_key: str) -> signing.TimestampSigner:
    return signing.TimestampSigner(salt=f"{SALT}:{session_key}")


def login_mark(session_key: str) -> str:
    """The mark of the session whose key (the session cookie's value) is ``session_key``."""
    return _signer(session_key).sign(MARKED)


def mark_fits(mark: str, session_key: str, *, max_age: int | None = None) -> bool:
    """Whether ``mark`` was made for ``session_key``, at most ``max_age`` seconds ago (``SESSION_COOKIE_AGE``)."""
    if not mark or not session_key:
        return False
    age = settings.SESSION_COOKIE_AGE if max_age is None else max_age
    try:
        return _signer(session_key).unsign(mark, max_age=age) == MARKED
    except signing.BadSignature:
        return False


def shows_login(cookies: Mapping[str, str]) -> bool:
    """Whether a request with these cookies shows a login: a mark that fits its session cookie."""
    session_key = cookies.get(settings.SESSION_COOKIE_NAME, "")
    return mark_fits(cookies.get(settings.CACHET_LOGIN_COOKIE_NAME, ""), session_key)


def header_shows_login(cookie_header: str) -> bool:
    """:func:`shows_login` of a request's ``Cookie`` header."""
    return bool(cookie_header) and shows_login(parse_cookie(cookie_header))


def _session_key_after(request: HttpRequest, response: HttpResponseBase) -> str:
    """The session cookie the client holds once it has ``response``: the one set there, else the request's."""
    morsel = response.cookies.get(settings.SESSION_COOKIE_NAME)
    if morsel is not None:
        return morsel.value  # empty where the session cookie is deleted
    return request.COOKIES.get(settings.SESSION_COOKIE_NAME, "")


class LoginMarkMiddleware(MiddlewareMixin):
    """Gives the response to a request whose session is a login the mark of that session (again once half its age
    has passed), and takes it away once the session is not. Only where the request read its session, so it costs no
    query; before ``SessionMiddleware`` in ``MIDDLEWARE``, so that it sees the session cookie a login or logout sets.
    """

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        name = settings.CACHET_LOGIN_COOKIE_NAME
        session_key = _session_key_after(request, response)
        mark = request.COOKIES.get(name, "")
        if mark_fits(mark, session_key, max_age=settings.SESSION_COOKIE_AGE // 2):
            return response
        session = getattr(request, "session", None)
        if session is None or not session.accessed:
            return response
        try:
            logged_in = bool(session_key) and bool(session.get(SESSION_KEY))
        except DatabaseError:  # the database is away: the page says so, and the mark waits for the next one
            return response
        if logged_in:
            response.set_cookie(
                name,
                login_mark(session_key),
                max_age=settings.SESSION_COOKIE_AGE,
                path="/",
                secure=settings.SESSION_COOKIE_SECURE,
                httponly=True,
                samesite="Lax",
            )
        elif mark:
            response.delete_cookie(name, path="/", samesite="Lax")
        return response
