"""``glob`` and ``grep``: files found below a folder of the workspace, one absolute path or match a line."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import BinaryIO

from sessions_app.hygiene.outcomes import ListingOutcome, Outcome

from .args import Args
from .context import ToolContext
from .errors import ToolError, shown
from .files import SNIFF_BYTES, is_binary, open_regular
from .globbing import expand_braces, name_regex, path_regex, segments
from .listing import require_folder
from .paths import Resolved, Root, is_inside, resolve_in_workspace, workspace_root
from .read import WHOLE_LINE, display_line
from .walk import Entry, files_below, is_workspace_file, walk_folders


def glob(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """The files below ``path`` whose path relative to it matches ``pattern``, sorted."""
    call = Args(args, "glob", ctx.config)
    pattern = call.text("pattern")
    found: set[str] = set()
    with Root(ctx) as root:
        folder = root.resolve(call.text("path", "."))
        root.require_folder(folder)
        base, pattern = _anchor(pattern, folder.path, root.path, ctx)
        start = folder if base == folder.path else root.resolve(".")
        for alternative in expand_braces(pattern):
            found |= glob_files(root, start, segments(alternative))
    lines = sorted(shown(path) for path in found)
    return ListingOutcome("\n".join(lines) if lines else ctx.config.text("no_matches"))


def glob_files(root: Root, folder: Resolved, parts: list[str]) -> set[str]:
    """The workspace files below ``folder`` matching the pattern ``parts``, walked part by part through
    descriptors (a folder and a part index are visited once)."""
    found: set[str] = set()
    if not parts or folder.fd is None:
        return found
    regexes = [None if part == "**" else name_regex(part) for part in parts]
    visited = {(folder.path, 0)}

    def visit(path: str, index: int, listed: list[Entry]) -> list[tuple[str | None, int]]:
        regex = regexes[index]
        last = index == len(parts) - 1
        children: list[tuple[str | None, int]] = []

        def enter(name: str | None, next_index: int) -> None:
            key = (path if name is None else os.path.join(path, name), next_index)
            if key not in visited:
                visited.add(key)
                children.append((name, next_index))

        if regex is None and not last:
            enter(None, index + 1)
        for entry in listed:
            if regex is None:
                if entry.kind == "folder":
                    enter(entry.name, index)
                elif last and is_workspace_file(root, entry):
                    found.add(entry.path)
            elif regex.fullmatch(entry.name):
                if not last and entry.kind == "folder":
                    enter(entry.name, index + 1)
                elif last and is_workspace_file(root, entry):
                    found.add(entry.path)
        return children

    walk_folders(folder.fd, folder.path, 0, visit)
    return found


def grep(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """Lines matching a Python regex in the text files at or below ``path``, as ``PATH:LINE: text``."""
    config = ctx.config
    call = Args(args, "grep", config)
    pattern = call.text("pattern")
    given = call.text("path", ".")
    name_filter = call.optional_text("glob")
    ignore_case = call.flag("ignore_case", False)
    try:
        regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except (re.error, OverflowError, RecursionError) as error:
        raise ToolError(config.error("bad_regex", pattern=pattern, detail=error)) from None
    target = resolve_in_workspace(given, ctx)
    if os.path.isfile(target):
        lines = _grep_file(str(target), str(target), regex, ctx)
        if lines is None:
            raise ToolError(config.error("binary", path=shown(target)))
        return ListingOutcome("\n".join(lines) if lines else config.text("no_matches"))
    folder = require_folder(target, ctx)
    files = sorted(files_below(folder, workspace_root(ctx)))
    if name_filter is not None:
        filters = [path_regex(alternative) for alternative in expand_braces(name_filter)]
        files = [path for path in files if _name_matches(path, folder, filters)]
    found: list[str] = []
    for path in files:
        try:
            found.extend(_grep_file(os.path.realpath(path), path, regex, ctx) or [])
        except (ToolError, OSError):
            continue
    return ListingOutcome("\n".join(found) if found else config.text("no_matches"))


def search_file(handle: BinaryIO, path: str, regex: re.Pattern[str], max_chars: int, cut: str) -> list[str]:
    """The matching lines of an open text file, line by line; a line is searched in its first
    ``4 * max_chars`` bytes."""
    shown_path = shown(path)
    max_bytes = max_chars * 4
    matches: list[str] = []
    number = 0
    while True:
        raw = handle.readline(max_bytes)
        if not raw:
            return matches
        number += 1
        truncated = not raw.endswith(b"\n") and len(raw) == max_bytes
        if truncated:
            _skip_rest_of_line(handle, max_bytes)
        line = raw.removesuffix(b"\n")
        if regex.search(line.removesuffix(b"\r").decode("utf-8", "replace")):
            matches.append(f"{shown_path}:{number}: {display_line(line, truncated, max_chars, cut)}")


def _grep_file(real: str, path: str, regex: re.Pattern[str], ctx: ToolContext) -> list[str] | None:
    """The matches in the file at ``real``, named ``path``; ``None`` when it is binary."""
    with open_regular(real, ctx) as handle:
        if is_binary(handle.read(SNIFF_BYTES)):
            return None
        handle.seek(0)
        return search_file(handle, path, regex, WHOLE_LINE, ctx.config.texts["cut"])


def _skip_rest_of_line(handle: BinaryIO, max_bytes: int) -> None:
    while True:
        rest = handle.readline(max_bytes)
        if not rest or rest.endswith(b"\n"):
            return


def _name_matches(path: str, folder: str, filters: list[re.Pattern[str]]) -> bool:
    relative = os.path.relpath(path, folder).replace(os.sep, "/")
    name = os.path.basename(path)
    return any(regex.fullmatch(relative) or regex.fullmatch(name) for regex in filters)


def _anchor(pattern: str, folder: str, root: str, ctx: ToolContext) -> tuple[str, str]:
    """The folder to walk and the pattern relative to it, for a pattern that is absolute or has ``..``."""
    if not os.path.isabs(pattern) and ".." not in pattern.split("/"):
        return folder, pattern
    normalized = os.path.normpath(os.path.join(folder, pattern))
    if not is_inside(normalized, root):
        raise ToolError(ctx.config.error("outside", path=shown(normalized)))
    base = folder if is_inside(normalized, folder) else root
    return base, os.path.relpath(normalized, base) if normalized != base else "."
