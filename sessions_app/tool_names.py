"""How an MCP server's tool is named in a session's tool list: ``server__tool``."""

from __future__ import annotations

import json

SEPARATOR = "__"
NAME_CHARS = 64  # what OpenAI-compatible servers take as a function's name: [A-Za-z0-9_-]{1,64}
_NAME_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def offered_name(server: str, tool: str) -> str | None:
    """The name ``server``'s ``tool`` is offered as (``server__tool``), ``None`` where no model server would take
    it (over 64 characters, or a character other than letters, digits, ``_`` and ``-``)."""
    name = f"{server}{SEPARATOR}{tool}"
    return name if len(name) <= NAME_CHARS and set(name) <= _NAME_OK else None


def split_name(name: str) -> tuple[str, str] | None:
    """The server and tool an offered name stands for; ``None`` for one of Cachet's own tools."""
    server, separator, tool = name.partition(SEPARATOR)
    return (server, tool) if separator and server and tool else None


def listed_servers(tools_json: str) -> list[str]:
    """The MCP servers whose tools a tool list (as a generation stores it) offers, in its order."""
    names = (str(tool["function"]["name"]) for tool in json.loads(tools_json or "[]"))
    return list(dict.fromkeys(split[0] for name in names if (split := split_name(name))))
