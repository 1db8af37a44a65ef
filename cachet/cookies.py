"""The names of Cachet's cookies, this instance's own: browsers do not tell cookies apart by port, so two Cachets on
one host under Django's names (``sessionid``, ``csrftoken``) would overwrite each other's logins. Under
``CACHET_TLS`` they are ``__Host-`` cookies (Secure, ``Path=/``, no ``Domain``), which browsers keep to the one
host over https. Read by the settings, so nothing here asks Django for anything."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

LABEL = b"cachet.cookies.names"
HOST_PREFIX = "__Host-"


@dataclass(frozen=True)
class CookieNames:
    """The session's, the CSRF token's and the login mark's cookies (:mod:`cachet.login_mark`)."""

    session: str
    csrf: str
    login: str


def instance_name(secret: str) -> str:
    """``cachet-`` and 8 hex digits of an HMAC of ``secret`` (the same in every process that shares it)."""
    return "cachet-" + hmac.new(secret.encode(), LABEL, hashlib.sha256).hexdigest()[:8]


def cookie_names(secret: str, *, tls: bool) -> CookieNames:
    """The cookie names of the instance whose ``SECRET_KEY`` is ``secret``; ``__Host-`` ones under TLS."""
    base = (HOST_PREFIX if tls else "") + instance_name(secret)
    return CookieNames(session=f"{base}-session", csrf=f"{base}-csrf", login=f"{base}-login")
