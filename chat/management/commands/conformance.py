"""``manage.py conformance FILE [FILE ...]``: run conformance case files, one line per case."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from chat.conformance import FormatError, load_cases, run_case


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # serve runs the checks; the URLconf (every web module) is not loaded
    help = "Run conformance case files against the real store, tools and Postgres."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("files", nargs="+", type=Path)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            cases = [case for path in options["files"] for case in load_cases(path)]
        except FormatError as error:
            self.stderr.write(str(error))
            sys.exit(2)
        call_command("migrate", interactive=False, verbosity=0)  # a fresh checkout's database has no tables yet
        passed = failed = 0
        for case in cases:
            result = run_case(case)
            self.stdout.write(result.line)
            if result.failure is None:
                passed += 1
            else:
                failed += 1
        self.stdout.write(f"{passed} passed, {failed} failed")
        if failed:
            sys.exit(1)
