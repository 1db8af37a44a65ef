"""A call's arguments checked once against its tool's schema (:mod:`chat.tools.schemas`): the type each must
have, whether it is required, its least and greatest value, its default, and the error when it is wrong."""

from __future__ import annotations

from collections.abc import Mapping

from sessions_app.hygiene.config import ContextConfig
from sessions_app.hygiene.ids import parse_id

from .context import ToolContext
from .errors import ToolError
from .schemas import Parameter, SchemaValues, tool_schema

_TRUE = frozenset({"true", "yes", "1"})
_FALSE = frozenset({"false", "no", "0"})
_EXPECTED = {"string": "expected_text", "boolean": "expected_flag"}

Value = str | int | bool | None | list["Arguments"]


class Arguments:
    """The checked arguments of one call of ``tool``: every parameter of its schema, given or defaulted."""

    def __init__(self, tool: str, values: dict[str, Value]) -> None:
        self.tool = tool
        self.values = values

    def text(self, name: str) -> str:
        value = self.values[name]
        if not isinstance(value, str):
            raise TypeError(f"{self.tool}.{name} is no string parameter")
        return value

    def optional_text(self, name: str) -> str | None:
        value = self.values[name]
        return None if value is None else self.text(name)

    def number(self, name: str) -> int:
        value = self.values[name]
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{self.tool}.{name} is no integer parameter")
        return value

    def flag(self, name: str) -> bool:
        value = self.values[name]
        if not isinstance(value, bool):
            raise TypeError(f"{self.tool}.{name} is no boolean parameter")
        return value

    def items(self, name: str) -> list[Arguments]:
        value = self.values[name]
        if not isinstance(value, list):
            raise TypeError(f"{self.tool}.{name} is no array parameter")
        return value


def context_values(ctx: ToolContext) -> SchemaValues:
    """The numbers the schemas name, as a call in ``ctx`` has them."""
    config = ctx.config
    return SchemaValues(config.read_window, config.recall_window, ctx.run_timeout, ctx.run_max_timeout)


def checked(args: Mapping[str, object], tool: str, ctx: ToolContext) -> Arguments:
    """``args`` checked against the schema of ``tool``, in the schema's order; a ``None`` value counts as not
    given. The first wrong one raises :class:`ToolError` with its ``loop.json`` error text."""
    schema = tool_schema(ctx.config.tools, tool, context_values(ctx))
    return Arguments(tool, {p.name: _value(args.get(p.name), p, tool, ctx.config) for p in schema.parameters})


def _value(value: object, parameter: Parameter, tool: str, config: ContextConfig) -> Value:
    name = parameter.name
    if value is None:
        if parameter.required:
            raise ToolError(config.error("missing_argument", tool=tool, name=name))
        if parameter.type != "integer" or parameter.default is None:
            return parameter.default
        value = parameter.default  # checked and bounded as a given one is
    if parameter.type == "integer":
        number = whole_number(value)
        minimum = parameter.minimum if parameter.minimum is not None else 0
        if number is None or number < minimum:
            raise ToolError(config.error("bad_number", name=name, minimum=minimum, value=value))
        return number if parameter.most is None else min(number, parameter.most)
    target: Value
    if parameter.format == "result_id":
        target = _result_id(value)
    elif parameter.type == "string":
        target = value if isinstance(value, str) else None
    elif parameter.type == "boolean":
        target = _flag(value)
    else:
        target = _items(value, parameter, tool, config)
    if target is None:
        expected = config.errors[parameter.expected or _EXPECTED[parameter.type]]
        raise ToolError(config.error("bad_argument", name=name, tool=tool, expected=expected))
    return target


def _result_id(value: object) -> int | None:
    """A result's id as hex digits, with or without ``#``; a JSON number is read as the digits it is written with
    (``12`` is ``#0012``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return parse_id(str(value)) if value >= 0 else None
    if isinstance(value, str):
        return parse_id(value)
    return None


def _flag(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return None


def _items(value: object, parameter: Parameter, tool: str, config: ContextConfig) -> list[Arguments] | None:
    """An array of objects, each checked against ``items``: a required field that is missing or wrong makes the
    whole array wrong; an optional one is named in its own error."""
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        return None
    checked = []
    for item in value:
        values: dict[str, Value] = {}
        for field in parameter.items:
            try:
                values[field.name] = _value(item.get(field.name), field, tool, config)
            except ToolError:
                if field.required:
                    return None
                raise
        checked.append(Arguments(tool, values))
    return checked


def whole_number(value: object) -> int | None:
    """``value`` as an int when it is one (a bool is not); ``3.0`` and ``"3"`` are taken as 3, else ``None``."""
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
