"""A result ready to be inserted, and the entry it becomes in the dedupe table."""

from __future__ import annotations

from dataclasses import dataclass

from .dedupe import PriorResult


@dataclass(frozen=True)
class Rendered:
    """``inserted_text`` is sent to the model; ``full_text`` is the body before any cap, stored for recall."""

    number: int
    inserted_text: str
    full_text: str
    kind: str
    refers_to: int | None = None
    stale: tuple[int, ...] = ()
    abs_path: str | None = None
    sha256: str | None = None
    first_line: int | None = None
    last_line: int | None = None
    changed_files: tuple[tuple[str, str], ...] = ()

    def as_prior(self, tool: str, args_key: str) -> PriorResult:
        """This result as an entry of the dedupe table."""
        return PriorResult(
            number=self.number,
            tool=tool,
            args_key=args_key,
            kind=self.kind,
            full_text=self.full_text,
            abs_path=self.abs_path,
            sha256=self.sha256,
            first_line=self.first_line,
            last_line=self.last_line,
            changed_files=self.changed_files,
        )


def with_bracket(bracket: str, body: str) -> str:
    """The bracket, then a newline and ``body`` when there is one."""
    return f"{bracket}\n{body}" if body else bracket
