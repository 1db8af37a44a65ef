"""Personal access tokens of the API: made (the secret returned once, only its digest kept), revoked, used."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from sessions_app.models import ApiToken, ApiTokenAccess
from sessions_app.text import storable

TOKEN_PREFIX = "cachet_"
SHOWN_CHARACTERS = 12  # of the secret, kept to tell tokens apart: the prefix and 5 of its 43 random characters
NAME_CHARACTERS = 100
USED_EVERY = timedelta(minutes=1)  # ``last_used_at`` is written at most this often


def token_digest(secret: str) -> str:
    """What is stored of a token: its SHA-256, in hex (a token is 256 random bits: no salt or slow hash needed)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class MadeToken:
    """A token just made, and its secret: the only time the secret is known."""

    token: ApiToken
    secret: str


@transaction.atomic
def api_token_create(*, owner: User, name: str, access: str = ApiTokenAccess.READ) -> MadeToken:
    """A new token of ``owner``'s: read-only or read-write (``access``); a ``ValueError`` says what is wrong."""
    name = storable(name).strip()
    if not name:
        raise ValueError("Give the token a name, to know later what uses it.")
    if len(name) > NAME_CHARACTERS:
        raise ValueError(f"A token's name is at most {NAME_CHARACTERS} characters.")
    if access not in ApiTokenAccess.values:
        raise ValueError("A token is read-only or read-write.")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        owner=owner, name=name, access=access, digest=token_digest(secret), shown=secret[:SHOWN_CHARACTERS]
    )
    return MadeToken(token, secret)


@transaction.atomic
def api_token_revoke(*, token: ApiToken) -> ApiToken:
    """Make ``token`` unusable from now on (kept, marked revoked); revoking it again changes nothing."""
    locked = ApiToken.objects.select_for_update(no_key=True).get(pk=token.pk)
    if locked.revoked_at is None:
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
    return locked


def api_token_used(*, token: ApiToken) -> None:
    """Note that ``token`` was used now, where it was not noted within the last minute. One statement."""
    now = timezone.now()
    if token.last_used_at is not None and now - token.last_used_at < USED_EVERY:
        return
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    token.last_used_at = now
