"""Personal access tokens: a person's own, and the token a request presents."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from sessions_app.models import ApiToken
from sessions_app.services.tokens import TOKEN_PREFIX, token_digest

SECRET_CHARACTERS = 200  # longer than any token made: longer ones are not looked up


def api_tokens_of(*, owner: AbstractBaseUser | AnonymousUser) -> QuerySet[ApiToken]:
    """``owner``'s tokens, revoked ones too, newest first."""
    return ApiToken.objects.filter(owner_id=owner.pk).order_by("-created_at", "-pk")


def api_token_get(*, owner: AbstractBaseUser | AnonymousUser, token_id: int) -> ApiToken | None:
    return api_tokens_of(owner=owner).filter(pk=token_id).first()


def api_token_presented(*, secret: str) -> ApiToken | None:
    """The usable token whose secret is ``secret`` (not revoked, its owner active), with its owner."""
    if not secret.startswith(TOKEN_PREFIX) or len(secret) > SECRET_CHARACTERS:
        return None
    return (
        ApiToken.objects.select_related("owner")
        .filter(digest=token_digest(secret), revoked_at__isnull=True, owner__is_active=True)
        .first()
    )
