"""django-auth-ldap's settings from Cachet's environment (read only where ``CACHET_LDAP_URI`` is set)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ldap
from django_auth_ldap.config import (
    GroupOfNamesType,
    GroupOfUniqueNamesType,
    LDAPGroupType,
    LDAPSearch,
    NestedActiveDirectoryGroupType,
    PosixGroupType,
)

GROUP_TYPES: dict[str, tuple[type[LDAPGroupType], str]] = {
    "groupOfNames": (GroupOfNamesType, "(objectClass=groupOfNames)"),
    "groupOfUniqueNames": (GroupOfUniqueNamesType, "(objectClass=groupOfUniqueNames)"),
    "posixGroup": (PosixGroupType, "(objectClass=posixGroup)"),
    "activeDirectory": (NestedActiveDirectoryGroupType, "(objectClass=group)"),
}
SECONDS = 10


def ldap_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """The ``AUTH_LDAP_*`` settings ``environ``'s ``CACHET_LDAP_*`` variables state; a ``ValueError`` says what
    is missing or wrong."""
    found: dict[str, Any] = {
        "AUTH_LDAP_SERVER_URI": environ["CACHET_LDAP_URI"],
        "AUTH_LDAP_BIND_DN": environ.get("CACHET_LDAP_BIND_DN", ""),
        "AUTH_LDAP_BIND_PASSWORD": environ.get("CACHET_LDAP_BIND_PASSWORD", ""),
        "AUTH_LDAP_START_TLS": environ.get("CACHET_LDAP_START_TLS", "").lower() in ("1", "true", "yes", "on"),
        "AUTH_LDAP_CONNECTION_OPTIONS": {ldap.OPT_NETWORK_TIMEOUT: SECONDS, ldap.OPT_TIMEOUT: SECONDS},
        "AUTH_LDAP_ALWAYS_UPDATE_USER": False,  # Cachet's backend brings the account up to date itself
    }
    template = environ.get("CACHET_LDAP_USER_DN_TEMPLATE", "")
    base = environ.get("CACHET_LDAP_USER_BASE", "")
    if template:
        found["AUTH_LDAP_USER_DN_TEMPLATE"] = template
    elif base:
        user_filter = environ.get("CACHET_LDAP_USER_FILTER", "(uid=%(user)s)")
        found["AUTH_LDAP_USER_SEARCH"] = LDAPSearch(base, ldap.SCOPE_SUBTREE, user_filter)
    else:
        raise ValueError("CACHET_LDAP_URI needs CACHET_LDAP_USER_BASE (or CACHET_LDAP_USER_DN_TEMPLATE)")
    group_base = environ.get("CACHET_LDAP_GROUP_BASE", "")
    if group_base:
        kind = environ.get("CACHET_LDAP_GROUP_TYPE", "groupOfNames")
        if kind not in GROUP_TYPES:
            raise ValueError(f"CACHET_LDAP_GROUP_TYPE is one of {', '.join(GROUP_TYPES)}, not {kind!r}")
        group_type, default_filter = GROUP_TYPES[kind]
        group_filter = environ.get("CACHET_LDAP_GROUP_FILTER", default_filter)
        found["AUTH_LDAP_GROUP_SEARCH"] = LDAPSearch(group_base, ldap.SCOPE_SUBTREE, group_filter)
        found["AUTH_LDAP_GROUP_TYPE"] = group_type()
    return found
