"""The admin's list of personal access tokens: staff see who has which and revoke one; the secret is nowhere."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from sessions_app.models import ApiToken
from sessions_app.services.tokens import api_token_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(django_user_model: Any) -> Client:
    django_user_model.objects.create_superuser("root", password="root-password-1")
    client = Client()
    client.force_login(django_user_model.objects.get(username="root"))
    return client


def test_staff_see_tokens_without_their_secret_and_revoke_one(staff: Client, user: Any) -> None:
    made = api_token_create(owner=user, name="laptop", access="write")
    listed = staff.get("/admin/sessions_app/apitoken/").content.decode()
    assert "laptop" in listed and made.token.shown in listed
    page = staff.get(f"/admin/sessions_app/apitoken/{made.token.pk}/change/").content.decode()
    assert made.secret not in page and made.token.digest not in page
    assert staff.get("/admin/sessions_app/apitoken/add/").status_code == 403
    answer = staff.post(
        "/admin/sessions_app/apitoken/", {"action": "revoke", "_selected_action": [str(made.token.pk)]}, follow=True
    )
    assert "Revoked 1 token(s)." in answer.content.decode()
    assert ApiToken.objects.get(pk=made.token.pk).revoked_at is not None
    assert Client().get("/api/v1/me", headers={"Authorization": f"Bearer {made.secret}"}).status_code == 401
