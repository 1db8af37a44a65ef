"""Who calls the API: a personal access token as ``Authorization: Bearer …``, checked on every request.

A wrong token counts against the caller's address as a failed login does (``chat.web.logins``), and an address over
``CACHET_LOGIN_IP_FAILURES_PER_MINUTE`` is refused with 429 before any token is looked up. A read-only token reads;
only a read-write one changes anything.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest
from ninja.security.http import HttpAuthBase

from chat.web.logins import FAILURE_WINDOW_SECONDS, client_address, failure_count, failures_from
from sessions_app.models import ApiToken
from sessions_app.selectors.tokens import api_token_presented
from sessions_app.services.tokens import api_token_used

READING_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
FAILURE_KIND = "api"
MISSING = "Send a personal access token as 'Authorization: Bearer cachet_…' (make one under API tokens)."
UNKNOWN = "That token is not known, or was revoked."
READ_ONLY = "This token is read-only; make a read-write token to change sessions."
THROTTLED = "Too many requests with a wrong token from your address; try again in a minute."


class ApiRefused(Exception):
    """A request the API refuses before any route runs: its status, what it is told, and its headers."""

    def __init__(self, status: int, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or {}


def _bearer() -> dict[str, str]:
    return {"WWW-Authenticate": 'Bearer realm="cachet"'}


class TokenAuth(HttpAuthBase):
    """django-ninja's check of each request: the token's owner becomes ``request.user``, the token ``request.auth``."""

    openapi_scheme = "bearer"

    def __call__(self, request: HttpRequest) -> ApiToken:
        address = client_address(request)
        limit = settings.CACHET_LOGIN_IP_FAILURES_PER_MINUTE
        if limit > 0 and failures_from(address, kind=FAILURE_KIND) >= limit:
            raise ApiRefused(429, THROTTLED, headers={"Retry-After": str(FAILURE_WINDOW_SECONDS)})
        scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise ApiRefused(401, MISSING, headers=_bearer())
        token = api_token_presented(secret=secret.strip())
        if token is None:
            failure_count(address, kind=FAILURE_KIND)
            raise ApiRefused(401, UNKNOWN, headers=_bearer())
        if request.method not in READING_METHODS and not token.writes:
            raise ApiRefused(403, READ_ONLY)
        api_token_used(token=token)
        request.user = token.owner
        return token
