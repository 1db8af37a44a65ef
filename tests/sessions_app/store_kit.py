"""Store writes several tests of the store start from."""

from __future__ import annotations

from sessions_app.models import ChatSession, ModelRequest, Turn
from sessions_app.selectors.requests import BuiltRequest, PreviousRequest, build_request, previous_request
from sessions_app.services.requests import request_record_start


def request_recorded(
    session: ChatSession,
    turn: Turn,
    *,
    step_number: int = 1,
    model_name: str = "m",
    built: BuiltRequest | None = None,
    previous: PreviousRequest | None = None,
) -> tuple[ModelRequest, PreviousRequest]:
    """Record a reply's request for ``turn`` as the loop does: ``built`` from the store and compared with
    the session's ``previous`` request unless given."""
    return request_record_start(
        session=session,
        turn=turn,
        step_number=step_number,
        kind="reply",
        built=build_request(session, current=turn, model_name=model_name) if built is None else built,
        endpoint_url="http://127.0.0.1:9/v1",
        model_name=model_name,
        previous=previous_request(session) if previous is None else previous,
    )
