"""The package's layout as DESIGN states it: what ships imports nothing of the test parts, and the store
imports nothing of the chat."""

from __future__ import annotations

import ast
import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(package: str) -> dict[str, set[str]]:
    """Every module each file of ``package`` imports, by file."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def test_nothing_shipped_imports_the_test_parts() -> None:
    for package in ("cachet", "sessions_app", "chat"):
        for path, names in imported_modules(package).items():
            assert not [name for name in names if name == "testing" or name.startswith("testing.")], path


def test_the_test_parts_are_not_a_shipped_package() -> None:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        include = tomllib.load(handle)["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not [pattern for pattern in include if pattern.startswith("testing")]
    assert not (ROOT / "chat" / "testing").exists()


def test_the_store_imports_nothing_of_the_chat() -> None:
    for path, names in imported_modules("sessions_app").items():
        assert not [name for name in names if name == "chat" or name.startswith("chat.")], path


REPLY_PATH = (
    "chat/actions.py",
    "chat/wire.py",
    "chat/tasks.py",
    "chat/agent/loop.py",
    "chat/agent/cache_check.py",
    "chat/agent/placement.py",
    "chat/agent/budget.py",
    "chat/agent/model",
    "chat/tools",
    "chat/worker/jobs.py",
    "chat/worker/checks.py",
    "chat/worker/publish.py",
    "chat/web/consumers.py",
    "chat/web/tabs.py",
    "chat/web/publish.py",
    "chat/web/queueing.py",
)
SCHEDULING = frozenset(
    {"Thread", "ThreadPoolExecutor", "ProcessPoolExecutor", "new_event_loop", "run_coroutine_threadsafe"}
    | {"to_thread", "run_in_executor", "run", "Timer", "Barrier", "Semaphore", "BoundedSemaphore", "Condition"}
)


def _calls(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            owner = node.func.value if isinstance(node.func, ast.Attribute) else None
            if name == "run" and not (isinstance(owner, ast.Name) and owner.id == "asyncio"):
                continue  # subprocess.run and the like; asyncio.run starts an event loop
            if name in SCHEDULING:
                found.append((node.lineno, name))
    return found


def test_nothing_in_a_replys_path_starts_a_thread_a_pool_or_an_event_loop_of_its_own() -> None:
    """A reply runs on the task queue's and asyncio's concurrency only (DESIGN, "The path of a reply")."""
    paths = [ROOT / part for part in REPLY_PATH]
    files = [file for path in paths for file in (sorted(path.rglob("*.py")) if path.is_dir() else [path])]
    assert len(files) > len(REPLY_PATH)
    started = {str(file.relative_to(ROOT)): calls for file in files if (calls := _calls(file))}
    assert started == {}


def test_a_worker_and_ask_start_without_the_web_tier() -> None:
    """The worker and ``ask`` load what the jobs use, not the pages: no system checks (which import the URLconf and
    with it every view, form and renderer: 0.9 s of a worker's 3.2 s start)."""
    import subprocess
    import sys

    script = (
        "import sys, django; django.setup()\n"
        "from chat.management.commands import ask, worker\n"
        "from chat.worker.process import ready_to_work\n"
        "ready_to_work()\n"
        "assert ask.Command.requires_system_checks == [] and worker.Command.requires_system_checks == []\n"
        "print(sorted(m for m in sys.modules if m in ('chat.web.views', 'chat.web.rendering', 'chat.web.forms')))\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "cachet.settings"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
