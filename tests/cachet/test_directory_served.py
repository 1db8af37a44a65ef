"""Sign-in as a team configures it: ``manage.py serve`` started with the ``CACHET_OIDC_*`` and ``CACHET_LDAP_*``
variables the docs list, against a real OIDC provider and a real ``slapd``, both used through the login page of
the served Cachet; an LDAP login and an OIDC sign-in each end logged in, with the mapped groups."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from django.contrib.auth.models import User
from oidc_provider_mock import run_server_in_thread

from tests.ldap_kit import GROUPS, PEOPLE, Directory, running_slapd
from tests.serve_kit import Served, served

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def directory() -> Iterator[Directory]:
    with running_slapd() as running:
        erin = running.add_person("erin", "erin-ldap-1", mail="erin@example.org")
        running.add_group("engineers", erin)
        yield running


@pytest.fixture
def provider() -> Iterator[str]:
    with run_server_in_thread() as server:
        yield f"http://localhost:{server.server_port}"


@pytest.fixture
def cachet(tmp_path_factory: pytest.TempPathFactory, directory: Directory, provider: str) -> Iterator[Served]:
    environment = {
        "CACHET_OIDC_CLIENT_ID": "cachet",
        "CACHET_OIDC_CLIENT_SECRET": "cachet-secret",
        "CACHET_OIDC_ISSUER": provider,
        "CACHET_OIDC_LABEL": "Example SSO",
        "CACHET_OIDC_GROUP_MAP": "engineers=Engineering",
        "CACHET_OIDC_STAFF_GROUPS": "admins",
        "CACHET_LDAP_URI": directory.uri,
        "CACHET_LDAP_USER_BASE": PEOPLE,
        "CACHET_LDAP_GROUP_BASE": GROUPS,
        "CACHET_LDAP_GROUP_MAP": "engineers=Engineering",
    }
    with served(tmp_path_factory.mktemp("directory-served"), "--no-worker", **environment) as running:
        yield running


def csrf(client: httpx.Client) -> str:
    page = client.get("/login/")
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert found is not None, page.text
    return found.group(1)


def test_a_served_cachet_signs_in_with_ldap_and_with_oidc(cachet: Served, provider: str) -> None:
    with httpx.Client(base_url=cachet.url, timeout=60) as ldap_person:
        token = csrf(ldap_person)
        assert "Sign in with Example SSO" in ldap_person.get("/login/").text
        logged = ldap_person.post(
            "/login/",
            data={"username": "erin", "password": "erin-ldap-1", "csrfmiddlewaretoken": token, "next": "/usage/"},
            headers={"Referer": cachet.url + "/login/"},
        )
        assert (logged.status_code, logged.headers.get("location")) == (302, "/usage/"), logged.text[-600:]
        assert ldap_person.get("/usage/").status_code == 200
    erin = User.objects.get(username="erin")
    assert list(erin.groups.values_list("name", flat=True)) == ["Engineering"]

    claims = {"preferred_username": "carol", "email": "carol@example.org", "groups": ["engineers", "admins"]}
    assert httpx.put(f"{provider}/users/carol-sub", json=claims).status_code == 204
    with httpx.Client(base_url=cachet.url, timeout=60) as oidc_person:
        start = oidc_person.get("/oidc/login/")
        assert start.status_code == 302 and start.headers["location"].startswith(provider)
        back = httpx.post(start.headers["location"], data={"sub": "carol-sub"})
        assert back.status_code == 302 and back.headers["location"].startswith(cachet.url + "/oidc/callback/")
        landed = oidc_person.get(back.headers["location"].removeprefix(cachet.url))
        assert landed.status_code == 302, landed.text[-600:]
        assert oidc_person.get("/usage/").status_code == 200
    carol = User.objects.get(username="carol")
    assert carol.is_staff and list(carol.groups.values_list("name", flat=True)) == ["Engineering"]
