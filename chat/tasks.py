"""The task queue's tasks (Procrastinate finds this module in each app): a session's action, run by a worker."""

from __future__ import annotations

from typing import Any

from procrastinate.contrib.django import app

from chat.web import jobs


@app.task(name="cachet.session_action", queue=jobs.QUEUE)
async def session_action(
    *, session_id: int, action: dict[str, Any], reply_to: str | None, echo_to: str | None = None
) -> None:
    """Run the session's action (a reply, an undo, …) with its events relayed to the session's tabs (and its lines to
    the terminal that asked, where one did)."""
    await jobs.run(session_id, jobs.action_from(action), reply_to=reply_to, echo_to=echo_to)
