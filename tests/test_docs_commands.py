"""The commands the README and ``docs/`` show, as written (issue 38, item 5).

Every ``sh`` block carries a marker on the line before it, and the marker says how it is held to what it shows:

- ``<!-- docs-test: run -->``: run here, line by line, in a fresh data folder beside a fresh embedded Postgres,
  against the scripted model server; a line under a command that is no command is output the command must print
  (URLs may differ). The blocks of a file run in their order, sharing the data folder, as a person would type them.
- ``<!-- docs-test: flags -->``: a synopsis; each command's ``--help`` names every option the block shows.
- ``<!-- docs-test: settings -->``: settings; each one is a setting ``./run --help`` lists.
- ``<!-- docs-test: tested-by PATH::TEST -->``: run as written by that test.
- ``<!-- docs-test: not-here REASON -->``: needs what this machine's tests do not have (Docker, a GPU box).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testing.scripted_server import ScriptedServer, Step

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^\s*<!-- docs-test: (?P<kind>[a-z-]+)(?: (?P<detail>.*?))? -->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>\w*)\s*$")
KINDS = {"run", "flags", "settings", "tested-by", "not-here"}
PYTHON = ".venv/bin/python"
URL = re.compile(r"https?://[^\s)]+")
COMMAND_SECONDS = 120
READ_SETTING = re.compile(r"""(?:environ\.get|environ\[|getenv|env_\w+)\(?["']([A-Z][A-Z0-9_]+)["']""")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the fence's line, counted from 1
    lang: str
    kind: str | None
    detail: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> Iterator[Block]:
    """The fenced blocks of ``path`` with the marker on the line before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        end = next(
            (at for at in range(index + 1, len(lines)) if lines[at].strip() == "```"),
            len(lines),
        )
        marker = MARKER.match(lines[index - 1]) if index else None
        indent = len(fence["indent"])
        text = "\n".join(line[indent:] for line in lines[index + 1 : end])
        kind = marker["kind"] if marker else None
        yield Block(path, index + 1, fence["lang"], kind, (marker["detail"] or "") if marker else "", text)
        index = end + 1


SH_BLOCKS = [block for path in DOCS for block in blocks(path) if block.lang == "sh"]


def test_every_shell_block_says_how_it_is_tested() -> None:
    unmarked = [block.where for block in SH_BLOCKS if block.kind not in KINDS]
    assert not unmarked, f"sh blocks without a docs-test marker on the line before: {unmarked}"
    for block in SH_BLOCKS:
        if block.kind in ("tested-by", "not-here"):
            assert block.detail, f"{block.where}: {block.kind} says nothing"


@pytest.mark.parametrize("block", [b for b in SH_BLOCKS if b.kind == "tested-by"], ids=lambda b: b.where)
def test_the_test_named_for_a_block_exists(block: Block) -> None:
    path, _, name = block.detail.partition("::")
    source = (ROOT / path).read_text(encoding="utf-8")
    assert re.search(rf"^(async )?def {re.escape(name)}\b", source, re.M), f"{block.where}: no {block.detail}"


def _python_commands(text: str) -> list[list[str]]:
    """The block's commands that start with ``.venv/bin/python``, each as its words (comments and what follows an
    ``&`` or ``&&`` dropped)."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        for part in re.split(r"&&|;", line):
            words = shlex.split(part.split(" # ")[0].rstrip(" &"), comments=True)
            if words and words[0] == PYTHON:
                found.append(words)
    return found


@pytest.mark.parametrize("block", [b for b in SH_BLOCKS if b.kind == "flags"], ids=lambda b: b.where)
def test_a_synopsis_names_only_options_its_command_has(block: Block) -> None:
    commands = _python_commands(block.text)
    assert commands, f"{block.where}: no {PYTHON} command in the block"
    for words in commands:
        program = words[1:3] if words[1] == "manage.py" else words[1:2]
        helped = subprocess.run(
            [sys.executable, *program, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert helped.returncode == 0, f"{block.where}: {' '.join(program)} --help failed: {helped.stderr}"
        shown = set(re.findall(r"--[a-z][a-z-]*", " ".join(words)))
        missing = sorted(option for option in shown if option not in helped.stdout)
        assert not missing, f"{block.where}: {' '.join(program)} has no {missing}"


def _read_settings() -> set[str]:
    """The environment variables Cachet's code reads."""
    names: set[str] = set()
    for package in ("cachet", "chat", "sessions_app"):
        for path in (ROOT / package).rglob("*.py"):
            names.update(READ_SETTING.findall(path.read_text()))
    return names


def test_settings_blocks_name_settings_cachet_or_its_compose_file_reads() -> None:
    read = _read_settings()
    compose = set(re.findall(r"\$\{([A-Z][A-Z0-9_]+)", (ROOT / "docker-compose.yml").read_text()))
    # ./run ends in ``manage.py serve "$@"``; run itself would set up ./.venv for serving first (a pip install)
    assert (ROOT / "run").read_text().rstrip().endswith('exec .venv/bin/python manage.py serve "$@"')
    serve_help = [sys.executable, "manage.py", "serve", "--help"]
    helped = subprocess.run(serve_help, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0, helped.stderr
    blocks = [b for b in SH_BLOCKS if b.kind == "settings"]
    assert blocks
    for block in blocks:
        names = re.findall(r"^([A-Z][A-Z0-9_]+)=", block.text, re.M)
        assert names, f"{block.where}: no settings"
        unknown = [name for name in names if name not in read | compose]
        assert not unknown, f"{block.where}: neither Cachet nor docker-compose.yml reads {unknown}"
        unlisted = [name for name in names if name in read and name not in helped.stdout]
        assert not unlisted, f"{block.where}: ./run --help (serve's) does not list {unlisted}"


# --- the blocks that run here ---------------------------------------------------------------------------------


@dataclass
class Shell:
    """A person's terminal in a checkout of their own: its own data folder and home, the model server set."""

    cwd: Path
    env: dict[str, str]

    def run(self, words: list[str], *, expect: list[str] | None = None) -> str:
        home = self.env["HOME"]
        argv = [sys.executable, *(home + w[1:] if w.startswith("~/") else w for w in words[1:])]
        done = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=COMMAND_SECONDS)
        said = " ".join(words)
        assert done.returncode == 0, f"{said} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        printed = [URL.sub("URL", line.strip()) for line in done.stdout.splitlines()]
        for line in expect or []:
            shown = re.escape(URL.sub("URL", line.strip())).replace("…", ".*")  # … stands for what varies
            assert any(re.fullmatch(shown, out) for out in printed), f"{said} did not print {line!r}:\n{done.stdout}"
        return done.stdout

    def block(self, block: Block) -> None:
        """Each command of the block, each checked against the output lines shown under it."""
        assert block.kind == "run", block.where
        steps: list[tuple[list[str], list[str]]] = []
        for line in block.text.splitlines():
            words = shlex.split(line, comments=True) if line.strip() else []
            if words and words[0] == PYTHON:
                steps.append((words, []))
            elif line.strip():
                assert steps, f"{block.where}: output before any command: {line!r}"
                steps[-1][1].append(line)
        for words, expect in steps:
            self.run(words, expect=expect)


def _until(condition: Callable[[], bool], log: Path, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


def _run_blocks(path: Path) -> list[Block]:
    return [block for block in SH_BLOCKS if block.path == path and block.kind == "run"]


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("manage.py", "conformance"):
        (checkout / name).symlink_to(ROOT / name)
    home = tmp_path / "home"
    (home / "src" / "project").mkdir(parents=True)
    (home / "src" / "project" / "main.py").write_text("def greet(name):\n    return 'hello ' + name\n")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CACHET_", "DJANGO_")) and key not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(HOME=str(home), CACHET_DATA=str(tmp_path / "data"), PYTHONPATH=str(ROOT))
    with ScriptedServer(when_empty=Step(text="It greets.")) as server:
        env["CACHET_MODEL_URL"] = server.base_url
        yield Shell(checkout, env)


def test_usage_and_the_backup_run_as_written_in_a_fresh_data_folder(shell: Shell) -> None:
    usage = _run_blocks(ROOT / "docs" / "usage.md")
    backup, restore = _run_blocks(ROOT / "docs" / "deployment.md")
    assert usage and "backup" in backup.text and "dbshell" in restore.text
    # before Cachet has started once, ask says what to do, and nothing is made
    early = subprocess.run(
        [sys.executable, "manage.py", "ask", "--user", "admin", "Hello?"],
        cwd=shell.cwd,
        env=shell.env,
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
    )
    assert early.returncode == 1 and "Traceback" not in early.stderr, early.stderr
    assert "no Cachet tables yet" in early.stderr and "./run" in early.stderr, early.stderr
    # a worker started first waits for the migrations (docs/deployment.md), then takes the jobs ask queues
    log = shell.cwd / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "worker"], cwd=shell.cwd, env=shell.env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        _until(lambda: "migration(s): waiting for them" in log.read_text(), log)
        # "start Cachet once": serve sets up the database and the admin, and stops (--no-serve)
        created = "Created the admin account. Log in at URL as admin with password …"
        shell.run([PYTHON, "manage.py", "serve", "--no-serve"], expect=[created])
        _until(lambda: "Worker ready" in log.read_text(), log)
        for block in usage:
            shell.block(block)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert worker.returncode == 0, log.read_text()
    shell.block(backup)
    assert (shell.cwd / "backup.sql").stat().st_size > 0
    # "stop Cachet, move .cachet/pg aside": no process of the shell is running; the next start makes a new one
    data = Path(shell.env["CACHET_DATA"])
    shutil.move(data / "pg", data / "pg.aside")
    shell.block(restore)
    said = shell.run([PYTHON, "manage.py", "ask", "--user", "admin", "--session", "1", "Still there?"])
    assert said.splitlines()[-1].startswith("session=1 turn=")
    ran = {block.where for block in [*usage, backup, restore]}
    every = {block.where for block in SH_BLOCKS if block.kind == "run"}
    assert ran == every, f"run blocks no test runs: {sorted(every - ran)}"
