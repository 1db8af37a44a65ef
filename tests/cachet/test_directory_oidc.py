"""Sign-in with OpenID Connect against a real provider running on this machine (oidc-provider-mock: discovery,
the code flow with PKCE, RS256-signed ID tokens, userinfo), through Django's whole stack: a person's first
sign-in makes their account, the directory's groups map to Cachet's at every sign-in and staff status follows
one; a refused sign-in, a provider that is away, a code used twice and a token that does not verify each get a
page that says so, never a 500, and nothing signed in."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from django.contrib.auth.models import Group, User
from django.core.cache import cache
from django.test import Client
from oidc_provider_mock import run_server_in_thread

from cachet.directory.oidc_settings import oidc_settings
from sessions_app.models import DirectoryAccount, DirectorySource

pytestmark = pytest.mark.django_db

CAROL = {
    "preferred_username": "carol",
    "email": "carol@example.org",
    "given_name": "Carol",
    "family_name": "Jones",
    "groups": ["engineers", "admins"],
}


@pytest.fixture
def provider() -> Iterator[str]:
    with run_server_in_thread() as server:
        yield f"http://localhost:{server.server_port}"


def turn_on(settings: Any, issuer: str) -> None:
    environ = {"CACHET_OIDC_CLIENT_ID": "cachet", "CACHET_OIDC_CLIENT_SECRET": "cachet-secret"}
    for name, value in oidc_settings({**environ, "CACHET_OIDC_ISSUER": issuer}).items():
        setattr(settings, name, value)
    settings.CACHET_OIDC_CLIENT_ID = "cachet"
    settings.CACHET_OIDC_ISSUER = issuer
    settings.CACHET_OIDC_LABEL = "Example SSO"
    settings.CACHET_OIDC_GROUP_MAP = "engineers=Engineering; admins=Admins"
    settings.CACHET_OIDC_STAFF_GROUPS = "admins"
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, "cachet.directory.oidc.OidcBackend"]
    cache.clear()  # the discovery document of another test's provider


@pytest.fixture
def oidc(settings: Any, provider: str) -> str:
    turn_on(settings, provider)
    return provider


def at_provider(client: Client, provider: str, sub: str, claims: dict[str, Any] | None = None) -> str:
    """Start at Cachet's button, sign in at the provider as ``sub``: the callback path Cachet is sent back to."""
    if claims is not None:
        assert httpx.put(f"{provider}/users/{sub}", json=claims).status_code == 204
    start = client.get("/oidc/login/?next=/usage/")
    assert start.status_code == 302 and start["Location"].startswith(f"{provider}/oauth2/authorize?")
    assert "code_challenge=" in start["Location"] and "nonce=" in start["Location"]
    answer = httpx.post(start["Location"], data={"sub": sub})
    assert answer.status_code == 302, answer.text
    back = urlsplit(answer.headers["location"])
    return f"{back.path}?{back.query}"


def signed_in(client: Client) -> User | None:
    user_id = client.session.get("_auth_user_id")
    return User.objects.filter(pk=user_id).first() if user_id else None


def test_the_login_page_offers_the_provider_only_where_it_is_on(settings: Any, provider: str) -> None:
    assert "oidc-sign-in" not in Client().get("/login/").content.decode()
    assert Client().get("/oidc/login/").status_code == 404
    turn_on(settings, provider)
    page = Client().get("/login/?next=/usage/").content.decode()
    assert "Sign in with Example SSO" in page and 'href="/oidc/login/?next=/usage/"' in page


def test_a_first_sign_in_makes_the_account_with_its_groups_and_staff(oidc: str) -> None:
    Group.objects.create(name="Hand-given")
    client = Client()
    landed = client.get(at_provider(client, oidc, "carol-sub", CAROL))
    assert landed.status_code == 302 and landed["Location"] == "/usage/"
    carol = signed_in(client)
    assert carol is not None and carol.username == "carol"
    assert (carol.email, carol.first_name, carol.last_name, carol.is_staff) == (
        "carol@example.org",
        "Carol",
        "Jones",
        True,
    )
    assert not carol.has_usable_password() and not carol.is_superuser
    assert sorted(carol.groups.values_list("name", flat=True)) == ["Admins", "Engineering"]
    account = DirectoryAccount.objects.get(user=carol)
    assert (account.source, account.subject, account.directory_groups) == (
        DirectorySource.OIDC,
        "carol-sub",
        ["admins", "engineers"],
    )
    assert client.get("/usage/").status_code == 200
    assert 'id="password-link"' not in client.get("/usage/").content.decode(), "no Cachet password to change"
    assert "You sign in with your company account" in client.get("/password/").content.decode()

    carol.groups.add(Group.objects.get(name="Hand-given"))
    again = Client()
    changed = {**CAROL, "groups": ["engineers"], "email": "carol@new.example.org"}
    again.get(at_provider(again, oidc, "carol-sub", changed))
    carol.refresh_from_db()
    assert signed_in(again) == carol, "the same account, found by the provider's subject"
    assert sorted(carol.groups.values_list("name", flat=True)) == ["Engineering", "Hand-given"]
    assert (carol.is_staff, carol.email) == (False, "carol@new.example.org")


def test_a_hand_made_account_of_the_same_name_is_not_taken_over(oidc: str, django_user_model: Any) -> None:
    local = django_user_model.objects.create_superuser(username="carol", password="local-password-1")
    client = Client()
    client.get(at_provider(client, oidc, "someone-else", CAROL))
    person = signed_in(client)
    assert person is not None and person.username == "carol-2" and not person.is_superuser
    local.refresh_from_db()
    assert local.check_password("local-password-1") and not DirectoryAccount.objects.filter(user=local).exists()


def test_a_sign_in_refused_at_the_provider_says_so_on_the_login_page(oidc: str) -> None:
    client = Client()
    start = client.get("/oidc/login/?next=/usage/")
    denied = httpx.post(start["Location"], data={"action": "deny"})
    back = urlsplit(denied.headers["location"])
    answer = client.get(f"{back.path}?{back.query}", follow=True)
    assert answer.redirect_chain[-1][0] == "/login/?next=%2Fusage%2F", "where the person was going is kept"
    assert "Signing in with Example SSO was cancelled or refused there." in answer.content.decode()
    assert signed_in(client) is None


def test_a_code_used_twice_is_refused_with_a_page(oidc: str) -> None:
    client = Client()
    callback = at_provider(client, oidc, "carol-sub", CAROL)
    assert client.get(callback).status_code == 302
    other = Client()
    other.get("/oidc/login/")  # a session with a state of its own, not this code's
    replayed = other.get(callback)
    assert replayed.status_code == 400
    assert "That sign-in could not be checked" in replayed.content.decode()
    assert signed_in(other) is None


def test_a_token_signed_by_another_key_is_refused(settings: Any, oidc: str) -> None:
    """The ID token verified against another provider's keys: its signature does not match."""
    with run_server_in_thread() as impostor:
        keys = f"http://localhost:{impostor.server_port}/jwks"
        discovered = httpx.get(f"{oidc}/.well-known/openid-configuration").json()
        assert discovered["jwks_uri"] != keys
        client = Client()
        callback = at_provider(client, oidc, "carol-sub", CAROL)
        cache.set(f"cachet:oidc-discovery:{oidc}", {**cached_endpoints(oidc), "OIDC_OP_JWKS_ENDPOINT": keys}, 60)
        answer = client.get(callback)
    assert answer.status_code == 400
    assert "did not verify" in answer.content.decode()
    assert signed_in(client) is None and not User.objects.filter(username="carol").exists()


def cached_endpoints(issuer: str) -> dict[str, str]:
    found = cache.get(f"cachet:oidc-discovery:{issuer}")
    assert isinstance(found, dict)
    return found


def test_a_provider_that_is_away_gets_a_page_at_the_button_and_at_the_callback(settings: Any) -> None:
    with run_server_in_thread() as server:
        provider = f"http://localhost:{server.server_port}"
        turn_on(settings, provider)
        client = Client()
        callback = at_provider(client, provider, "carol-sub", CAROL)
    away = client.get(callback)  # the token endpoint is gone with its server
    assert away.status_code == 503
    assert "The sign-in provider did not answer" in away.content.decode()
    cache.clear()
    button = Client().get("/oidc/login/")
    assert button.status_code == 503 and "could not reach Example SSO" in button.content.decode()
    assert signed_in(client) is None
    password = Client()
    User.objects.create_user(username="dave", password="dave-password-1")
    assert password.post("/login/", {"username": "dave", "password": "dave-password-1"}).status_code == 302


def test_staff_see_directory_accounts_in_the_admin(oidc: str, django_user_model: Any) -> None:
    client = Client()
    client.get(at_provider(client, oidc, "carol-sub", CAROL))
    django_user_model.objects.create_superuser(username="root", password="root-password-1")
    staff = Client()
    staff.force_login(django_user_model.objects.get(username="root"))
    listed = staff.get("/admin/sessions_app/directoryaccount/").content.decode()
    assert "carol-sub" in listed and "OpenID Connect" in listed and "engineers" in listed
