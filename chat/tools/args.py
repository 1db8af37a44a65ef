"""Reading a call's arguments: the type each must have, its default, and the error when it has not."""

from __future__ import annotations

from collections.abc import Mapping

from sessions_app.hygiene.config import ContextConfig

from .errors import ToolError

_TRUE = frozenset({"true", "yes", "1"})
_FALSE = frozenset({"false", "no", "0"})


class Args:
    """The arguments of one call of ``tool``; a ``None`` value counts as not given."""

    def __init__(self, values: Mapping[str, object], tool: str, config: ContextConfig) -> None:
        self.values = values
        self.tool = tool
        self.config = config

    def text(self, name: str, default: str | None = None) -> str:
        """A string argument; required when ``default`` is ``None``."""
        value = self.values.get(name)
        if value is None:
            if default is None:
                raise ToolError(self.config.error("missing_argument", tool=self.tool, name=name))
            return default
        if not isinstance(value, str):
            raise self.wrong_type(name, "expected_text")
        return value

    def optional_text(self, name: str) -> str | None:
        """A string argument that may be left out."""
        if self.values.get(name) is None:
            return None
        return self.text(name)

    def number(self, name: str, default: int, minimum: int) -> int:
        """A whole number of at least ``minimum``; ``3.0`` and ``"3"`` are taken as 3."""
        value = self.values.get(name)
        if value is None:
            return default
        number = whole_number(value)
        if number is None or number < minimum:
            raise ToolError(self.config.error("bad_number", name=name, minimum=minimum, value=value))
        return number

    def flag(self, name: str, default: bool) -> bool:
        """A boolean; the strings ``"true"`` and ``"false"`` are taken too."""
        value = self.values.get(name)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise self.wrong_type(name, "expected_flag")

    def wrong_type(self, name: str, expected_key: str) -> ToolError:
        """The error for an argument of the wrong type; ``expected_key`` names the wanted one in errors."""
        expected = self.config.errors[expected_key]
        return ToolError(self.config.error("bad_argument", name=name, tool=self.tool, expected=expected))


def whole_number(value: object) -> int | None:
    """``value`` as an int when it is one (a bool is not), else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        stripped = value.strip()
        digits = stripped.removeprefix("-")
        if digits.isdecimal() and digits.isascii():
            return int(stripped)
    return None
