"""The package's layout as DESIGN states it: what ships imports nothing of the test parts, and the store
imports nothing of the chat."""

from __future__ import annotations

import ast
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
