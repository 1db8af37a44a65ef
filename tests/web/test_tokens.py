"""API tokens in the browser: a person makes one and sees its secret once, only its digest and first characters are
kept, the secret works against the API until they revoke it, and nobody sees, or revokes, another person's."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from sessions_app.models import ApiToken
from sessions_app.services.tokens import api_token_create

pytestmark = pytest.mark.django_db

SECRET = re.compile(r'<code id="token-secret">(cachet_[A-Za-z0-9_-]+)</code>')


@pytest.fixture(autouse=True)
def _no_failures_carried() -> None:
    cache.clear()  # a wrong token counts against the address, as a failed login does


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _make(client: Client, name: str, access: str = "read") -> tuple[Any, str]:
    response = client.post("/tokens/", {"name": name, "access": access})
    assert response.status_code == 200
    found = SECRET.search(response.content.decode())
    assert found is not None, "the page shows the secret"
    return response, found[1]


def _api(secret: str, method: str = "GET", path: str = "/api/v1/me", **data: Any) -> Any:
    client = Client()
    headers = {"Authorization": f"Bearer {secret}"}
    if method == "PATCH":
        return client.patch(path, data, content_type="application/json", headers=headers)
    return client.get(path, headers=headers)


def test_the_list_shows_a_persons_own_tokens_and_never_anothers(user: Any, other_user: Any) -> None:
    mine = api_token_create(owner=user, name="my-editor", access="write").token
    api_token_create(owner=other_user, name="bobs-script", access="read")

    page = _client(user).get("/tokens/")

    assert page.status_code == 200
    text = page.content.decode()
    assert "my-editor" in text and "read-write" in text and f"{mine.shown}…" in text
    assert "never" in text, "a token not used yet says so"
    assert "bobs-script" not in text
    assert 'id="tokens-link"' in text, "the header leads here"
    assert re.search(r'value="read"[^>]*\bchecked', text), "a new token is read-only unless asked"


def test_a_token_made_shows_its_secret_once_and_only_its_digest_is_kept(user: Any) -> None:
    client = _client(user)

    response, secret = _make(client, "CI")

    text = response.content.decode()
    assert "Copy it now: it is not shown again." in text
    assert f'curl -H "Authorization: Bearer {secret}" http://testserver/api/v1/me' in text
    assert "no-store" in response.headers["Cache-Control"]
    token = ApiToken.objects.get(owner=user)
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert token.shown == secret[:12]
    stored = [str(value) for value in ApiToken.objects.filter(pk=token.pk).values().get().values()]
    assert not [value for value in stored if secret in value], "the secret itself is stored nowhere in the row"

    later = client.get("/tokens/").content.decode()
    assert secret not in later and 'id="token-secret"' not in later
    assert f"{token.shown}…" in later


def test_the_secret_works_against_the_api_and_a_read_only_one_changes_nothing(user: Any) -> None:
    client = _client(user)
    _, reader = _make(client, "reader", "read")
    _, writer = _make(client, "writer", "write")

    me = _api(reader)
    assert me.status_code == 200
    assert me.json()["username"] == "ada" and me.json()["token"] == {"name": "reader", "access": "read"}
    assert _api(writer).json()["token"]["access"] == "write"
    refused = _api(reader, "PATCH", "/api/v1/sessions/1", title="renamed")
    assert refused.status_code == 403
    assert "read-only" in refused.json()["detail"]
    assert ApiToken.objects.get(name="reader").last_used_at is not None


def test_revoking_a_token_makes_the_api_refuse_it(user: Any) -> None:
    client = _client(user)
    _, secret = _make(client, "soon gone", "write")
    token = ApiToken.objects.get(owner=user)

    response = client.post(f"/tokens/{token.pk}/revoke")

    assert response.status_code == 302 and response.headers["Location"] == "/tokens/"
    assert _api(secret).status_code == 401
    token.refresh_from_db()
    assert token.revoked_at is not None
    page = client.get("/tokens/").content.decode()
    assert "Revoked" in page and f"/tokens/{token.pk}/revoke" not in page
    assert client.get(f"/tokens/{token.pk}/revoke").status_code == 405


def test_another_persons_token_or_a_missing_one_is_a_404_and_stays_usable(user: Any, other_user: Any) -> None:
    made = api_token_create(owner=other_user, name="bobs-script", access="read")

    client = _client(user)
    assert client.post(f"/tokens/{made.token.pk}/revoke").status_code == 404
    assert client.post("/tokens/2147480000/revoke").status_code == 404

    made.token.refresh_from_db()
    assert made.token.revoked_at is None
    assert _api(made.secret).status_code == 200


def test_a_visitor_logged_out_is_sent_to_log_in(user: Any) -> None:
    token = api_token_create(owner=user, name="mine", access="write").token
    visitor = Client()

    for response in (
        visitor.get("/tokens/"),
        visitor.post("/tokens/", {"name": "sneaky", "access": "write"}),
        visitor.post(f"/tokens/{token.pk}/revoke"),
    ):
        assert response.status_code == 302
        assert response.headers["Location"].startswith("/login/")
    assert list(ApiToken.objects.values_list("name", "revoked_at")) == [("mine", None)]


def test_a_blank_name_is_refused_with_the_reason_and_nothing_is_made(user: Any) -> None:
    client = _client(user)

    response = client.post("/tokens/", {"name": "   ", "access": "write"})

    assert response.status_code == 200
    text = response.content.decode()
    assert "Give the token a name, to know later what uses it." in text
    assert 'id="token-secret"' not in text
    assert not ApiToken.objects.exists()
    invalid = client.post("/tokens/", {"name": "x", "access": "admin"}).content.decode()
    assert "Select a valid choice" in invalid and not ApiToken.objects.exists()


def test_the_post_to_make_a_token_needs_the_csrf_token(user: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    assert client.post("/tokens/", {"name": "forged", "access": "write"}).status_code == 403
    assert not ApiToken.objects.exists()
