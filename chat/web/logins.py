"""Login limits.

Two limits keep wrong-password guessing cheap for everyone else:

- django-axes locks a (username, client address) pair after ``CACHET_LOGIN_FAILURES`` failures for
  ``CACHET_LOGIN_LOCKOUT_MINUTES``; a locked pair is refused before any password is checked.
- :class:`FailedLoginLimitMiddleware` refuses every login from an address that failed
  ``CACHET_LOGIN_IP_FAILURES_PER_MINUTE`` times within a minute, again before any password check, so
  guessing with ever new usernames cannot keep the server hashing passwords.

Both answer 429 with Cachet's login page and a message that says what happened, and
:class:`RefusalDelayMiddleware` holds that answer ``CACHET_LOGIN_REFUSAL_DELAY`` seconds without holding a
thread, so a client that keeps guessing gets about one answer a second per connection.
"""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import markcoroutinefunction
from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.signals import user_login_failed
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.utils.deprecation import MiddlewareMixin

LOGIN_VIEWS = frozenset({"login", "admin:login"})
FAILURE_WINDOW_SECONDS = 60
TOO_MANY_REQUESTS = 429


def client_address(request: HttpRequest) -> str | None:
    """The client's address: ``REMOTE_ADDR``, or with ``CACHET_PROXY_COUNT`` = N trusted reverse proxies in
    front, the N-th ``X-Forwarded-For`` entry from the right (the one the outermost proxy added)."""
    remote: str | None = request.META.get("REMOTE_ADDR") or None
    count: int = settings.CACHET_PROXY_COUNT
    if count <= 0:
        return remote
    forwarded: str = request.META.get("HTTP_X_FORWARDED_FOR", "")
    hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
    if len(hops) < count:
        return remote
    return hops[-count]


def lockout_message() -> str:
    minutes = settings.CACHET_LOGIN_LOCKOUT_MINUTES
    return (
        "Too many failed logins for this account from your address; "
        f"try again in {minutes} minute{'' if minutes == 1 else 's'} or ask an admin to unlock it."
    )


def throttle_message() -> str:
    return "Too many failed logins from your address; try again in a minute."


def _refused(request: HttpRequest, message: str) -> HttpResponse:
    context = {"form": AuthenticationForm(request), "refused": message, "next": request.POST.get("next", "")}
    return render(request, "registration/login.html", context, status=TOO_MANY_REQUESTS)


def lockout_response(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """axes' ``AXES_LOCKOUT_CALLABLE``: the login page with the lockout message, status 429."""
    return _refused(request, lockout_message())


class LockoutBackend(AxesStandaloneBackend):  # type: ignore[misc]
    """axes' lockout check, first of ``AUTHENTICATION_BACKENDS``. A login without a request (a script, the
    test client's ``login``) has no address to hold against it and is left to the next backend."""

    def authenticate(self, request: HttpRequest | None, *args: Any, **kwargs: Any) -> None:
        if request is None:
            return None
        super().authenticate(request, *args, **kwargs)
        return None


def _failures_key(address: str | None, kind: str) -> str:
    return f"cachet:{kind}-failures:{address or 'unknown'}"


def failures_from(address: str | None, *, kind: str = "login") -> int:
    """Failed logins (or API tokens: ``kind``) from ``address`` in its current one-minute window."""
    return int(cache.get(_failures_key(address, kind), 0))


def failure_count(address: str | None, *, kind: str = "login") -> None:
    """One more failure of ``kind`` from ``address`` in its window."""
    key = _failures_key(address, kind)
    cache.add(key, 0, timeout=FAILURE_WINDOW_SECONDS)
    try:
        cache.incr(key)
    except ValueError:  # the window ended between add and incr
        cache.set(key, 1, timeout=FAILURE_WINDOW_SECONDS)


def count_failure(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any) -> None:
    """``user_login_failed`` receiver: one more failure for the request's address in its window."""
    if request is None or settings.CACHET_LOGIN_IP_FAILURES_PER_MINUTE <= 0:
        return
    failure_count(client_address(request))


def connect() -> None:
    user_login_failed.connect(count_failure, dispatch_uid="cachet-count-login-failure")


class FailedLoginLimitMiddleware(MiddlewareMixin):
    """Refuses a login POST, before any password check, from an address over its failed-login limit."""

    def process_view(
        self, request: HttpRequest, view: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> HttpResponse | None:
        limit = settings.CACHET_LOGIN_IP_FAILURES_PER_MINUTE
        if limit <= 0 or request.method != "POST" or not _is_login(request):
            return None
        if failures_from(client_address(request)) < limit:
            return None
        response = _refused(request, throttle_message())
        response["Retry-After"] = str(FAILURE_WINDOW_SECONDS)
        return response


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def _is_login(request: HttpRequest) -> bool:
    match = request.resolver_match
    return match is not None and match.view_name in LOGIN_VIEWS


class RefusalDelayMiddleware:
    """Holds a refused login's (or API request's) 429 for ``CACHET_LOGIN_REFUSAL_DELAY`` seconds, asleep on the
    event loop. First in ``MIDDLEWARE`` and async only, so the wait holds no thread and no database connection."""

    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response: HttpResponseBase = await self.get_response(request)
        delay = settings.CACHET_LOGIN_REFUSAL_DELAY
        if delay > 0 and response.status_code == TOO_MANY_REQUESTS and (_is_login(request) or _is_api(request)):
            await asyncio.sleep(delay)
        return response
