"""``list``: the entries of one folder, one absolute path a line, folders ending in ``/``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sessions_app.hygiene.outcomes import ListingOutcome, Outcome

from .args import checked
from .context import ToolContext
from .errors import shown
from .paths import Root
from .walk import entries, shows_as_folder


def list_(args: Mapping[str, object], ctx: ToolContext) -> Outcome:
    """The entries of a folder, sorted. A symlink is shown by its own path, as a folder only when it
    leads to a folder inside the workspace."""
    call = checked(args, "list", ctx)
    with Root(ctx) as root:
        folder = root.resolve(call.text("path"))
        listed = entries(root.require_folder(folder), folder.path)
        lines = sorted(shown(entry.path) + ("/" if shows_as_folder(root, entry) else "") for entry in listed)
    return ListingOutcome("\n".join(lines) if lines else ctx.config.text("no_matches"))


def require_folder(path: Path, ctx: ToolContext) -> str:
    """``path`` as a string when it is a folder of the workspace; else the error naming it."""
    with Root(ctx) as root:
        folder = root.resolve(str(path))
        root.require_folder(folder)
        return folder.path
