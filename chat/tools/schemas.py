"""The tools' schemas, read from ``loop.json`` ``context.tools``: one table for what the model is offered (the OpenAI
``tools`` format) and for what a call's arguments are checked against (:mod:`chat.tools.args`).

A parameter there has a ``type`` (``string``, ``integer``, ``boolean``, ``array``) and may have a
``description`` (offered only where the name and the tool's description leave something unsaid), ``required``,
``default``, ``minimum`` and ``most`` (an integer above it is taken as it), ``format`` (``result_id``: a
result's id, as hex or a number), ``expected`` (the ``context.errors`` text naming the wanted type) and, for an
array of objects, ``items``. Texts, defaults and ``most`` may name the numbers of :class:`SchemaValues`
(``{read_window}``); a description may also name its parameter's ``{default}`` and
``{most}``. Only names, types, descriptions and what is required are offered to the model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast

ParameterType = Literal["string", "integer", "boolean", "array"]
Default = str | int | bool | None
_TYPES: tuple[ParameterType, ...] = ("string", "integer", "boolean", "array")


@dataclass(frozen=True)
class SchemaValues:
    """The numbers the tools' texts and limits name: the read and recall windows (``loop.json`` ``context``) and
    ``run``'s default and longest timeout (``loop``)."""

    read_window: int
    recall_window: int
    run_timeout: int
    run_max_timeout: int


@dataclass(frozen=True)
class Parameter:
    """One argument of a tool, its texts formatted and its numbers resolved."""

    name: str
    type: ParameterType
    description: str
    required: bool = False
    default: Default = None
    minimum: int | None = None
    most: int | None = None
    format: str | None = None
    expected: str | None = None
    items: tuple[Parameter, ...] = ()

    def offered(self) -> dict[str, Any]:
        offered: dict[str, Any] = {"type": self.type}
        if self.description:
            offered["description"] = self.description
        if self.items:
            offered["items"] = {"type": "object", **_properties(self.items)}
        return offered


@dataclass(frozen=True)
class ToolSchema:
    """A tool as the model is offered it and as its arguments are checked."""

    name: str
    description: str
    parameters: tuple[Parameter, ...]

    def offered(self) -> dict[str, Any]:
        """The tool in the OpenAI ``tools`` format."""
        parameters = {"type": "object", **_properties(self.parameters)}
        function = {"name": self.name, "description": self.description, "parameters": parameters}
        return {"type": "function", "function": function}


def _properties(parameters: tuple[Parameter, ...]) -> dict[str, Any]:
    return {
        "properties": {parameter.name: parameter.offered() for parameter in parameters},
        "required": [parameter.name for parameter in parameters if parameter.required],
    }


def tool_schemas(section: Mapping[str, Any], values: SchemaValues) -> dict[str, ToolSchema]:
    """Every tool of ``loop.json`` ``context.tools`` (``section``), its numbers those of ``values``."""
    return {name: tool_schema(section, name, values) for name in section}


def tool_schema(section: Mapping[str, Any], name: str, values: SchemaValues) -> ToolSchema:
    """The tool ``name`` of ``loop.json`` ``context.tools`` (``section``), its numbers those of ``values``."""
    tool = section[name]
    named = asdict(values)
    return ToolSchema(
        name=name,
        description=str(tool["description"]).format(**named),
        parameters=_parameters(tool["parameters"], named, f"context.tools.{name}"),
    )


def _parameters(table: Mapping[str, Any], named: dict[str, int], where: str) -> tuple[Parameter, ...]:
    return tuple(_parameter(name, spec, named, f"{where}.{name}") for name, spec in table.items())


def _parameter(name: str, spec: Mapping[str, Any], named: dict[str, int], where: str) -> Parameter:
    kind = spec["type"]
    if kind not in _TYPES:
        raise ValueError(f"loop.json {where}: the type {kind!r} is none of {', '.join(_TYPES)}")
    default = _resolved(spec.get("default"), kind, named)
    most = _resolved(spec.get("most"), kind, named)
    minimum = spec.get("minimum")
    if kind == "integer" and not isinstance(minimum, int):
        raise ValueError(f"loop.json {where}: an integer needs a whole minimum")
    shown = {"default": json.dumps(default), "most": json.dumps(most)}
    return Parameter(
        name=name,
        type=cast(ParameterType, kind),
        description=str(spec.get("description", "")).format(**named, **shown),
        required=bool(spec.get("required", False)),
        default=default,
        minimum=minimum,
        most=most if isinstance(most, int) and not isinstance(most, bool) else None,
        format=spec.get("format"),
        expected=spec.get("expected"),
        items=_parameters(spec.get("items", {}), named, where),
    )


def _resolved(value: object, kind: str, named: dict[str, int]) -> Default:
    """A default or bound as given, or the number a ``{name}`` text names for an integer."""
    if isinstance(value, str) and kind == "integer":
        return int(value.format(**named))
    return cast(Default, value)
