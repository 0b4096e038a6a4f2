"""The public surface: a complete, sorted ``__all__``; and the layering rule, checked on imports."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import openenv
import openenv.server

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module", [openenv, openenv.server])
def test_all_is_sorted_and_complete(module: object) -> None:
    exported = list(module.__all__)  # type: ignore[attr-defined]
    # Sorted isort-style: CONSTANTS, then Classes, then functions.
    assert exported == sorted(exported, key=lambda name: (0 if name.isupper() else 1 if name[0].isupper() else 2, name))
    public = {
        name for name in vars(module) if not name.startswith("_") and not isinstance(vars(module)[name], type(sys))
    }
    public -= {"annotations"}
    assert public <= set(exported) | {"channel", "examples", "server"}, public - set(exported)
    for name in exported:
        assert getattr(module, name) is not None


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_openenv_imports_only_anyio_msgspec_and_the_standard_library() -> None:
    allowed = {"anyio", "msgspec", "openenv", "typing_extensions"} | set(sys.stdlib_module_names)
    for path in (ROOT / "openenv").rglob("*.py"):
        source = path.read_text()
        imported = _imports(path)
        # `transports` may be imported lazily, inside a function (openenv.serve), never at import time.
        lazy = {"transports"} if "TYPE_CHECKING" in source or path.name == "_serve.py" else set()
        assert imported <= allowed | lazy, f"{path.relative_to(ROOT)} imports {imported - allowed - lazy}"


def test_nothing_imports_asyncio_or_trio_outside_tests() -> None:
    for package in ("openenv", "transports"):
        for path in (ROOT / package).rglob("*.py"):
            assert not _imports(path) & {"asyncio", "trio"}, path


def test_importing_openenv_pulls_in_no_io_library() -> None:
    import subprocess

    libraries = "('websockets', 'httpx', 'starlette', 'uvicorn', 'transports')"
    code = f"import openenv, sys; print(sorted(m for m in {libraries} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]"
