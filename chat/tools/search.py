"""``glob`` and ``grep``: files found below a folder of the workspace, one absolute path or match a line."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sessions_app.hygiene.outcomes import ListingOutcome, Outcome

from .args import Args
from .context import ToolContext
from .errors import ToolError, shown
from .files import SNIFF_BYTES, is_binary
from .globbing import expand_braces, name_regex, segments
from .listing import require_folder
from .paths import is_inside, resolve_in_workspace, workspace_root
from .read import WHOLE_LINE, display_line
from .ripgrep import STDIN_PATH, FileMatches, RgQuery, rg_search
from .walk import entries, is_real_folder, is_workspace_file

_SEARCHED_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def glob(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """The files below ``path`` whose path relative to it matches ``pattern``, sorted."""
    call = Args(args, "glob", ctx.config)
    pattern = call.text("pattern")
    folder = require_folder(resolve_in_workspace(call.text("path", "."), ctx), ctx)
    root = workspace_root(ctx)
    folder, pattern = _anchor(pattern, folder, root, ctx)
    found: set[str] = set()
    for alternative in expand_braces(pattern):
        found |= glob_files(folder, segments(alternative), root)
    lines = sorted(shown(path) for path in found)
    return ListingOutcome("\n".join(lines) if lines else ctx.config.text("no_matches"))


def glob_files(folder: str, parts: list[str], root: str) -> set[str]:
    """The workspace files below ``folder`` matching the pattern ``parts``, walked part by part."""
    found: set[str] = set()
    if not parts:
        return found
    regexes = [None if part == "**" else name_regex(part) for part in parts]
    pending = [(folder, 0)]
    visited: set[tuple[str, int]] = set()
    while pending:
        current, index = pending.pop()
        if (current, index) in visited:
            continue
        visited.add((current, index))
        regex = regexes[index]
        last = index == len(parts) - 1
        if regex is None and not last:
            pending.append((current, index + 1))
        for entry in entries(current):
            if regex is None:
                if is_real_folder(entry):
                    pending.append((entry.path, index))
                elif last and is_workspace_file(entry, root):
                    found.add(entry.path)
            elif regex.fullmatch(entry.name):
                if not last and is_real_folder(entry):
                    pending.append((entry.path, index + 1))
                elif last and is_workspace_file(entry, root):
                    found.add(entry.path)
    return found


def grep(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """Lines matching a Rust regex (ripgrep) in the files at or below ``path``, as ``PATH:LINE: text``,
    sorted by path then line. Files ``.gitignore`` ignores, hidden and binary files are skipped."""
    config = ctx.config
    call = Args(args, "grep", config)
    query = RgQuery(call.text("pattern"), call.flag("ignore_case", False), call.optional_text("glob"))
    given = call.text("path", ".")
    with open_searched(given, ctx) as target:
        if target.is_folder:
            found = rg_search(query, ctx, folder_fd=target.fd)
        elif is_binary(os.pread(target.fd, SNIFF_BYTES, 0)):
            raise ToolError(config.error("binary", path=shown(target.path)))
        else:
            found = rg_search(query, ctx, file_fd=target.fd)
    if not target.is_folder and found.get(STDIN_PATH, FileMatches()).binary:
        raise ToolError(config.error("binary", path=shown(target.path)))
    cut = config.texts["cut"]
    lines: list[str] = []
    by_path = {_absolute(target, name): matches for name, matches in found.items()}
    for path in sorted(by_path):
        shown_path = shown(path)
        lines.extend(
            f"{shown_path}:{number}: {display_line(raw, False, WHOLE_LINE, cut)}"
            for number, raw in sorted(by_path[path].lines)
        )
    return ListingOutcome("\n".join(lines) if lines else config.text("no_matches"))


@dataclass(frozen=True)
class Searched:
    """What ``grep`` searches: the resolved path, open without following a symlink, folder or file."""

    path: Path
    fd: int
    is_folder: bool

    def __enter__(self) -> Searched:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def open_searched(given: str, ctx: ToolContext) -> Searched:
    """``given`` resolved inside the workspace and opened (``O_NOFOLLOW``: a symlink swapped in since the
    resolution is refused, not followed); refused unless it is a folder or a regular file."""
    config = ctx.config
    path = resolve_in_workspace(given, ctx)
    try:
        fd = os.open(path, _SEARCHED_FLAGS)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTDIR):
            raise ToolError(config.error("not_found", path=shown(path))) from None
        if error.errno == errno.ELOOP:
            raise ToolError(config.error("symlink_loop", path=shown(path))) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISDIR(mode) and not stat.S_ISREG(mode):
        os.close(fd)
        raise ToolError(config.error("special_file", path=shown(path)))
    return Searched(path, fd, stat.S_ISDIR(mode))


def _absolute(target: Searched, name: str) -> str:
    """The absolute path of a file rg names relative to the searched folder (or the searched file)."""
    if not target.is_folder:
        return str(target.path)
    return os.path.join(target.path, name.removeprefix("./"))


def _anchor(pattern: str, folder: str, root: str, ctx: ToolContext) -> tuple[str, str]:
    """The folder to walk and the pattern relative to it, for a pattern that is absolute or has ``..``."""
    if not os.path.isabs(pattern) and ".." not in pattern.split("/"):
        return folder, pattern
    normalized = os.path.normpath(os.path.join(folder, pattern))
    if not is_inside(normalized, root):
        raise ToolError(ctx.config.error("outside", path=shown(normalized)))
    base = folder if is_inside(normalized, folder) else root
    return base, os.path.relpath(normalized, base) if normalized != base else "."
