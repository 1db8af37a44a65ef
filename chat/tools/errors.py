"""The one exception tools raise, and how a name is shown in their one-line texts."""

from __future__ import annotations

import os


class ToolError(Exception):
    """A refusal or an error; ``message`` is the one line the model is answered."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def printable(text: str) -> str:
    """``text`` as valid UTF-8 text: undecodable bytes of a file name or a file become U+FFFD."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def shown(path: str | os.PathLike[str]) -> str:
    """A path as one line of valid text: line breaks escaped, undecodable bytes replaced."""
    return one_line(printable(os.fspath(path)))


def one_line(text: str) -> str:
    """``text`` with its line breaks escaped, so that it stays on one line."""
    return text.replace("\r", "\\r").replace("\n", "\\n")
