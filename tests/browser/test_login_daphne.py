"""Daphne hands Django the connection's address: the login limits count the real client, not a header."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from axes.models import AccessAttempt

pytestmark = pytest.mark.django_db(transaction=True)


def test_daphne_passes_the_client_address_and_ignores_forwarded_for(cachet_url: str, django_user_model: Any) -> None:
    django_user_model.objects.create_user(username="ada", password="ada-password-1")
    transport = httpx.HTTPTransport(local_address="127.0.0.7")
    with httpx.Client(base_url=cachet_url, transport=transport, timeout=30) as client:
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', client.get("/login/").text)
        assert token is not None
        response = client.post(
            "/login/",
            data={"csrfmiddlewaretoken": token.group(1), "username": "ada", "password": "wrong"},
            headers={"X-Forwarded-For": "6.6.6.6"},
        )
    assert response.status_code == 200
    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == ["127.0.0.7"]
