"""``glob`` and ``grep``: files found below a folder of the workspace, one absolute path or match a line."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sessions_app.hygiene.outcomes import ListingOutcome, Outcome

from .args import checked
from .context import ToolContext
from .documents import KINDS, document_bytes, document_kind, document_text, file_sha256
from .errors import ToolError, shown
from .files import SNIFF_BYTES, is_binary
from .globbing import expand_braces, name_regex, segments
from .paths import LISTING_FLAGS, Resolved, Root, is_inside, open_file
from .read import WHOLE_LINE, display_line
from .ripgrep import STDIN_PATH, FileMatches, RgQuery, rg_files, rg_search
from .walk import Entry, is_workspace_file, walk_folders


def glob(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """The files below ``path`` whose path relative to it matches ``pattern``, sorted."""
    call = checked(args, "glob", ctx)
    pattern = call.text("pattern")
    found: set[str] = set()
    with Root(ctx) as root:
        folder = root.resolve(call.text("path"))
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
    """Lines matching a Rust regex (ripgrep) in the files at or below ``path``, as ``PATH:LINE: text``,
    sorted by path then line. Files ``.gitignore`` ignores, hidden and binary files are skipped; documents (a
    PDF, …) are searched in their text, as ``read`` shows it."""
    config = ctx.config
    call = checked(args, "grep", ctx)
    query = RgQuery(call.text("pattern"), call.flag("ignore_case"), call.optional_text("glob"))
    given = call.text("path")
    with open_searched(given, ctx) as target:
        head = os.pread(target.fd, SNIFF_BYTES, 0) if not target.is_folder else b""
        kind = None if target.is_folder else document_kind(str(target.path), head)
        if target.is_folder:
            found = rg_search(query, ctx, folder_fd=target.fd, skipped=DOCUMENT_GLOBS)
            found.update(_documents_found(query, target, ctx))
        elif kind is not None:
            found = _document_found(query, target.fd, kind, target.path, ctx)
        elif is_binary(head):
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
            f"{shown_path}:{number}: {display_line(raw, False, WHOLE_LINE, cut, ended=False)}"
            for number, raw in sorted(by_path[path].lines)
        )
    return ListingOutcome("\n".join(lines) if lines else config.text("no_matches"))


DOCUMENT_GLOBS = tuple(f"*{suffix}" for suffix in KINDS)


def _documents_found(query: RgQuery, target: Searched, ctx: ToolContext) -> dict[str, FileMatches]:
    """The matches in the text of the documents below the folder ``target`` that rg would search (those ``glob``
    lets through); a document that cannot be read as text is skipped, as a binary file is."""
    globs = (query.glob,) if query.glob is not None else ()
    names = rg_files(ctx, folder_fd=target.fd, globs=globs, iglobs=() if globs else DOCUMENT_GLOBS)
    found: dict[str, FileMatches] = {}
    for name in names:
        if ctx.cancelled():
            raise ToolError(ctx.config.error("grep_stopped"))
        path = os.path.join(target.path, name.removeprefix("./"))
        if os.path.splitext(name)[1].lower() not in KINDS:
            continue
        try:
            with open_file(ctx, path) as (resolved, handle):
                kind = document_kind(resolved, os.pread(handle.fileno(), SNIFF_BYTES, 0))
                if kind is None:  # named like a document, searched as the file it is
                    matches = rg_search(query, ctx, file_fd=handle.fileno())
                else:
                    matches = _document_found(query, handle.fileno(), kind, Path(resolved), ctx)
        except ToolError:
            if ctx.cancelled():
                raise
            continue
        if STDIN_PATH in matches and not matches[STDIN_PATH].binary:
            found[name] = matches[STDIN_PATH]
    return found


def _document_found(query: RgQuery, fd: int, kind: str, path: Path, ctx: ToolContext) -> dict[str, FileMatches]:
    """rg's matches in the text of the document open as ``fd``, answered as ``<stdin>``."""
    with os.fdopen(os.dup(fd), "rb") as handle:
        data = document_bytes(handle, kind=kind, path=path, ctx=ctx)
    text = document_text(data, kind=kind, sha256=file_sha256(data), path=path, ctx=ctx)
    memory = os.memfd_create("document-text", os.MFD_CLOEXEC)
    try:
        os.write(memory, text.encode("utf-8"))  # a memfd takes the whole write
        os.lseek(memory, 0, os.SEEK_SET)
        return rg_search(query, ctx, file_fd=memory)
    finally:
        os.close(memory)


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
    """``given`` resolved inside the workspace from its descriptor and opened; refused unless it is a
    folder or a regular file."""
    with Root(ctx) as root:
        target = root.resolve(given)
        if target.kind == "folder":
            fd = os.open(".", LISTING_FLAGS, dir_fd=root.require_folder(target))
            return Searched(Path(target.path), fd, True)
        with root.open_file(target) as handle:
            return Searched(Path(target.path), os.dup(handle.fileno()), False)


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
