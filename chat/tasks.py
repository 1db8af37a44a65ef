"""The task queue's tasks (Procrastinate finds this module in each app): a session's action, and a request's cache
check, both run by workers."""

from __future__ import annotations

from typing import Any

from procrastinate import JobContext
from procrastinate.contrib.django import app

from chat.actions import CHECKS_QUEUE, QUEUE, action_from


@app.task(name="cachet.session_action", queue=QUEUE, pass_context=True)
async def session_action(
    context: JobContext, *, session_id: int, action: dict[str, Any], reply_to: str | None, checks_queued: bool = True
) -> None:
    """Run the session's action (a reply, an undo, …), its events published to the session's tabs and the notices
    for the one that asked to ``reply_to``; its cache checks queued as jobs of their own (run by the job itself,
    once the session is free, where not ``checks_queued``)."""
    from chat.agent.cache_check import CheckSpec
    from chat.worker import jobs

    async def check_later(specs: list[CheckSpec]) -> None:
        await cache_checks.defer_async(specs=[spec.as_json() for spec in specs])

    job_id = context.job.id or 0
    await jobs.run(
        session_id,
        job_id,
        action_from(action),
        reply_to=reply_to,
        check_later=check_later if checks_queued else None,
    )


@app.task(name="cachet.cache_checks", queue=CHECKS_QUEUE)
async def cache_checks(*, specs: list[dict[str, Any]]) -> None:
    """Check what an action's finished requests should have found cached, one after the other, store each check
    and show it to the session's tabs (one job for them all: a job's own cost, taking it and its database
    connection, was more than a short check's)."""
    from chat.worker import checks

    for spec in specs:
        await checks.run(spec)


@app.task(name="cachet.cache_check", queue=CHECKS_QUEUE)
async def cache_check(*, spec: dict[str, Any]) -> None:
    """One request's check, as a job queued by an earlier version of Cachet (before ``cache_checks``) asks it."""
    from chat.worker import checks

    await checks.run(spec)


@app.task(name="cachet.mcp_server_check", queue=CHECKS_QUEUE)
async def mcp_server_check(*, server_id: int) -> None:
    """Ask an MCP server for its tools and instructions and keep what it said, or why it did not answer."""
    from chat.worker import mcp_checks

    await mcp_checks.run(server_id)


def _mcp_server_saved(sender: type[Any], instance: Any, **kwargs: Any) -> None:
    """A server staff added or changed is asked for its tools once the change is committed."""
    from django.db import transaction

    server_id = instance.pk
    transaction.on_commit(lambda: mcp_server_check.defer(server_id=server_id))


def connect() -> None:
    """Ask each MCP server saved (in the admin, or by any other save) for its tools."""
    from django.db.models.signals import post_save

    from sessions_app.models import McpServer

    post_save.connect(_mcp_server_saved, sender=McpServer, dispatch_uid="cachet.mcp_server_saved")
