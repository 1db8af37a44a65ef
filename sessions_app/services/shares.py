"""Read-only links to a session: started and stopped by its owner, each a fresh unguessable token."""

from __future__ import annotations

import secrets

from django.db import transaction
from django.utils import timezone

from sessions_app.models import ChatSession, SessionShare


@transaction.atomic
def share_start(*, session: ChatSession) -> SessionShare:
    """The session's read-only link, made where it has none that works."""
    ChatSession.objects.select_for_update(no_key=True).filter(pk=session.pk).first()
    found = SessionShare.objects.filter(session=session, revoked_at__isnull=True).first()
    if found is not None:
        return found
    return SessionShare.objects.create(session=session, token=secrets.token_urlsafe(24))


@transaction.atomic
def share_stop(*, session: ChatSession) -> int:
    """Revoke the session's link: it shows nothing from now on. How many were revoked."""
    return SessionShare.objects.filter(session=session, revoked_at__isnull=True).update(revoked_at=timezone.now())
