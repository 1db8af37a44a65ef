"""Edits answer with the diff (spec §5), then a notice naming the reads they made stale (from ``003``)."""

from __future__ import annotations

from collections.abc import Sequence

from .cap import cap_text
from .config import ContextConfig
from .dedupe import READ_KINDS, Kind, PriorResult
from .ids import format_id
from .lines import NEWLINE, content_end
from .outcomes import EditOutcome, FileChange
from .paths import bracket_path
from .rendered import Rendered


def last_seen_sha(table: Sequence[PriorResult], abs_path: str) -> str | None:
    """The sha the model last saw of ``abs_path`` in this reply (``""`` if deleted); ``None`` if not seen."""
    for entry in reversed(table):
        if entry.kind in READ_KINDS and entry.abs_path == abs_path:
            return entry.sha256
        if entry.kind == Kind.EDIT:
            for changed_path, sha in reversed(entry.changed_files):
                if changed_path == abs_path:
                    return sha
    return None


def unannounced_reads(table: Sequence[PriorResult]) -> dict[str, list[PriorResult]]:
    """Per file, the reads and stubs in ``table`` that no earlier edit has announced stale."""
    pending: dict[str, list[PriorResult]] = {}
    for entry in table:
        if entry.kind in READ_KINDS and entry.abs_path is not None:
            pending.setdefault(entry.abs_path, []).append(entry)
        elif entry.kind == Kind.EDIT:
            for abs_path, sha in entry.changed_files:
                announce_stale(pending, abs_path, sha)
    return pending


def announce_stale(pending: dict[str, list[PriorResult]], abs_path: str, new_sha: str) -> tuple[int, ...]:
    """Take from ``pending`` the reads of ``abs_path`` that show other content than ``new_sha``."""
    reads = pending.get(abs_path, [])
    pending[abs_path] = [entry for entry in reads if entry.sha256 == new_sha]
    return tuple(entry.number for entry in reads if entry.sha256 != new_sha)


def render_edit(*, number: int, outcome: EditOutcome, table: Sequence[PriorResult], config: ContextConfig) -> Rendered:
    """One change under the result's bracket, or the id alone and each file under its own bracket, in order.

    An update shows its diff, capped; a new file its bracket and the ``created`` sentence on one line, as
    the spec writes it (``[#0023 docs/new.md sha 52b6e3a0] Created, 14 lines.``); a deleted file its
    bracket alone. The full text is the body without the result's own bracket (a single new file: the
    sentence alone).
    Each is followed by a notice naming the reads of this reply that it made stale and no earlier edit
    announced: those whose content differs from the file's new content. An unchanged file names none.
    """
    full_id = format_id(number, config.id_digits)
    several = outcome.several or len(outcome.changes) != 1
    pending = unannounced_reads(table)
    shown: list[str] = [config.text("bracket", id=full_id)] if several else []
    full: list[str] = []
    stale: list[int] = []
    for change in outcome.changes:
        bracket = _file_bracket(change, None if several else full_id, config)
        if change.action == "create":
            created = config.text("created", lines=change.lines)
            line = config.text("created_line", bracket=bracket, created=created)
            shown.append(line)
            full.append(line if several else created)
        else:
            shown.append(bracket)
            if several:
                full.append(bracket)
            if change.action == "update":
                diff = change.diff[: content_end(change.diff)]
                if diff:
                    shown.append(cap_text(diff, full_id=full_id, limits=config.cap, config=config))
                    full.append(diff)
        announced = announce_stale(pending, change.abs_path, change.sha256)
        if announced:
            ids = ", ".join(format_id(stale_number, config.id_digits) for stale_number in announced)
            notice = config.text("stale", ids=ids)
            shown.append(notice)
            full.append(notice)
            stale.extend(announced)
    return Rendered(
        number=number,
        inserted_text=NEWLINE.join(shown),
        full_text=NEWLINE.join(full),
        kind=Kind.EDIT,
        stale=tuple(stale),
        changed_files=tuple((change.abs_path, change.sha256) for change in outcome.changes),
    )


def _file_bracket(change: FileChange, full_id: str | None, config: ContextConfig) -> str:
    sha = change.sha256[: config.sha_digits]
    path = bracket_path(change.path)
    if full_id is None:
        if change.action == "delete":
            return config.text("file_deleted", path=path)
        return config.text("file_bracket", path=path, sha=sha)
    if change.action == "delete":
        return config.text("edit_deleted", id=full_id, path=path)
    return config.text("edit_bracket", id=full_id, path=path, sha=sha)
