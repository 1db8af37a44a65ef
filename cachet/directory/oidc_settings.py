"""mozilla-django-oidc's settings from Cachet's environment (read only where ``CACHET_OIDC_CLIENT_ID`` is set)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TIMEOUT_SECONDS = 10


def oidc_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """The ``OIDC_*`` settings ``environ``'s ``CACHET_OIDC_*`` variables state (the provider's endpoints are read
    from its issuer's discovery document when first needed); a ``ValueError`` says what is missing."""
    if not environ.get("CACHET_OIDC_ISSUER"):
        raise ValueError("CACHET_OIDC_CLIENT_ID needs CACHET_OIDC_ISSUER, the provider's issuer URL")
    return {
        "OIDC_RP_CLIENT_ID": environ["CACHET_OIDC_CLIENT_ID"],
        "OIDC_RP_CLIENT_SECRET": environ.get("CACHET_OIDC_CLIENT_SECRET", ""),
        "OIDC_RP_SIGN_ALGO": environ.get("CACHET_OIDC_SIGN_ALGO", "RS256"),
        "OIDC_RP_SCOPES": environ.get("CACHET_OIDC_SCOPES", "openid email profile"),
        "OIDC_USE_PKCE": True,
        "OIDC_TIMEOUT": TIMEOUT_SECONDS,
        "OIDC_AUTHENTICATION_CALLBACK_URL": "oidc_callback",
        "LOGIN_REDIRECT_URL_FAILURE": "/login/",
    }
