"""Git as Cachet's own scripts run it (the benchmarks reading Cachet's own repository): with no system or global
configuration, and nothing a repository could name run — hooks, fsmonitor, the pager, an external diff, textconv
and the ssh command switched off. Cachet itself runs no git."""

from __future__ import annotations

import os

GIT_OFF = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.pager=cat",
    "core.sshCommand=false",
    "diff.external=",
    "core.attributesFile=/dev/null",
)


DIFFING = {"diff", "log", "show", "whatchanged", "format-patch"}
_WITH_VALUE = {"-C", "-c", "--git-dir", "--work-tree"}


def git_argv(*args: str) -> list[str]:
    """``git`` with everything it could run switched off, then ``args``; a command that shows diffs gets
    ``--no-ext-diff --no-textconv`` too (a diff driver a repository's attributes name runs otherwise)."""
    switched = [part for setting in GIT_OFF for part in ("-c", setting)]
    given = list(args)
    index = 0
    while index < len(given) and given[index].startswith("-"):
        index += 2 if given[index] in _WITH_VALUE else 1
    if index < len(given) and given[index] in DIFFING:
        given[index + 1 : index + 1] = ["--no-ext-diff", "--no-textconv"]
    return ["git", *switched, *given]


def git_env() -> dict[str, str]:
    """This process's environment with git's system and global configuration and attributes left out."""
    return {
        **os.environ,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PAGER": "cat",
    }
