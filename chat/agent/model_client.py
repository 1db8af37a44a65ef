"""The model client's old name, kept for the callers that still import it (``chat.web.jobs``, ``ask``): the
client is the ``chat.agent.model`` package."""

from __future__ import annotations

from chat.agent.model import ModelError, list_models

__all__ = ["ModelError", "list_models"]
