"""What the API takes and answers, as django-ninja (pydantic) schemas: the OpenAPI document is made from these."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Field, Schema

from chat.web.forms import MODEL_MAX_LENGTH
from sessions_app.services.sessions import INSTRUCTIONS_CHARS, MAX_TOKENS_LIMIT, TEMPERATURE_RANGE

NOT_BLANK: dict[str, Any] = {"pattern": r"\S"}  # stated in the schema; a blank one is told "Write a message first."


class Problem(Schema):
    """Why a request was refused, in words a person can act on."""

    detail: str


class Invalid(Schema):
    """A request not as the schema says: what is wrong, and pydantic's errors."""

    detail: str
    errors: list[dict[str, Any]] = Field(default_factory=list)


class TokenInfo(Schema):
    name: str
    access: Literal["read", "write"]


class Me(Schema):
    username: str
    staff: bool
    token: TokenInfo


class Totals(Schema):
    """The session's finished requests added up (as its chart summary says)."""

    requests: int
    prompt_tokens: int
    cached_tokens: int
    processed_tokens: int
    prompt_seconds: float
    saved_seconds: float | None


class SessionOut(Schema):
    id: int
    title: str
    workspace: str
    endpoint: str
    model: str
    mode: Literal["plan", "edit", "full"]
    pinned: bool
    archived: bool
    revision: int
    running: bool = Field(description="Whether a reply (or other job) of the session runs or waits in the queue.")
    read_only: str = Field(description="Why the session may not be changed; empty where it may.")
    created_at: datetime
    updated_at: datetime
    url: str = Field(description="The session's page in the browser.")
    totals: Totals


class SessionList(Schema):
    count: int
    items: list[SessionOut]


class SessionCreate(Schema):
    """A new session, stored with its first message, whose reply is queued at once (as New chat does)."""

    text: str = Field(min_length=1, json_schema_extra=NOT_BLANK, description="The first message (not blank).")
    workspace: int | None = Field(None, description="A workspace's id; default: the person's own.")
    endpoint: int | None = Field(None, description="A model endpoint's id; default: the first they may use.")
    model: str = Field(
        "", max_length=MODEL_MAX_LENGTH, description="A model on the endpoint; default: its own, else the first listed."
    )
    mode: Literal["plan", "edit", "full"] = "edit"
    instructions: str = Field("", max_length=INSTRUCTIONS_CHARS)
    temperature: float | None = Field(None, ge=TEMPERATURE_RANGE[0], le=TEMPERATURE_RANGE[1])
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)


class SessionChange(Schema):
    """What to change of a session; a field left out stays as it is."""

    title: str | None = Field(None, max_length=200)
    pinned: bool | None = None
    archived: bool | None = None


class Queued(Schema):
    """A job queued for the session: follow it at ``events`` (Server-Sent Events)."""

    session: int
    job: int
    events: str


class Created(Schema):
    session: SessionOut
    job: int
    events: str


class Said(Schema):
    text: str = Field(min_length=1, json_schema_extra=NOT_BLANK, description="The message (not blank).")


class Restore(Schema):
    restore: bool = Field(False, description="Put back the files the taken-back turns changed, where unchanged since.")


class RewindTo(Schema):
    turn: int = Field(description="The stored number of the first turn to take back (``number`` of a turn).")
    restore: bool = False


class Stopped(Schema):
    sent: bool = Field(description="Whether the Stop reached the reply (false: the channel layer is away).")


class ToolCall(Schema):
    name: str
    arguments: str
    result: str | None = Field(description="The result's id as the model saw it (``#0012``); null: none stored.")


class StepOut(Schema):
    number: int
    text: str
    reasoning: str
    finish_reason: str
    tool_calls: list[ToolCall]


class TurnOut(Schema):
    number: int = Field(description="Stored number of the turn (stable; rewind takes it).")
    position: int = Field(description="Its place in its branch, as the page labels it.")
    parent: int | None
    status: str
    live: bool = Field(description="On the live branch (not taken back).")
    words: str = Field(description="What the person wrote.")
    reply: str
    error: str
    rating: str
    started_at: datetime
    finished_at: datetime | None
    steps: list[StepOut]


class TurnList(Schema):
    count: int
    items: list[TurnOut]


class ResultOut(Schema):
    id: str = Field(description="As the model saw it: ``#`` and the number in hex.")
    number: int
    turn: int
    tool: str
    arguments: str
    kind: str
    status: str
    inserted_text: str = Field(description="The text the model saw.")
    full_text: str = Field(description="Everything the tool answered, stored whole.")
    path: str
    created_at: datetime
