"""``manage.py conformance``: the project's own case file passes, and the runner keeps its interface
(``../shared/CONFORMANCE.md``): one line per case, ``N passed, M failed`` last, exit 1 on a failure,
exit 2 for a file not in the format."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from chat.conformance import load_cases
from sessions_app.models import ChatSession, Result, Turn, Workspace

CASE_FILE = Path(__file__).resolve().parents[1] / "conformance" / "context.json"
SECTIONS = ("§1", "§2", "§3", "§4", "§5", "§6", "§7", "§9", "§10")
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed$")

pytestmark = pytest.mark.django_db(transaction=True)


def run(*files: Path) -> tuple[int, list[str], str]:
    """Run the command in this process: its exit code, its stdout lines and its stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        call_command("conformance", *[str(path) for path in files], stdout=out, stderr=err)
    except SystemExit as stop:
        code = int(stop.code or 0)
    return code, out.getvalue().splitlines(), err.getvalue()


def write(tmp_path: Path, name: str, cases: list[dict[str, Any]], **top: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"format": 1, "cases": cases, **top}), encoding="utf-8")
    return path


PASSING = {
    "name": "the first message carries the date",
    "spec": "§10",
    "date": "2026-11-29",
    "steps": [
        {
            "user": "hi",
            "expect_contains": [
                "hi\n\n<note>\nWorkspace: ",
                "\n\nDate: 2026-11-29.\n</note>",
            ],
        }
    ],
}
FAILING = {
    "name": "a case that expects the wrong text",
    "spec": "§1",
    "workspace": {"a.txt": "alpha\n"},
    "steps": [
        {"user": "read it"},
        {"tool": "read", "args": {"path": "a.txt"}, "expect": "[#0002 a.txt lines 1-1 of 1 sha 00000000]"},
    ],
}


SHARDS = 4  # the file is played in shards, each in a test of its own, so that pytest-xdist runs them side by side


@pytest.mark.parametrize("shard", range(SHARDS))
def test_the_project_case_file_passes(shard: int, tmp_path: Path) -> None:
    """Every case of the project's file passes, through the command, in its file's order (a shard of it)."""
    every = json.loads(CASE_FILE.read_text(encoding="utf-8"))
    cases = every["cases"][shard::SHARDS]
    code, lines, err = run(write(tmp_path, "shard.json", cases))
    failures = [line for line in lines if line.startswith("FAIL ")]
    assert failures == [], "\n".join(failures)
    match = SUMMARY.match(lines[-1])
    assert match is not None, lines[-1]
    passed, failed = int(match.group(1)), int(match.group(2))
    assert (failed, code, err) == (0, 0, "")
    assert passed == len(cases) and len(every["cases"]) >= 90
    assert lines[:-1] == [f"ok {case['name']}" for case in cases]


def test_the_project_case_file_covers_every_section() -> None:
    cases = load_cases(CASE_FILE)
    named = {section for case in cases for section in re.findall(r"§\d+", str(case.get("spec", "")))}
    assert set(SECTIONS) <= named, sorted(set(SECTIONS) - named)
    assert all(re.fullmatch(r"§\d+", str(case.get("spec"))) for case in cases)


def test_the_project_case_file_is_well_formed() -> None:
    cases = load_cases(CASE_FILE)
    names = [case["name"] for case in cases]
    assert len(names) == len(set(names))
    assert len(cases) >= 90
    text = CASE_FILE.read_text(encoding="utf-8")
    assert json.loads(text)["format"] == 1
    assert text.startswith('{\n  "format": 1,\n  "cases": [\n    {\n      "name": ')


def test_a_failing_case_is_reported_and_exits_1(tmp_path: Path) -> None:
    code, lines, _ = run(write(tmp_path, "fail.json", [FAILING]))
    assert code == 1
    assert lines[-1] == "0 passed, 1 failed"
    assert len(lines) == 2
    assert lines[0].startswith(
        "FAIL a case that expects the wrong text: step 2: expected '[#0002 a.txt lines 1-1 of 1 sha 00000000]'"
        " got '[#0001 a.txt lines 1-1 of 1 sha "
    )


def test_the_run_goes_on_after_a_failure(tmp_path: Path) -> None:
    code, lines, _ = run(write(tmp_path, "mixed.json", [FAILING, PASSING]))
    assert code == 1
    assert lines[0].startswith("FAIL a case that expects the wrong text: step 2: ")
    assert lines[1:] == ["ok the first message carries the date", "1 passed, 1 failed"]


def test_a_case_is_rolled_back(tmp_path: Path) -> None:
    code, lines, _ = run(write(tmp_path, "pass.json", [PASSING, FAILING]))
    assert code == 1
    assert lines[-1] == "1 passed, 1 failed"
    assert (ChatSession.objects.count(), Turn.objects.count(), Result.objects.count()) == (0, 0, 0)
    assert Workspace.objects.count() == 0


def test_cases_pass_where_a_real_workspace_is_named_workspace(tmp_path: Path) -> None:
    real = Workspace.objects.create(name="workspace", folder=str(tmp_path))
    case = {
        "name": "the first note names the case's workspace",
        "spec": "§10",
        "steps": [{"user": "hi", "expect_contains": ['Workspace: "workspace".']}],
    }
    code, lines, _ = run(write(tmp_path, "named.json", [case]))
    assert (code, lines[-1]) == (0, "1 passed, 0 failed")
    assert list(Workspace.objects.values_list("pk", "name")) == [(real.pk, "workspace")], "renamed only in the case"


@pytest.mark.parametrize(
    "content",
    [
        "not json at all",
        json.dumps({"format": 2, "cases": [PASSING]}),
        json.dumps({"format": 1}),
        json.dumps([PASSING]),
        json.dumps({"format": 1, "cases": [{"spec": "§1", "steps": [{"user": "hi"}]}]}),
        json.dumps({"format": 1, "cases": [PASSING, PASSING]}),
        json.dumps({"format": 1, "cases": [{"name": "no steps", "spec": "§1", "steps": []}]}),
        json.dumps({"format": 1, "cases": [{"name": "two", "spec": "§1", "steps": [{"user": "a", "reply": "b"}]}]}),
        json.dumps({"format": 1, "cases": [{"name": "none", "spec": "§1", "steps": [{"expect": "a"}]}]}),
        json.dumps(
            {"format": 1, "cases": [{"name": "typo", "spec": "§1", "steps": [{"user": "a", "expect_ful": "a"}]}]}
        ),
        json.dumps(
            {"format": 1, "cases": [{"name": "str", "spec": "§1", "steps": [{"user": "a", "expect_contains": "a"}]}]}
        ),
        json.dumps(
            {"format": 1, "cases": [{"name": "up", "spec": "§1", "workspace": {"../x": "x"}, "steps": [{"user": "a"}]}]}
        ),
        json.dumps(
            {"format": 1, "cases": [{"name": "odd", "spec": "§1", "workspace": {"x": 3}, "steps": [{"user": "a"}]}]}
        ),
        json.dumps({"format": 1, "cases": [{"name": "w", "spec": "§7", "window": "big", "steps": [{"user": "a"}]}]}),
        json.dumps({"format": 1, "cases": [{"name": "w", "spec": "§7", "window": 0, "steps": [{"user": "a"}]}]}),
    ],
    ids=[
        "not-json",
        "format-2",
        "no-cases",
        "a-list",
        "no-name",
        "name-twice",
        "no-steps",
        "two-actions",
        "no-action",
        "unknown-expectation",
        "contains-not-a-list",
        "workspace-outside",
        "workspace-entry",
        "window-not-a-number",
        "window-zero",
    ],
)
def test_a_file_not_in_the_format_exits_2(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    code, lines, err = run(path)
    assert code == 2
    assert lines == []
    assert str(path) in err


def test_a_compact_step_answers_the_summary_a_reply_asks_for_when_its_window_is_full(tmp_path: Path) -> None:
    """With a small ``window`` the reply compacts while it runs and the compact step answers its summary
    request; with the default window the same steps end the reply first and compact after it."""
    steps: list[dict[str, Any]] = [
        {"user": "one"},
        {"reply": "done"},
        {"user": "read a.txt then b.txt"},
        {"tool": "read", "args": {"path": "a.txt"}},
        {"tool": "read", "args": {"path": "b.txt"}},
        {"compact": "Summary.", "expect_contains": ["| a.txt | 1-600 of 600 |"]},
    ]
    workspace = {"a.txt": {"lines": 600, "line": "alpha {n}"}, "b.txt": {"lines": 300, "line": "omega {n}"}}
    went_on = {"request": True, "expect_roles": ["system", "user", "assistant", "tool"]}  # the reply, from b.txt on
    inside = {"name": "inside", "spec": "§7", "window": 5200, "workspace": workspace, "steps": [*steps, went_on]}
    covered = {"request": True, "expect_roles": ["system"]}  # every turn summarized
    after = {"name": "after", "spec": "§7", "workspace": workspace, "steps": [*steps, covered]}
    code, lines, _ = run(write(tmp_path, "window.json", [inside, after]))
    assert (code, lines) == (0, ["ok inside", "ok after", "2 passed, 0 failed"])


def test_a_missing_file_exits_2(tmp_path: Path) -> None:
    code, lines, err = run(tmp_path / "missing.json")
    assert (code, lines) == (2, [])
    assert "missing.json" in err


def test_a_bad_file_among_good_ones_runs_nothing(tmp_path: Path) -> None:
    good = write(tmp_path, "good.json", [PASSING])
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 1, "cases": 3}', encoding="utf-8")
    code, lines, _ = run(good, bad)
    assert (code, lines) == (2, [])


def test_root_stands_for_the_resolved_workspace_path(tmp_path: Path) -> None:
    cases: list[dict[str, Any]] = [
        {
            "name": "an error names the absolute path",
            "spec": "§1",
            "steps": [
                {
                    "tool": "read",
                    "args": {"path": "nope.txt"},
                    "expect": "[#0001] No such file or folder: {root}/nope.txt",
                }
            ],
        },
        {
            "name": "an absolute path in the arguments",
            "spec": "§1",
            "workspace": {"src/app.ts": "import a\nexport b\n", "link.ts": {"symlink": "{root}/src/app.ts"}},
            "steps": [
                {
                    "tool": "read",
                    "args": {"path": "{root}/src/app.ts"},
                    "expect": "[#0001 {root}/src/app.ts lines 1-2 of 2 sha bb8bfa5c]\n1: import a\n2: export b",
                },
                {
                    "tool": "read",
                    "args": {"path": "link.ts"},
                    "expect": "[#0002 link.ts lines 1-2 of 2 sha bb8bfa5c]\n"
                    "Unchanged since #0001, which already shows lines 1-2.",
                },
                {"change": {"path": "{root}/src/app.ts", "content": "x\n"}},
                {"tool": "list", "args": {"path": "src"}, "expect_contains": ["{root}/src/app.ts"]},
            ],
        },
    ]
    code, lines, _ = run(write(tmp_path, "root.json", cases))
    assert lines == [
        "ok an error names the absolute path",
        "ok an absolute path in the arguments",
        "2 passed, 0 failed",
    ]
    assert code == 0


def test_root_is_not_some_other_path(tmp_path: Path) -> None:
    case = {
        "name": "a wrong absolute path fails",
        "spec": "§1",
        "steps": [
            {"tool": "read", "args": {"path": "nope.txt"}, "expect": "[#0001] No such file or folder: /nope.txt"}
        ],
    }
    code, lines, _ = run(write(tmp_path, "wrong.json", [case]))
    assert code == 1
    assert lines[0].startswith(
        "FAIL a wrong absolute path fails: step 1: expected '[#0001] No such file or folder: /nope.txt'"
    )
    assert lines[-1] == "0 passed, 1 failed"


def test_two_files_at_once(tmp_path: Path) -> None:
    first = write(tmp_path, "first.json", [PASSING])
    second_case = {
        "name": "the same listing twice",
        "spec": "§6",
        "workspace": {"a.txt": "a\n"},
        "steps": [
            {"tool": "list", "args": {}, "expect": "[#0001]\n{root}/a.txt"},
            {"tool": "list", "args": {}, "expect": "[#0002] Same result as #0001."},
        ],
    }
    second = write(tmp_path, "second.json", [second_case, {**PASSING, "name": "again, in the second file"}])
    code, lines, _ = run(first, second)
    assert lines == [
        "ok the first message carries the date",
        "ok the same listing twice",
        "ok again, in the second file",
        "3 passed, 0 failed",
    ]
    assert code == 0


def test_a_change_cannot_write_outside_the_workspace(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    case = {
        "name": "a change through a symlink out",
        "spec": "§1",
        "workspace": {"out": {"symlink": str(outside)}},
        "steps": [{"change": {"path": "out/x.txt", "content": "x\n"}}],
    }
    code, lines, _ = run(write(tmp_path, "escape.json", [case]))
    assert code == 1
    assert lines[0].startswith("FAIL a change through a symlink out: step 1: ")
    assert not (outside / "x.txt").exists()
