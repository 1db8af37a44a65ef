"""The cookies of a login under ``manage.py serve`` with ``CACHET_TLS``, behind a proxy that says https: named for
the instance, ``__Host-`` (Secure, ``Path=/``, no ``Domain``), so no other service on the host name can set them and
browsers send them over https alone."""

from __future__ import annotations

import re
from collections.abc import Iterator
from http.cookies import SimpleCookie
from typing import Any

import httpx
import pytest

from cachet.cookies import cookie_names
from tests.passwords import give_shipped_password
from tests.serve_kit import SECRET_KEY, Served, served

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "ada-password-1"


@pytest.fixture(scope="module")
def cachet(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data = tmp_path_factory.mktemp("serve-cookies")
    with served(data, CACHET_TLS="1") as running:
        yield running


def set_cookies(response: httpx.Response) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    for line in response.headers.get_list("set-cookie"):
        jar.load(line)
    return jar


def test_a_login_under_tls_sets_host_cookies_of_the_instances_own(cachet: Served, django_user_model: Any) -> None:
    ada = django_user_model.objects.create_user(username="ada", password=None)
    give_shipped_password(ada, PASSWORD)
    names = cookie_names(SECRET_KEY, tls=True)
    origin = cachet.url.replace("http://", "https://")
    proxied = {"X-Forwarded-Proto": "https", "Origin": origin, "Referer": origin + "/login/"}
    with httpx.Client(base_url=cachet.url, timeout=60, headers=proxied) as client:
        page = client.get("/login/")
        assert page.status_code == 200, page.text
        csrf = set_cookies(page)[names.csrf].value
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token is not None
        logged = client.post(
            "/login/",
            data={"username": "ada", "password": PASSWORD, "csrfmiddlewaretoken": token.group(1), "next": "/"},
            headers={"Cookie": f"{names.csrf}={csrf}"},
        )
    assert logged.status_code == 302 and logged.headers["Location"] == "/", logged.text
    jar = set_cookies(logged)
    assert names.session.startswith("__Host-cachet-") and names.session.endswith("-session")
    assert {names.session, names.csrf, names.login} <= set(jar), logged.headers.get_list("set-cookie")
    for name in (names.session, names.csrf, names.login):
        morsel = jar[name]
        assert morsel["secure"] and morsel["path"] == "/" and not morsel["domain"], (name, morsel.OutputString())
    assert jar[names.session]["httponly"] and jar[names.login]["httponly"]
    assert "sessionid" not in jar and "csrftoken" not in jar
