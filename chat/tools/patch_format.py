"""The ``*** Begin Patch`` format of OpenAI Codex's ``apply_patch``: parsing it, and applying the
hunks of an update to a file's text.

The grammar (as Codex has it, with its lenient readings)::

    *** Begin Patch
    *** Add File: PATH          then the new file's lines, each prefixed "+"
    *** Delete File: PATH
    *** Update File: PATH
    *** Move to: NEW_PATH       optional
    @@ optional line to find first, then " " context, "-" removed and "+" added lines
    *** End of File             optional, after a hunk that ends at the end of the file
    *** End Patch

A hunk's lines are found from where the previous hunk ended (or from its ``@@`` line, which
may repeat as the first context line): exactly, else ignoring trailing whitespace, else ignoring
surrounding whitespace. A hunk with no old lines is inserted after its ``@@`` line, or at the
end. An empty line inside an update is an empty context line; the first hunk may leave out its
``@@``; an ``@@ -1,3 +1,4 @@`` header counts as a bare ``@@``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sessions_app.hygiene.config import ContextConfig

from .errors import ToolError, shown
from .files import is_crlf, split_lines

BEGIN = "*** Begin Patch"
END = "*** End Patch"
ADD = "*** Add File: "
DELETE = "*** Delete File: "
UPDATE = "*** Update File: "
MOVE = "*** Move to: "
END_OF_FILE = "*** End of File"
_RANGE_HEADER = re.compile(r"^-\d+(,\d+)? \+\d+(,\d+)? @@")
_HEREDOC_OPEN = re.compile(r"^<<-?\s*['\"]?EOF['\"]?$")
_MATCHERS: tuple[Callable[[str], str], ...] = (lambda line: line, str.rstrip, str.strip)


@dataclass
class Hunk:
    """A part of an update: an optional line to find first, then old lines to replace by new ones."""

    context: str | None
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    end_of_file: bool = False


@dataclass
class FileOp:
    """One file the patch adds, deletes or updates."""

    action: Literal["add", "delete", "update"]
    path: str
    content: str = ""
    move_to: str | None = None
    hunks: list[Hunk] = field(default_factory=list)


def parse_patch(patch: str, config: ContextConfig) -> list[FileOp]:
    """The file operations of ``patch``, in order; a ``ToolError`` names what is wrong."""
    stripped = patch.lstrip()
    base = patch[: len(patch) - len(stripped)].count("\n")
    lines = [line.removesuffix("\r") for line in stripped.rstrip().split("\n")]
    if len(lines) > 2 and _HEREDOC_OPEN.match(lines[0].strip()) and lines[-1].strip() == "EOF":
        lines = lines[1:-1]
        base += 1
    if lines[0].strip() != BEGIN:
        raise _invalid(config, config.errors["patch_no_begin"])
    if len(lines) < 2 or lines[-1].strip() != END:
        raise _invalid(config, config.errors["patch_no_end"])
    ops: list[FileOp] = []
    index, end = 1, len(lines) - 1
    while index < end:
        line = lines[index]
        if line.startswith(ADD):
            op = FileOp("add", line[len(ADD) :].strip())
            index += 1
            added: list[str] = []
            while index < end and lines[index].startswith("+"):
                added.append(lines[index][1:])
                index += 1
            op.content = "".join(item + "\n" for item in added)
            ops.append(op)
        elif line.startswith(DELETE):
            ops.append(FileOp("delete", line[len(DELETE) :].strip()))
            index += 1
        elif line.startswith(UPDATE):
            op = FileOp("update", line[len(UPDATE) :].strip())
            index += 1
            if index < end and lines[index].startswith(MOVE):
                op.move_to = lines[index][len(MOVE) :].strip()
                index += 1
            index = _parse_hunks(lines, index, end, op, config, base)
            ops.append(op)
        elif not line.strip():
            index += 1
        else:
            raise _bad_line(config, base + index, line)
    if not ops:
        raise _invalid(config, config.errors["patch_no_files"])
    return ops


def apply_hunks(text: str, hunks: Sequence[Hunk], path: str, config: ContextConfig) -> str:
    """``text`` with ``hunks`` applied; a final newline, or its absence, and CRLF line ends are kept."""
    lines = split_lines(text)
    crlf = is_crlf(text)
    replacements: list[tuple[int, int, int, list[str]]] = []
    position = 0
    for number, hunk in enumerate(hunks, start=1):
        new = [line if line.endswith("\r") else line + "\r" for line in hunk.new] if crlf else hunk.new
        if hunk.context is not None:
            found = _seek(lines, [hunk.context], position, end_of_file=False)
            if found is None:
                raise _missing(config, number, path)
            position = found + 1
        if not hunk.old:
            at = position if hunk.context is not None else len(lines)
            replacements.append((at, number, 0, new))
            continue
        old = hunk.old
        found = _seek(lines, old, position, end_of_file=hunk.end_of_file)
        if found is None and hunk.context is not None:
            found = _seek(lines, old, position - 1, end_of_file=hunk.end_of_file)
        if found is None and old[-1] == "" and len(old) > 1:
            old = old[:-1]
            new = new[:-1] if new and new[-1].strip() == "" else new
            found = _seek(lines, old, position, end_of_file=hunk.end_of_file)
        if found is None:
            raise _missing(config, number, path)
        replacements.append((found, number, len(old), new))
        position = found + len(old)
    for start, _, length, new in sorted(replacements, reverse=True):
        lines[start : start + length] = new
    if not lines:
        return ""
    if text == "" or text.endswith("\n"):
        return "\n".join(lines) + "\n"
    joined = "\n".join(lines)
    return joined.removesuffix("\r") if crlf and not text.endswith("\r") else joined


def _parse_hunks(lines: list[str], index: int, end: int, op: FileOp, config: ContextConfig, base: int) -> int:
    hunk: Hunk | None = None
    while index < end:
        line = lines[index]
        if line.strip() == END_OF_FILE:
            if hunk is None:
                raise _bad_line(config, base + index, line)
            hunk.end_of_file = True
            hunk = None
        elif line.startswith("***"):
            break
        elif line.startswith("@@"):
            context = line[2:].strip()
            hunk = Hunk(None if not context or _RANGE_HEADER.match(context) else context)
            op.hunks.append(hunk)
        elif line == "" or line[0] in " -+":
            if hunk is None:
                hunk = Hunk(None)
                op.hunks.append(hunk)
            kind, body = (line[0], line[1:]) if line else (" ", "")
            if kind != "+":
                hunk.old.append(body)
            if kind != "-":
                hunk.new.append(body)
        else:
            raise _bad_line(config, base + index, line)
        index += 1
    op.hunks = [hunk for hunk in op.hunks if hunk.old or hunk.new or hunk.context is not None]
    return index


def _seek(lines: Sequence[str], pattern: Sequence[str], start: int, *, end_of_file: bool) -> int | None:
    size = len(pattern)
    if size == 0:
        return start
    if size > len(lines):
        return None
    for match in _MATCHERS:
        wanted = [match(line) for line in pattern]
        if end_of_file:
            at = len(lines) - size
            if at >= start and [match(line) for line in lines[at:]] == wanted:
                return at
        for at in range(start, len(lines) - size + 1):
            if match(lines[at]) == wanted[0] and [match(line) for line in lines[at : at + size]] == wanted:
                return at
    return None


def _invalid(config: ContextConfig, detail: str) -> ToolError:
    return ToolError(config.error("patch_invalid", detail=detail))


def _bad_line(config: ContextConfig, index: int, line: str) -> ToolError:
    return _invalid(config, config.error("patch_bad_line", line=index + 1, text=line))


def _missing(config: ContextConfig, number: int, path: str) -> ToolError:
    return _invalid(config, config.error("patch_hunk_missing", hunk=number, path=shown(path)))
