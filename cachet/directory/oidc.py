"""Sign-in with an OpenID Connect provider (Keycloak, Authentik, Entra ID, Google…) through mozilla-django-oidc,
its endpoints read from the issuer's discovery document when first needed. The person's Cachet account and
groups come from ``sessions_app.services.accounts`` as for LDAP. A provider that is away, an answer that does not
verify and a refused sign-in each get a page that says so."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from cachet.directory.oidc_settings import TIMEOUT_SECONDS
from sessions_app.models import DirectorySource
from sessions_app.services.accounts import DirectoryPerson, directory_sign_in, group_rules_parse

logger = logging.getLogger(__name__)

DISCOVERY_SECONDS = 3600
ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}


class ProviderAway(Exception):
    """The provider did not answer, or answered what is not its discovery document."""


@dataclass(frozen=True)
class SignInFailure:
    status: int
    title: str
    text: str


def provider_label() -> str:
    return str(settings.CACHET_OIDC_LABEL)


def discovered() -> dict[str, str]:
    """The provider's endpoints from ``CACHET_OIDC_ISSUER``'s discovery document (kept an hour)."""
    key = f"cachet:oidc-discovery:{settings.CACHET_OIDC_ISSUER}"
    kept = cache.get(key)
    if isinstance(kept, dict):
        return kept
    url = f"{settings.CACHET_OIDC_ISSUER}/.well-known/openid-configuration"
    try:
        answer = requests.get(url, timeout=TIMEOUT_SECONDS)
        answer.raise_for_status()
        document = answer.json()
        found = {name: str(document[field]) for name, field in ENDPOINTS.items()}
    except (requests.RequestException, ValueError, KeyError, TypeError) as error:
        raise ProviderAway(f"its discovery document at {url} could not be read ({error.__class__.__name__})") from error
    cache.set(key, found, DISCOVERY_SECONDS)
    return found


def oidc_setting(attr: str, *args: Any) -> Any:
    """mozilla-django-oidc's settings, the provider's endpoints discovered."""
    if attr in ENDPOINTS:
        return discovered()[attr]
    return getattr(settings, attr, *args)


class OidcBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    """The OIDC code flow's backend: a person is known by the provider's ``sub``, never by an email or a name that
    a hand-made account may share."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.OIDC_RP_CLIENT_ID = oidc_setting("OIDC_RP_CLIENT_ID")
        self.OIDC_RP_CLIENT_SECRET = oidc_setting("OIDC_RP_CLIENT_SECRET")
        self.OIDC_RP_SIGN_ALGO = oidc_setting("OIDC_RP_SIGN_ALGO")
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.UserModel = get_user_model()

    @property
    def OIDC_OP_TOKEN_ENDPOINT(self) -> str:
        return str(oidc_setting("OIDC_OP_TOKEN_ENDPOINT"))

    @property
    def OIDC_OP_USER_ENDPOINT(self) -> str:
        return str(oidc_setting("OIDC_OP_USER_ENDPOINT"))

    @property
    def OIDC_OP_JWKS_ENDPOINT(self) -> str:
        return str(oidc_setting("OIDC_OP_JWKS_ENDPOINT"))

    def retrieve_matching_jwk(self, token: str) -> Any:
        """The provider's one signing key the token names (by ``kid`` where both say one; a provider with one key
        may name none, as OIDC allows)."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as error:
            raise SuspiciousOperation(f"the ID token is not a JWT ({error})") from error
        answer = requests.get(self.OIDC_OP_JWKS_ENDPOINT, timeout=TIMEOUT_SECONDS)
        answer.raise_for_status()
        kid, algorithm = header.get("kid"), header.get("alg")
        matching = [
            key
            for key in answer.json().get("keys", [])
            if (kid is None or key.get("kid") in (None, kid))
            and key.get("alg", algorithm) == algorithm
            and key.get("use", "sig") == "sig"
        ]
        if len(matching) != 1:
            raise SuspiciousOperation(f"{len(matching)} of the provider's keys match the ID token's")
        return jwt.PyJWK(matching[0], algorithm=algorithm)

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        if request is None or "code" not in request.GET:
            return None  # a password login, or no request: not OIDC's
        return super().authenticate(request, **kwargs)

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        claims = {**payload, **self.get_userinfo(access_token, id_token, payload)}
        subject = payload.get("sub")
        if not isinstance(subject, str) or not subject or claims.get("sub") != subject:
            raise SuspiciousOperation("the provider's answer names no subject, or two")
        groups = claims.get(settings.CACHET_OIDC_GROUPS_CLAIM) or []
        if isinstance(groups, str):
            groups = [groups]
        username = claims.get("preferred_username") or str(claims.get("email") or "").partition("@")[0] or subject
        person = DirectoryPerson(
            source=DirectorySource.OIDC,
            subject=subject,
            username=str(username),
            email=str(claims.get("email") or ""),
            first_name=str(claims.get("given_name") or ""),
            last_name=str(claims.get("family_name") or ""),
            groups=tuple(sorted(str(group) for group in groups if isinstance(group, str | int))),
        )
        rules = group_rules_parse(settings.CACHET_OIDC_GROUP_MAP, settings.CACHET_OIDC_STAFF_GROUPS)
        return directory_sign_in(person=person, rules=rules)


def _failed(request: HttpRequest, failure: SignInFailure) -> HttpResponse:
    context = {"failure": failure, "label": provider_label()}
    return render(request, "registration/sign_in_failed.html", context, status=failure.status)


def _away(error: Exception) -> SignInFailure:
    logger.warning("OIDC sign-in: %s did not answer: %s", provider_label(), error)
    return SignInFailure(
        503,
        "The sign-in provider did not answer",
        f"Cachet could not reach {provider_label()}. Try again in a moment, or log in with a Cachet password if you "
        "have one.",
    )


class OidcLogin(OIDCAuthenticationRequestView):  # type: ignore[misc]
    """``/oidc/login/``: off to the provider, with a page that says so where it is away."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)
        self.OIDC_RP_CLIENT_ID = getattr(settings, "OIDC_RP_CLIENT_ID", "")

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.CACHET_OIDC_CLIENT_ID:
            raise Http404("Sign-in with OIDC is off.")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = oidc_setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except ProviderAway as error:
            return _failed(request, _away(error))
        answer: HttpResponse = super().get(request)
        return answer


class OidcCallback(OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """``/oidc/callback/``: the provider's answer checked; a failed sign-in back on the login page with why."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.CACHET_OIDC_CLIENT_ID:
            raise Http404("Sign-in with OIDC is off.")
        try:
            answer: HttpResponse = super().get(request)
        except requests.HTTPError as error:
            logger.warning("OIDC sign-in: the provider refused the code: %s", error)
            failure = SignInFailure(
                400,
                "The sign-in provider refused that sign-in",
                f"{provider_label()} did not accept the answer it was sent back (a code used twice, or one too old). "
                "Nothing was signed in; start again from the login page.",
            )
            return _failed(request, failure)
        except (ProviderAway, requests.RequestException) as error:
            return _failed(request, _away(error))
        except (SuspiciousOperation, jwt.PyJWTError) as error:
            logger.warning("OIDC sign-in refused: %s", error)
            failure = SignInFailure(
                400,
                "That sign-in could not be checked",
                f"The answer from {provider_label()} did not verify (a token whose signature, nonce or state is "
                "not the one Cachet expects, or a link used twice). Nothing was signed in; start again from the "
                "login page.",
            )
            return _failed(request, failure)
        return answer

    def login_failure(self) -> HttpResponse:
        error = self.request.GET.get("error", "")
        if error == "access_denied":
            text = f"Signing in with {provider_label()} was cancelled or refused there."
        else:
            text = f"Signing in with {provider_label()} did not work" + (f" ({error[:100]})." if error else ".")
        messages.error(self.request, text)
        failure = str(oidc_setting("LOGIN_REDIRECT_URL_FAILURE"))
        going = self.request.session.get("oidc_login_next")
        if isinstance(going, str) and url_has_allowed_host_and_scheme(going, allowed_hosts={self.request.get_host()}):
            failure += "?" + urlencode({"next": going})
        return HttpResponseRedirect(failure)
