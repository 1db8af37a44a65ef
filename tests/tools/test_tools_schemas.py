"""The tool schemas come from loop.json, and the arguments of a call are checked against those same schemas: the
numbers of the texts and the limits of the checks are one, and the default tool list keeps its bytes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chat.tools import TOOLS, ToolContext, ToolError, call_tool, read, recall, run, tool_list
from chat.tools.args import checked
from chat.tools.schemas import SchemaValues, tool_schemas
from sessions_app import prompts
from sessions_app.hygiene.outcomes import ErrorOutcome, ReadOutcome, RecallOutcome

# The default tool list is frozen per session and shared by every session for the prompt cache: a change of its
# bytes must be meant. Change these two only with the texts of loop.json context.tools you meant to change.
OFFERED_SHA256 = "4904917db5914495d95dcf825416d2291f399886cd4024b7bb93be6919421af2"
OFFERED_BYTES = 3800


def test_the_default_tool_list_keeps_its_bytes() -> None:
    offered = json.dumps(tool_list(allow_commands=True)).encode()
    assert (hashlib.sha256(offered).hexdigest(), len(offered)) == (OFFERED_SHA256, OFFERED_BYTES)


def test_every_tool_has_one_schema_in_loop_json() -> None:
    assert list(prompts.rules_config().tools) == [tool.name for tool in TOOLS]


def function(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(tool["function"] for tool in tools if tool["function"]["name"] == name)
    return found


def test_a_window_changed_in_a_config_override_changes_the_text_and_the_check(
    ws: Path, make_ctx: Callable[..., ToolContext]
) -> None:
    config = prompts.rules_config({"read": {"window": 5}, "recall": {"window": 7}})
    tools = tool_list(allow_commands=False, config=config)
    described = function(tools, "read")
    assert "up to 5 lines from offset" in described["description"]
    assert "up to 7 lines from offset" in function(tools, "recall")["description"]
    assert "2000" not in json.dumps(tools)
    (ws / "big.txt").write_text("".join(f"{number}\n" for number in range(1, 101)))
    ctx = make_ctx(config=config, recall=lambda number: "stored")
    for given in ({"path": "big.txt"}, {"path": "big.txt", "limit": 90}):
        outcome = read(given, ctx)
        assert isinstance(outcome, ReadOutcome) and (outcome.limit, outcome.last_line) == (5, 5)
    assert recall({"id": "#0001", "limit": 90}, ctx) == RecallOutcome(1, "stored", 1, 7)
    assert recall({"id": "#0001"}, ctx) == RecallOutcome(1, "stored", 1, 7)


def test_the_run_timeouts_of_the_loop_settings_are_the_texts_and_the_check(
    make_ctx: Callable[..., ToolContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = replace(prompts.loop_settings(), run_timeout=30, run_max_timeout=90)
    monkeypatch.setattr(prompts, "loop_settings", lambda: loop)
    timeout = function(tool_list(allow_commands=True), "run")["parameters"]["properties"]["timeout"]
    assert timeout["description"] == "Seconds; default 30, most 90."
    ctx = make_ctx(run_timeout=30, run_max_timeout=90)
    assert checked({"command": "true"}, "run", ctx).number("timeout") == 30
    assert checked({"command": "true", "timeout": 500}, "run", ctx).number("timeout") == 90
    with pytest.raises(ToolError, match="timeout must be a whole number of at least 1, not 0"):
        run({"command": "true", "timeout": 0}, ctx)


def test_what_is_required_and_each_type_is_checked_as_the_schema_says(ctx: ToolContext) -> None:
    """For every tool: leaving out its first required argument, or giving any argument a value of no type it
    takes, is refused with loop.json's error for that argument."""
    config = ctx.config
    values = SchemaValues(config.read_window, config.recall_window, ctx.run_timeout, ctx.run_max_timeout)
    for name, schema in tool_schemas(config.tools, values).items():
        required = [parameter for parameter in schema.parameters if parameter.required]
        if required:
            missing = config.error("missing_argument", tool=name, name=required[0].name)
            assert call_tool(name, "{}", ctx)[1] == ErrorOutcome(missing), name
        fine = {"string": "x", "array": [], "result_id": "#0001"}
        given = {parameter.name: fine[parameter.format or parameter.type] for parameter in required}
        for parameter in schema.parameters:
            wrong: object = {"string": 7, "integer": 0, "boolean": "sometimes", "array": "x"}[parameter.type]
            if parameter.format == "result_id":
                wrong = True  # an id may come as a number: 12 is #0012
            if parameter.type == "integer":
                assert parameter.minimum == 1
                expected = config.error("bad_number", name=parameter.name, minimum=1, value=0)
            else:
                wanted = parameter.expected or {"string": "expected_text", "boolean": "expected_flag"}[parameter.type]
                expected = config.error("bad_argument", name=parameter.name, tool=name, expected=config.errors[wanted])
            outcome = call_tool(name, json.dumps({**given, parameter.name: wrong}), ctx)[1]
            assert outcome == ErrorOutcome(expected), (name, parameter.name)


def test_only_names_types_descriptions_and_what_is_required_are_offered() -> None:
    for tool in tool_list(allow_commands=True):
        parameters = tool["function"]["parameters"]
        for parameter in parameters["properties"].values():
            assert set(parameter) <= {"type", "description", "items"}
            assert "{" not in parameter.get("description", "")
        assert list(parameters) == ["type", "properties", "required"]
    glob = function(tool_list(allow_commands=False), "glob")
    assert "'{a,b}' either" in glob["description"]
