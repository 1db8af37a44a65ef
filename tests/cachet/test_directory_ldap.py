"""Sign-in with LDAP against a real OpenLDAP ``slapd`` that the test starts, through the login page: the directory
checks the password, a person's first sign-in makes their account, the directory's groups map to Cachet's at
every sign-in and staff status follows one; a wrong password, an unknown person and a directory that is away each
get the login page saying so, and local accounts keep working beside it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.cache import cache
from django.test import Client

from cachet.directory import ldap as cachet_ldap
from cachet.directory.forms import AWAY
from cachet.directory.ldap_settings import ldap_settings
from sessions_app.models import DirectoryAccount, DirectorySource
from tests.ldap_kit import GROUPS, PEOPLE, Directory, running_slapd

pytestmark = pytest.mark.django_db

WRONG = "Your username and password didn't match."


@pytest.fixture
def directory() -> Iterator[Directory]:
    with running_slapd() as running:
        erin = running.add_person("erin", "erin-ldap-1", mail="erin@example.org", given="Erin", surname="Park")
        frank = running.add_person("frank", "frank-ldap-1")
        running.add_group("engineers", erin, frank)
        running.add_group("it-admins", erin, "cn=nobody,dc=example,dc=org")  # a groupOfNames is never empty
        yield running


def turn_on(settings: Any, uri: str) -> None:
    environ = {
        "CACHET_LDAP_URI": uri,
        "CACHET_LDAP_USER_BASE": PEOPLE,
        "CACHET_LDAP_GROUP_BASE": GROUPS,
        "CACHET_LDAP_BIND_DN": "cn=admin,dc=example,dc=org",
        "CACHET_LDAP_BIND_PASSWORD": "admin-secret",
    }
    for name, value in ldap_settings(environ).items():
        setattr(settings, name, value)
    settings.CACHET_LDAP_URI = uri
    settings.CACHET_LDAP_GROUP_MAP = "engineers=Engineering;it-admins=IT"
    settings.CACHET_LDAP_STAFF_GROUPS = "it-admins"
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, "cachet.directory.ldap.LdapBackend"]
    settings.CACHET_LOGIN_REFUSAL_DELAY = 0
    cachet_ldap.connect()
    cache.clear()


@pytest.fixture
def ldap_on(settings: Any, directory: Directory) -> Directory:
    turn_on(settings, directory.uri)
    return directory


def log_in(username: str, password: str) -> tuple[Client, str, int]:
    client = Client()
    answer = client.post("/login/", {"username": username, "password": password, "next": "/usage/"})
    return client, answer.content.decode(), answer.status_code


def signed_in(client: Client) -> User | None:
    user_id = client.session.get("_auth_user_id")
    return User.objects.filter(pk=user_id).first() if user_id else None


def test_a_first_sign_in_makes_the_account_with_its_groups_and_staff(ldap_on: Directory) -> None:
    client, _, status = log_in("erin", "erin-ldap-1")
    assert status == 302
    erin = signed_in(client)
    assert erin is not None and erin.username == "erin"
    assert (erin.email, erin.first_name, erin.last_name, erin.is_staff) == ("erin@example.org", "Erin", "Park", True)
    assert not erin.has_usable_password()
    assert sorted(erin.groups.values_list("name", flat=True)) == ["Engineering", "IT"]
    account = DirectoryAccount.objects.get(user=erin)
    assert (account.source, account.subject) == (DirectorySource.LDAP, "uid=erin,ou=people,dc=example,dc=org")
    assert account.directory_groups == ["engineers", "it-admins"]

    erin.groups.add(Group.objects.create(name="Hand-given"))
    ldap_on.remove_member("it-admins", "uid=erin,ou=people,dc=example,dc=org")
    again, _, _ = log_in("erin", "erin-ldap-1")
    erin.refresh_from_db()
    assert signed_in(again) == erin
    assert sorted(erin.groups.values_list("name", flat=True)) == ["Engineering", "Hand-given"]
    assert erin.is_staff is False


def test_a_wrong_password_or_an_unknown_person_is_the_usual_refusal(ldap_on: Directory) -> None:
    for username, password in (("erin", "not-her-password"), ("nobody", "whatever-1")):
        client, page, status = log_in(username, password)
        assert status == 200 and WRONG in page, username
        assert signed_in(client) is None
    assert not User.objects.filter(username__in=["erin", "nobody"]).exists()


def test_a_hand_made_account_of_the_same_name_is_not_taken_over(ldap_on: Directory, django_user_model: Any) -> None:
    local = django_user_model.objects.create_superuser(username="frank", password="local-frank-1")
    client, _, _ = log_in("frank", "frank-ldap-1")
    person = signed_in(client)
    assert person is not None and person.username == "frank-2" and not person.is_superuser
    local_client, _, _ = log_in("frank", "local-frank-1")
    assert signed_in(local_client) == local, "the local password still logs in the local account"


def test_a_directory_that_is_away_is_said_so_and_local_accounts_still_log_in(
    settings: Any, directory: Directory, django_user_model: Any
) -> None:
    turn_on(settings, directory.uri)
    directory.stop()
    client, page, status = log_in("erin", "erin-ldap-1")
    assert status == 200 and AWAY.replace("'", "&#x27;") in page
    assert signed_in(client) is None
    django_user_model.objects.create_user(username="gina", password="gina-password-1")
    local, _, status = log_in("gina", "gina-password-1")
    assert status == 302 and signed_in(local) is not None
