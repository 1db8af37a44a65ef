"""Sign-in with LDAP or Active Directory (django-auth-ldap): the password is checked by the directory; the
person's Cachet account and groups come from ``sessions_app.services.accounts`` as for OIDC."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest
from django_auth_ldap.backend import LDAPBackend, ldap_error

from cachet.directory.forms import AWAY_MARK
from sessions_app.models import DirectorySource
from sessions_app.services.accounts import DirectoryPerson, directory_sign_in, group_rules_parse


def _first(attrs: Any, name: str) -> str:
    values = attrs.get(name) or [""]
    return str(values[0])


class LdapBackend(LDAPBackend):  # type: ignore[misc]
    """django-auth-ldap's backend, with the account a directory's person gets (never a hand-made one of the same
    name) and the groups their directory groups map to, at every sign-in."""

    def get_or_build_user(self, username: str, ldap_user: Any) -> tuple[User, bool]:
        groups: tuple[str, ...] = ()
        if getattr(settings, "AUTH_LDAP_GROUP_SEARCH", None) is not None:
            groups = tuple(sorted(ldap_user.group_names))
        attrs = ldap_user.attrs or {}
        person = DirectoryPerson(
            source=DirectorySource.LDAP,
            subject=ldap_user.dn,
            username=username,
            email=_first(attrs, "mail"),
            first_name=_first(attrs, "givenName"),
            last_name=_first(attrs, "sn"),
            groups=groups,
        )
        rules = group_rules_parse(settings.CACHET_LDAP_GROUP_MAP, settings.CACHET_LDAP_STAFF_GROUPS)
        return directory_sign_in(person=person, rules=rules), False


def mark_away(
    sender: Any, context: str, user: Any, request: HttpRequest | None, exception: Exception, **kw: Any
) -> None:
    """``ldap_error`` receiver: the login that asked the directory is told it was away, not that its password was
    wrong."""
    if request is not None:
        setattr(request, AWAY_MARK, True)


def connect() -> None:
    ldap_error.connect(mark_away, dispatch_uid="cachet-ldap-away")
