"""A scripted MCP server for conformance cases, as the cases' model is scripted: the tools a case declares, each
answering its ``answer`` text with the call's arguments put in (``notes on {term}``). It speaks MCP (JSON-RPC, a
message a line) on its standard input and output with Python's standard library alone, so it runs in a workspace's
sandbox on the system's ``python3``, the way a team's own command servers run:

    python3 -I mcp_scripted.py SPEC.json

``SPEC.json``: ``{"name": …, "instructions": …, "tools": [{"name", "description", "read_only", "answer"}]}``.
Nothing of Cachet is imported: the runner copies this file beside the spec, outside the case's workspace.
"""

from __future__ import annotations

import json
import sys
from typing import Any

PROTOCOL = "2025-06-18"


def _answer(spec: dict[str, Any], message: dict[str, Any]) -> dict[str, Any] | None:
    method, ident, params = message.get("method"), message.get("id"), message.get("params") or {}
    if ident is None:  # a notification: nothing to answer
        return None
    if method == "initialize":
        result: dict[str, Any] = {
            "protocolVersion": params.get("protocolVersion", PROTOCOL),
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": spec.get("name", "scripted"), "version": "1"},
        }
        if spec.get("instructions"):
            result["instructions"] = spec["instructions"]
    elif method == "tools/list":
        result = {"tools": [_listed(tool) for tool in spec.get("tools", [])]}
    elif method == "tools/call":
        result = _called(spec, str(params.get("name", "")), params.get("arguments") or {})
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"Method not found: {method}"}}
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def _listed(tool: dict[str, Any]) -> dict[str, Any]:
    listed: dict[str, Any] = {
        "name": tool["name"],
        "description": tool.get("description", ""),
        "inputSchema": tool.get("input_schema", {"type": "object"}),
    }
    if tool.get("read_only"):
        listed["annotations"] = {"readOnlyHint": True}
    return listed


def _called(spec: dict[str, Any], name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    tool = next((tool for tool in spec.get("tools", []) if tool["name"] == name), None)
    if tool is None:
        return {"content": [{"type": "text", "text": f"Unknown tool: {name}"}], "isError": True}
    try:
        text = str(tool.get("answer", "")).format(**arguments)
    except (KeyError, IndexError, ValueError) as error:
        return {"content": [{"type": "text", "text": f"Bad arguments: {error}"}], "isError": True}
    return {"content": [{"type": "text", "text": text}], "isError": bool(tool.get("error", False))}


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as handle:
        spec = json.load(handle)
    for line in sys.stdin:
        if not line.strip():
            continue
        answer = _answer(spec, json.loads(line))
        if answer is not None:
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
