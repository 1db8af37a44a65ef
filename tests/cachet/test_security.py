"""Every response carries the one content security policy, and errors are Cachet's own pages."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client, override_settings

from sessions_app.models import ChatSession

pytestmark = pytest.mark.django_db

POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
ERRORS = "tests.cachet.error_urls"
STYLESHEET = '<link rel="stylesheet" href="/static/cachet/cachet.css">'


@pytest.fixture
def ada(user: Any) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.fixture
def staff(django_user_model: Any) -> Client:
    root = django_user_model.objects.create_superuser(username="root", password="root-password-1")
    client = Client()
    client.force_login(root)
    return client


def test_the_login_page(client: Client) -> None:
    response = client.get("/login/")
    assert response.status_code == 200
    assert response["Content-Security-Policy"] == POLICY


def test_a_redirect_to_the_login_page(client: Client) -> None:
    response = client.get("/sessions/new")
    assert response.status_code == 302
    assert response["Content-Security-Policy"] == POLICY


def test_the_session_page_and_the_chart(ada: Client, chat_session: ChatSession) -> None:
    for path in (f"/sessions/{chat_session.pk}/", f"/sessions/{chat_session.pk}/chart", "/", "/sessions/new"):
        response = ada.get(path)
        assert response.status_code == 200, path
        assert response["Content-Security-Policy"] == POLICY, path


def test_the_admin(staff: Client, chat_session: ChatSession) -> None:
    paths = [
        "/admin/",
        "/admin/sessions_app/chatsession/",
        f"/admin/sessions_app/chatsession/{chat_session.pk}/change/",
        "/admin/login/",
    ]
    for path in paths:
        response = staff.get(path)
        assert response.status_code in (200, 302), path
        assert response["Content-Security-Policy"] == POLICY, path


def test_a_static_file(client: Client) -> None:
    response = client.get("/static/cachet/cachet.css")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/css")
    assert response["Content-Security-Policy"] == POLICY


def test_the_404_page_is_cachets_with_a_link_home(ada: Client) -> None:
    response = ada.get("/no/such/page/")
    assert response.status_code == 404
    assert response["Content-Security-Policy"] == POLICY
    html = response.content.decode()
    assert STYLESHEET in html
    assert '<a class="button primary" href="/">Back to your sessions</a>' in html
    assert "<code>/no/such/page/</code>" in html


def test_the_404_page_reads_nothing_from_the_database(ada: Client, django_assert_num_queries: Any) -> None:
    """Django renders an error page in a worker thread of its own under ASGI, where a database connection
    would stay open: the page shows no user, so it needs no session either."""
    with django_assert_num_queries(0):
        assert ada.get("/no/such/page/").status_code == 404


@pytest.mark.parametrize("path", ["/sessions/99999999999999999999/", "/sessions/9223372036854775808/chart"])
def test_ids_past_bigint_are_404(ada: Client, path: str) -> None:
    response = ada.get(path)
    assert response.status_code == 404
    assert STYLESHEET in response.content.decode()


def test_another_persons_session_is_the_same_404(other_user: Any, chat_session: ChatSession) -> None:
    bob = Client()
    bob.force_login(other_user)
    response = bob.get(f"/sessions/{chat_session.pk}/")
    assert response.status_code == 404
    assert response["Content-Security-Policy"] == POLICY
    assert "Back to your sessions" in response.content.decode()


@override_settings(ROOT_URLCONF=ERRORS)
def test_the_500_page_is_cachets_with_a_link_home(ada: Client) -> None:
    response = ada.get("/test-only/broken/")
    assert response.status_code == 500
    assert response["Content-Security-Policy"] == POLICY
    html = response.content.decode()
    assert STYLESHEET in html
    assert '<a class="button primary" href="/">Back to your sessions</a>' in html
    assert "nothing was lost" in html


@override_settings(ROOT_URLCONF=ERRORS)
def test_the_403_page(ada: Client) -> None:
    response = ada.get("/test-only/forbidden/")
    assert response.status_code == 403
    assert response["Content-Security-Policy"] == POLICY
    assert STYLESHEET in response.content.decode()
    assert "Not allowed" in response.content.decode()


def test_the_csrf_failure_page() -> None:
    client = Client(enforce_csrf_checks=True)
    response = client.post("/login/", {"username": "ada", "password": "whatever"})
    assert response.status_code == 403
    assert response["Content-Security-Policy"] == POLICY
    html = response.content.decode()
    assert STYLESHEET in html and "Form not sent" in html and 'href="/"' in html


def test_the_400_page(client: Client) -> None:
    response = client.get("/login/", headers={"host": "evil.example"})
    assert response.status_code == 400
    assert response["Content-Security-Policy"] == POLICY
    html = response.content.decode()
    assert STYLESHEET in html and "Bad request" in html and 'href="/"' in html


@override_settings(SECURE_SSL_REDIRECT=True)
def test_the_https_redirect(client: Client) -> None:
    response = client.get("/login/")
    assert response.status_code == 301
    assert response["Location"] == "https://testserver/login/"
    assert response["Content-Security-Policy"] == POLICY


def test_the_favicon_for_pages_that_do_not_name_one(client: Client) -> None:
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"] == "/static/cachet/favicon.svg"
    assert response["Content-Security-Policy"] == POLICY
