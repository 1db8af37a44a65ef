"""An MCP server asked for its tools and instructions, in a job of its own (``chat.tasks.mcp_server_check``): after
staff saved it in the admin, and at each start of Cachet. What it said is kept with it for sessions that start
later; why it did not answer is kept for the admin."""

from __future__ import annotations

from asgiref.sync import ThreadSensitiveContext
from django.db import close_old_connections

from chat.agent.loop import close_connection, store
from chat.agent.mcp import McpAddress, McpTimedOut, McpUnreachable, mcp_listing
from chat.agent.mcp_calls import mcp_address
from chat.agent.workspace import folder_context
from sessions_app.models import McpServer
from sessions_app.services.mcp import mcp_server_failed, mcp_server_listed

CHECK_TIMEOUT = 15.0


def _address(server_id: int) -> McpAddress | None:
    server = McpServer.objects.select_related("workspace").filter(pk=server_id).first()
    return None if server is None else mcp_address(server, folder_context(server.workspace))


async def run(server_id: int) -> None:
    """Ask the server now and keep its answer."""
    async with ThreadSensitiveContext():
        await store(close_old_connections)
        try:
            address = await store(_address, server_id)
            if address is None:
                return
            try:
                listing = await mcp_listing(address, timeout=CHECK_TIMEOUT)
            except McpUnreachable as error:
                await store(mcp_server_failed, server_id=server_id, problem=str(error))
            except McpTimedOut:
                await store(mcp_server_failed, server_id=server_id, problem=f"no answer within {CHECK_TIMEOUT:g} s")
            else:
                tools_json, instructions = listing.as_json(), listing.instructions
                await store(mcp_server_listed, server_id=server_id, tools_json=tools_json, instructions=instructions)
        finally:
            await store(close_connection)
