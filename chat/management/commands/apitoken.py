"""``manage.py apitoken USER``: a personal access token for scripts, printed on the last line (its only showing)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sessions_app.models import ApiTokenAccess
from sessions_app.services.tokens import api_token_create


class Command(BaseCommand):
    requires_system_checks: list[str] = []
    help = "Make a personal access token for the API for USER and print it on the last line (it is not kept)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("user", help="the username the token acts as")
        parser.add_argument("--name", default="script", help="what the token is for, as its owner sees it listed")
        parser.add_argument(
            "--write", action="store_true", help="read-write: it may send, stop, undo, rename, delete (else read-only)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"There is no user {options['user']!r}.")
        if not user.is_active:
            raise CommandError(f"{options['user']} is not active: a token of theirs would not be accepted.")
        access = ApiTokenAccess.WRITE if options["write"] else ApiTokenAccess.READ
        try:
            made = api_token_create(owner=user, name=options["name"], access=access)
        except ValueError as error:
            raise CommandError(str(error)) from error
        kind = "read-write" if made.token.writes else "read-only"
        self.stderr.write(f"A {kind} token {made.token.name!r} for {user.get_username()}; it is shown only now.")
        self.stdout.write(made.secret)
