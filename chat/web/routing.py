"""Websocket routes: one per chat session."""

from __future__ import annotations

from typing import Any

from django.urls import path

from chat.web.consumers import SessionConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/sessions/<int:session_id>/", SessionConsumer.as_asgi()),
]
