"""``manage.py ask``: the reply loop from a terminal, on the same store the browser uses; every open tab of the
session follows the reply as it streams, and a Stop in one of them stops it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import ProgrammingError

from chat.actions import Action, Compact, Regenerate, Rewind, Send, Undo
from chat.agent.echo import EchoLine
from chat.agent.endpoints import FALLBACK_MODEL
from chat.agent.model import ModelError, list_models
from chat.agent.workspace import session_tools
from chat.follow import Followed, follow
from chat.management.database import unapplied_migrations
from sessions_app.errors import NoLiveTurnFrom, StoreError
from sessions_app.folders import folder_check
from sessions_app.models import (
    ChatSession,
    Mode,
    ModelEndpoint,
    ModelRequest,
    RequestKind,
    Turn,
    TurnStatus,
    Workspace,
)
from sessions_app.selectors.sessions import (
    endpoint_list,
    endpoints_for,
    last_live_turn,
    live_turn_at,
    session_get,
    workspace_folder_refusal,
    workspace_refusal,
    workspaces_for,
)
from sessions_app.services.sessions import session_model_switch, session_set_mode, session_settings_set, session_start
from sessions_app.services.workspaces import workspace_from_shell, workspace_private


def _endpoint(spec: str | None, user: Any) -> ModelEndpoint:
    """The endpoint ``spec`` names (a URL makes one), else the default one (the first ``user`` may use, where they
    may not use the default); refused where ``user`` may not use it, as the page refuses it."""
    found = _named(spec) if spec else next(iter(endpoint_list(user=user)), None)
    if found is None:
        raise CommandError("No model endpoint is configured; pass --endpoint URL or run manage.py serve once.")
    if not endpoints_for(user=user).filter(pk=found.pk).exists():
        raise CommandError(
            f"{user.get_username()} may not use the model endpoint {found.name!r}: staff grant it in the admin."
        )
    return found


def _named(spec: str) -> ModelEndpoint | None:
    if spec:
        found = ModelEndpoint.objects.filter(name=spec).first()
        if found is None and "://" in spec:
            found, _ = ModelEndpoint.objects.get_or_create(
                base_url=spec.rstrip("/"), defaults={"name": spec.rstrip("/")[:100]}
            )
        if found is None:
            raise CommandError(f"No model endpoint named {spec!r}; give its name or a URL ending in /v1.")
        return found
    return None


def _model(endpoint: ModelEndpoint) -> str:
    """The endpoint's own model, else the first its server lists."""
    if endpoint.model:
        return endpoint.model
    try:
        models = list_models(base_url=endpoint.base_url, api_key=endpoint.api_key or None)
    except ModelError as error:
        raise CommandError(str(error)) from error
    return models[0] if models else FALLBACK_MODEL


def _usable(workspace: Workspace) -> Workspace:
    """``workspace`` where its folder is one Cachet may use now, else a one-line error."""
    refusal = workspace_folder_refusal(workspace=workspace)
    if refusal:
        raise CommandError(f"The workspace {workspace.name!r} is on a folder Cachet may not use: {refusal}.")
    return workspace


def _workspace(spec: str | None, user: Any) -> Workspace:
    available = workspaces_for(user=user)
    if spec is None:  # the person's own, made on first use
        try:
            return _usable(workspace_private(user=user))
        except StoreError as error:
            raise CommandError(f"{error} Or pass --workspace NAME_OR_FOLDER.") from error
    by_name = available.filter(name=spec).first()
    if by_name is not None:
        return _usable(by_name)
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        raise CommandError(f"{spec!r} is neither a workspace name nor a folder.")
    checked = folder_check(folder.resolve(), anywhere=True)  # outside the roots too, never a forbidden folder
    if not checked.allowed:
        raise CommandError(f"Cachet may not use {spec} as a workspace: {checked.refusal}.")
    for workspace in available.filter(folder=str(checked.folder)):
        return _usable(workspace)
    try:
        return workspace_from_shell(user=user, folder=checked.folder)
    except StoreError as error:
        raise CommandError(str(error)) from error


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # serve runs the checks; the URLconf (every web module) is not loaded
    help = "Send a message (or undo, rewind, regenerate, compact) and stream the reply to standard output."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("message", nargs="?")
        parser.add_argument("--user", required=True)
        where = parser.add_mutually_exclusive_group()
        where.add_argument("--session", type=int)
        where.add_argument("--workspace")
        parser.add_argument(
            "--endpoint",
            help="an endpoint's name or URL (default: the endpoint named default); with --session, moves the session",
        )
        parser.add_argument("--model", help="the model to ask for; with --session, moves the session to it")
        parser.add_argument("--mode", choices=Mode.values)
        parser.add_argument(
            "--instructions", help="the session's instructions (a note on the next message); '' removes them"
        )
        parser.add_argument("--temperature", type=float, help="the session's temperature, 0 to 2")
        parser.add_argument("--max-tokens", type=int, help="the most tokens a reply's step writes")
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--undo", action="store_true")
        action.add_argument(
            "--rewind", type=int, metavar="N", help="take back turn N (as the page numbers turns) and every later one"
        )
        action.add_argument("--regenerate", action="store_true")
        action.add_argument("--compact", action="store_true")
        parser.add_argument("--restore-files", action="store_true", help="with undo, rewind or regenerate")

    def _session(self, options: dict[str, Any], user: Any) -> ChatSession:
        if options["session"] is not None:
            session = session_get(owner=user, session_id=options["session"])
            if session is None:
                raise CommandError(f"{user.get_username()} has no session {options['session']}.")
            refused = workspace_refusal(session=session)
            if refused is not None:
                raise CommandError(str(refused))
            if options["mode"] and options["mode"] != session.mode:
                session = session_set_mode(session=session, mode=options["mode"])
            if options["endpoint"] or options["model"]:
                session = self._change_model(session, options)
            return self._settings(session, options)
        workspace = _workspace(options["workspace"], user)
        endpoint = _endpoint(options["endpoint"], user)
        try:
            return session_start(
                owner=user,
                workspace=workspace,
                endpoint=endpoint,
                model_name=options["model"] or _model(endpoint),
                tools=session_tools(workspace),
                mode=options["mode"] or Mode.EDIT,
                instructions=options["instructions"] or "",
                temperature=options["temperature"],
                max_tokens=options["max_tokens"],
            )
        except ValueError as error:
            raise CommandError(str(error)) from error

    def _settings(self, session: ChatSession, options: dict[str, Any]) -> ChatSession:
        """The session's instructions and sampling as the options change them (those not given stay)."""
        given = [options[name] is not None for name in ("instructions", "temperature", "max_tokens")]
        if not any(given):
            return session
        try:
            return session_settings_set(
                session=session,
                instructions=session.instructions if options["instructions"] is None else options["instructions"],
                temperature=session.temperature if options["temperature"] is None else options["temperature"],
                max_tokens=session.max_tokens if options["max_tokens"] is None else options["max_tokens"],
            )
        except ValueError as error:
            raise CommandError(str(error)) from error

    def _change_model(self, session: ChatSession, options: dict[str, Any]) -> ChatSession:
        """Move the session to the endpoint and model the options name, before the action runs."""
        endpoint = _endpoint(options["endpoint"], session.owner) if options["endpoint"] else session.endpoint
        model = options["model"] or (session.model_name if endpoint.pk == session.endpoint_id else _model(endpoint))
        if (endpoint.pk, model) == (session.endpoint_id, session.model_name):
            return session
        try:
            session = session_model_switch(session=session, endpoint=endpoint, model_name=model)
        except (StoreError, ValueError) as error:
            raise CommandError(str(error)) from error
        self.stdout.write(
            f"Model: {session.model_name} at {endpoint.base_url} (the next request reads the conversation again)."
        )
        return session

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            user = get_user_model().objects.filter(username=options["user"]).first()
        except ProgrammingError:
            if unapplied := unapplied_migrations():  # a fresh data folder
                raise CommandError(
                    f"The database has no Cachet tables yet ({unapplied} migrations to apply): start Cachet once "
                    "with ./run (or manage.py serve --no-serve), which applies them and creates the admin account."
                ) from None
            raise
        if user is None:
            raise CommandError(f"There is no user {options['user']!r}.")
        session = self._session(options, user)
        restore = options["restore_files"]
        actions: list[Action] = []
        if options["undo"]:
            actions.append(Undo(restore=restore))
        elif options["rewind"] is not None:
            target = live_turn_at(session, options["rewind"])  # N is the turn's place, as the page labels it
            if target is None:
                raise CommandError(str(NoLiveTurnFrom(options["rewind"])))
            actions.append(Rewind(turn=target.number, restore=restore))
        elif options["compact"]:
            actions.append(Compact())
        if options["regenerate"]:
            actions.append(Regenerate(restore=restore))
        elif options["message"] is not None:
            actions.append(Send(words=options["message"]))
        failed = False
        turn: Turn | None = None
        request_ids: list[int] = []
        try:
            ended = asyncio.run(self._follow(session.pk, actions))
        except KeyboardInterrupt:
            self.stderr.write("Stopped waiting; the reply goes on where it runs.")
            ended, failed = [], True
        for followed in ended:
            request_ids.extend(followed.request_ids)
            if not followed.heard_end and followed.turn_id is not None:  # its worker died: what the store has
                request_ids.extend(ModelRequest.objects.filter(turn_id=followed.turn_id).values_list("pk", flat=True))
            if followed.turn_id is not None:
                turn = Turn.objects.filter(pk=followed.turn_id).first()
            if followed.failure:
                self.stderr.write(followed.failure)
                failed = True
        if turn is not None:
            turn.refresh_from_db()
        if turn is not None and turn.status != TurnStatus.DONE:
            self.stderr.write(f"Turn {turn.position} {turn.get_status_display()}: {turn.error}")
            failed = True
        last = turn or last_live_turn(session)
        # the reply's requests: a title's request after a first reply is not counted
        requests = list(ModelRequest.objects.filter(pk__in=request_ids).exclude(kind=RequestKind.TITLE))
        prompt_tokens = sum(r.prompt_tokens or 0 for r in requests)
        cached_tokens = sum(r.cached_tokens or 0 for r in requests)
        self.stdout.write(
            f"session={session.pk} turn={last.position if last else 0} requests={len(requests)} "
            f"prompt_tokens={prompt_tokens} cached_tokens={cached_tokens}"
        )
        if failed:
            sys.exit(1)

    async def _follow(self, session_id: int, actions: list[Action]) -> list[Followed]:
        """Queue each action in turn and follow it to its end; stop at the first that fails."""
        ended = []
        for action in actions:
            ended.append(await follow(session_id, action, write=self.write))
            if ended[-1].failure:
                break
        return ended

    def write(self, line: EchoLine) -> None:
        """Print a line the job sends."""
        stream = self.stderr if line["err"] else self.stdout
        stream.write(line["text"], ending=line["ending"])
        stream.flush()
