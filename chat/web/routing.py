"""Websocket routes: one per chat session; any other path is closed as not found (never an error)."""

from __future__ import annotations

from typing import Any

from django.urls import path, re_path

import cachet.converters  # noqa: F401  (registers the ``id`` converter)
from chat.web.consumers import NotFoundConsumer, SessionConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/sessions/<id:session_id>/", SessionConsumer.as_asgi()),
    re_path(r"^", NotFoundConsumer.as_asgi()),
]
