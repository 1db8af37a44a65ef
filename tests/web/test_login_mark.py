"""The login mark (``cachet.login_mark``): set beside the session cookie of a login, fitting that session only,
renewed as it ages, taken away at logout; the body limits read it without the database."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.core.cache import cache
from django.test import Client

from cachet.login_mark import login_mark, mark_fits, shows_login

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_refusal_delay(settings: Any) -> Any:
    settings.CACHET_LOGIN_REFUSAL_DELAY = 0
    cache.clear()
    yield
    cache.clear()


def cookies_of(client: Client) -> dict[str, str]:
    return {name: morsel.value for name, morsel in client.cookies.items()}


def test_a_login_gets_the_mark_of_its_new_session_and_keeps_it_until_logout(client: Client, user: Any) -> None:
    mark_name = settings.CACHET_LOGIN_COOKIE_NAME
    assert mark_name not in client.get("/login/").cookies
    logged = client.post("/login/", {"username": "ada", "password": "ada-password-1"})
    assert logged.status_code == 302
    session_key = logged.cookies[settings.SESSION_COOKIE_NAME].value
    morsel = logged.cookies[mark_name]
    assert mark_fits(morsel.value, session_key)
    assert morsel["httponly"] and morsel["samesite"] == "Lax" and morsel["path"] == "/"
    assert morsel["max-age"] == settings.SESSION_COOKIE_AGE
    assert shows_login(cookies_of(client))
    assert mark_name not in client.get("/").cookies, "a fitting mark is not set again"
    logout = client.post("/logout/")
    assert logout.cookies[mark_name].value == "" and logout.cookies[mark_name]["max-age"] == 0
    assert not shows_login(cookies_of(client))


def test_a_mark_is_given_to_a_login_without_one_and_renewed_past_half_its_age(
    client: Client, user: Any, settings: Any
) -> None:
    client.force_login(user)
    session_key = client.cookies[settings.SESSION_COOKIE_NAME].value
    given = client.get("/").cookies[settings.CACHET_LOGIN_COOKIE_NAME].value
    assert mark_fits(given, session_key)
    assert settings.CACHET_LOGIN_COOKIE_NAME not in client.get("/").cookies
    settings.SESSION_COOKIE_AGE = 0  # every mark is now past half its age
    assert settings.CACHET_LOGIN_COOKIE_NAME in client.get("/").cookies


def test_an_anonymous_request_gets_no_mark_and_a_mark_of_another_session_is_taken_away(
    client: Client, user: Any
) -> None:
    client.cookies[settings.CACHET_LOGIN_COOKIE_NAME] = login_mark("someone-elses-session")
    response = client.get("/login/")
    assert response.cookies[settings.CACHET_LOGIN_COOKIE_NAME].value == ""
    assert not shows_login(cookies_of(client))
