"""What MCP servers said when Cachet last asked them, kept with each server for the admin and for new sessions."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from sessions_app.models import McpServer
from sessions_app.text import storable


@transaction.atomic
def mcp_server_listed(*, server_id: int, tools_json: str, instructions: str) -> None:
    """Keep the tools (:meth:`chat.agent.mcp.McpListing.as_json`) and instructions a server answered now."""
    McpServer.objects.filter(pk=server_id).update(
        tools_json=storable(tools_json), instructions=storable(instructions), checked_at=timezone.now(), problem=""
    )


@transaction.atomic
def mcp_server_failed(*, server_id: int, problem: str) -> None:
    """Keep why a server did not answer now; what it said before stays."""
    McpServer.objects.filter(pk=server_id).update(problem=storable(problem), checked_at=timezone.now())
