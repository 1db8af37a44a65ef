from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chat.tools import TOOLS, ToolContext, call_tool, listed_names, only_reads, recall, tool_list
from sessions_app.hygiene.outcomes import (
    EditOutcome,
    ErrorOutcome,
    ListingOutcome,
    OutputOutcome,
    ReadOutcome,
    RecallOutcome,
)

ALL = ["read", "list", "glob", "grep", "recall", "edit", "multiedit", "write", "apply_patch", "run"]


def test_tool_list_order_and_shape() -> None:
    with_run = tool_list(allow_commands=True)
    assert [tool["function"]["name"] for tool in with_run] == ALL
    assert [tool["function"]["name"] for tool in tool_list(allow_commands=False)] == ALL[:-1]
    for tool in with_run:
        assert tool["type"] == "function"
        function = tool["function"]
        assert set(function) == {"name", "description", "parameters"}
        assert function["description"].strip()
        parameters = function["parameters"]
        assert parameters["type"] == "object"
        assert set(parameters["required"]) <= set(parameters["properties"])
        for schema in parameters["properties"].values():
            assert schema["type"] in {"string", "integer", "boolean", "array"}
    assert json.dumps(with_run, sort_keys=True) == json.dumps(tool_list(allow_commands=True), sort_keys=True)
    with_run[0]["function"]["name"] = "changed"
    assert tool_list(allow_commands=True)[0]["function"]["name"] == "read"


def test_call_tool_parses_and_runs(ws: Path, ctx: ToolContext) -> None:
    (ws / "a.txt").write_text("hello\n")
    arguments, outcome = call_tool("read", '{"path": "a.txt"}', ctx)
    assert arguments == {"path": "a.txt"}
    assert isinstance(outcome, ReadOutcome)
    arguments, outcome = call_tool("list", "", ctx)
    assert arguments == {}
    assert outcome == ListingOutcome(f"{ws}/a.txt")


def test_bad_json_and_not_an_object(ctx: ToolContext) -> None:
    assert call_tool("read", "{path: a}", ctx) == (
        "{path: a}",
        ErrorOutcome(
            "The arguments of read are not valid JSON: Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)"
        ),
    )
    assert call_tool("read", '["a.txt"]', ctx) == (
        ["a.txt"],
        ErrorOutcome("The arguments of read must be a JSON object."),
    )


def test_unknown_tool(make_ctx: Callable[..., ToolContext]) -> None:
    assert call_tool("search", "{}", make_ctx())[1] == ErrorOutcome(
        "There is no tool named search. The tools are: read, list, glob, grep, recall, edit, multiedit, write, "
        "apply_patch, run."
    )
    without_run = make_ctx(tools=tuple(ALL[:-1]))
    assert call_tool("run", '{"command": "true"}', without_run)[1] == ErrorOutcome(
        "There is no tool named run. The tools are: read, list, glob, grep, recall, edit, multiedit, write, "
        "apply_patch."
    )


def test_the_session_list_decides_what_is_known_not_what_the_workspace_allows_now(
    ws: Path, make_ctx: Callable[..., ToolContext]
) -> None:
    switched_off = make_ctx(allow_commands=False)
    for mode in ("plan", "edit", "full"):
        assert call_tool("run", '{"command": "touch ran"}', replace(switched_off, mode=mode))[1] == ErrorOutcome(
            "run is not available: commands are switched off for this workspace now. Say which command you "
            "would run, so the person can run it."
        )
    assert not (ws / "ran").exists()
    allowed_later = make_ctx(tools=tuple(ALL[:-1]), allow_commands=True)
    outcome = call_tool("run", '{"command": "touch ran"}', allowed_later)[1]
    assert isinstance(outcome, ErrorOutcome) and outcome.message.startswith("There is no tool named run.")
    assert not (ws / "ran").exists()
    assert listed_names(tool_list(allow_commands=True)) == tuple(ALL)


@pytest.mark.parametrize(
    ("mode", "allowed"),
    [
        ("plan", {"read", "list", "glob", "grep", "recall"}),
        ("edit", {"read", "list", "glob", "grep", "recall", "edit", "multiedit", "write", "apply_patch"}),
        ("full", set(ALL)),
    ],
)
def test_mode_gating(
    ws: Path, make_ctx: Callable[..., ToolContext], config: object, mode: str, allowed: set[str]
) -> None:
    ctx = make_ctx(mode=mode)
    for name in ALL:
        raw = "not json at all"
        _, outcome = call_tool(name, raw, ctx)
        assert isinstance(outcome, ErrorOutcome)
        if name in allowed:
            assert outcome.message.startswith(f"The arguments of {name} are not valid JSON")
        else:
            assert outcome.message == ctx.config.unavailable[name].format(mode=mode)
    assert call_tool("write", '{"path": "w.txt", "content": "x"}', make_ctx(mode="plan"))[1] == ErrorOutcome(
        "write is not available in plan mode: files are read-only now. Say what you would change, "
        "or ask the person to switch to edit mode."
    )
    assert call_tool("run", '{"command": "true"}', make_ctx(mode="edit"))[1] == ErrorOutcome(
        "run is not available in edit mode: commands need full mode. Say which command you would run, "
        "or ask the person to switch to full mode."
    )
    assert not (ws / "w.txt").exists()
    assert isinstance(call_tool("run", '{"command": "echo ok"}', make_ctx(mode="full"))[1], OutputOutcome)
    assert isinstance(call_tool("write", '{"path": "w.txt", "content": "x"}', make_ctx(mode="edit"))[1], EditOutcome)


def test_errors_become_one_line_outcomes(ws: Path, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    _, outcome = call_tool("read", json.dumps({"path": "two\nlines.txt"}), ctx)
    assert outcome == ErrorOutcome(f"No such file or folder: {ws}/two\\nlines.txt")
    _, outcome = call_tool("grep", json.dumps({"pattern": "a\n("}), ctx)
    assert isinstance(outcome, ErrorOutcome)
    assert "\n" not in outcome.message
    (ws / "locked.txt").write_text("x")
    paths = importlib.import_module("chat.tools.paths")
    real_open = os.open

    def refuse(path: str, flags: int, *args: Any, **kwargs: Any) -> int:
        if path == "locked.txt":
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(paths.os, "open", refuse)
    _, outcome = call_tool("read", '{"path": "locked.txt"}', ctx)
    assert outcome == ErrorOutcome(f"Could not use {ws}/locked.txt: Permission denied.")


@pytest.mark.parametrize("given", ["#0012", "0012", "12", "#12", 12, " #0012 "])
def test_recall_ids(make_ctx: Callable[..., ToolContext], given: object) -> None:
    stored = {0x12: "1: stored text"}
    ctx = make_ctx(recall=stored.get)
    assert recall({"id": given}, ctx) == RecallOutcome(0x12, "1: stored text", 1, 2000)


def test_recall_unknown_invalid_and_window(make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(recall=lambda number: None)
    assert call_tool("recall", '{"id": "#ffff", "offset": 5, "limit": 9000}', ctx)[1] == RecallOutcome(
        0xFFFF, None, 5, 2000
    )
    for never_given in ('"#0000"', '"0000"', '"0"', "0"):
        assert call_tool("recall", f'{{"id": {never_given}}}', ctx)[1] == RecallOutcome(0, None, 1, 2000)
    for malformed in ('"#zz"', "-1", "true", "1.5", '""'):
        assert call_tool("recall", f'{{"id": {malformed}}}', ctx)[1] == ErrorOutcome(
            "The argument id of recall must be a result id such as #0012."
        )
    assert call_tool("recall", '{"id": "#zz"}', ctx)[1] == ErrorOutcome(
        "The argument id of recall must be a result id such as #0012."
    )
    assert call_tool("recall", "{}", ctx)[1] == ErrorOutcome("The call to recall lacks the argument id.")


def test_only_the_tools_that_read_are_known_to_change_nothing() -> None:
    assert {tool.name for tool in TOOLS if only_reads(tool.name)} == {"read", "list", "glob", "grep", "recall"}
    assert not any(only_reads(name) for name in ("write", "edit", "multiedit", "apply_patch", "run"))
    assert not only_reads("delete_everything")
