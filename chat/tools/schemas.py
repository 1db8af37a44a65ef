"""The JSON schemas the model is offered, one per tool, in the OpenAI ``tools`` format."""

from __future__ import annotations

from typing import Any

_PATH = "File path, relative to the workspace folder (or absolute inside it)."
_FOLDER = "Folder path, relative to the workspace folder. Default: the workspace folder itself."

PATCH_DESCRIPTION = """Change one or more files with a patch. Format:
*** Begin Patch
*** Update File: src/app.py
@@ def greet():
-    print("Hi")
+    print("Hello")
*** Add File: docs/new.md
+first line of the new file
*** Delete File: old.txt
*** End Patch
In an update, lines start with " " (unchanged context), "-" (remove) or "+" (add); give about 3 lines \
of context around each change, copied exactly. "@@ text" names a line above the change to find \
first. "*** Move to: NEW_PATH" after "*** Update File:" renames the file. Nothing changes if any \
part fails."""


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _integer(description: str) -> dict[str, Any]:
    return {"type": "integer", "description": description}


def _boolean(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


SCHEMAS: dict[str, dict[str, Any]] = {
    "read": _function(
        "read",
        "Read a text file. Lines come as 'N: text'. Shows up to 2000 lines from offset; "
        "the answer's first line says which lines of how many. Use offset to read further.",
        {
            "path": _string(_PATH),
            "offset": _integer("First line to show, counting from 1. Default 1."),
            "limit": _integer("How many lines to show. Default and most: 2000."),
        },
        ["path"],
    ),
    "list": _function(
        "list",
        "List a folder: one absolute path a line, folders end with '/'.",
        {"path": _string(_FOLDER)},
        [],
    ),
    "glob": _function(
        "glob",
        "Find files by name pattern. '*' matches within a name, '**' any number of folders, "
        "'{a,b}' either. Example: '**/*.py' finds Python files at any depth. One absolute path a line.",
        {"pattern": _string("Glob pattern, relative to path."), "path": _string(_FOLDER)},
        ["pattern"],
    ),
    "grep": _function(
        "grep",
        "Search file contents with ripgrep. One match a line: 'PATH:LINE: text', sorted by path then line. "
        "Files that .gitignore ignores, hidden files, binary files and symlinks are skipped.",
        {
            "pattern": _string("Rust regular expression (ripgrep syntax: no look-around, no backreferences)."),
            "path": _string("Folder to search below, or one file. Default: the workspace folder."),
            "glob": _string(
                "Only search files matching this glob, relative to path: '*.py' matches names at any depth, "
                "'src/**/*.ts' a path; a leading '!' excludes."
            ),
            "ignore_case": _boolean("Match upper and lower case alike. Default false."),
        },
        ["pattern"],
    ),
    "recall": _function(
        "recall",
        "Show an earlier tool result again, in full, by its id (the '#0012' at the start of a result).",
        {
            "id": _string("The result's id, e.g. '#0012'."),
            "offset": _integer("First line to show, counting from 1. Default 1."),
            "limit": _integer("How many lines to show. Default and most: 2000."),
        },
        ["id"],
    ),
    "edit": _function(
        "edit",
        "Replace text in a file. old_string must match the file exactly (copy it from a read, "
        "without the 'N: ' prefixes) and occur once, unless replace_all is true. "
        "Answers the diff.",
        {
            "path": _string(_PATH),
            "old_string": _string("The exact text to replace, with enough lines around it to be unique."),
            "new_string": _string("The text to put in its place."),
            "replace_all": _boolean("Replace every occurrence. Default false."),
        },
        ["path", "old_string", "new_string"],
    ),
    "multiedit": _function(
        "multiedit",
        "Make several replacements in one file, in order; each works like edit on the result of the "
        "one before. All are made or none.",
        {
            "path": _string(_PATH),
            "edits": {
                "type": "array",
                "description": "The replacements, in order.",
                "items": {
                    "type": "object",
                    "properties": {
                        "old_string": _string("The exact text to replace."),
                        "new_string": _string("The text to put in its place."),
                        "replace_all": _boolean("Replace every occurrence. Default false."),
                    },
                    "required": ["old_string", "new_string"],
                },
            },
        },
        ["path", "edits"],
    ),
    "write": _function(
        "write",
        "Write a whole file: creates it (and its folders) or replaces all its content.",
        {"path": _string(_PATH), "content": _string("The file's complete new content.")},
        ["path", "content"],
    ),
    "apply_patch": _function(
        "apply_patch",
        PATCH_DESCRIPTION,
        {"patch": _string("The patch, from '*** Begin Patch' to '*** End Patch'.")},
        ["patch"],
    ),
    "run": _function(
        "run",
        "Run a shell command (/bin/sh) in a sandbox that holds only the workspace folder (the current "
        "folder and HOME, read-write), a fresh /tmp and the system's programs (read-only); nothing else of "
        "the server is there. Whether it can reach the network is the workspace's setting. Answers its output "
        "and errors, then '[exit N]' if it failed. No input can be typed; it is stopped, with all it started, "
        "after timeout seconds.",
        {
            "command": _string("The command line, e.g. 'python -m pytest -q'."),
            "timeout": _integer("Seconds before it is stopped. Default 120, most 3600."),
        },
        ["command"],
    ),
}
