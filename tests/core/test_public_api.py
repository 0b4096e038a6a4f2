"""The public surface: a complete, sorted ``__all__``; and the layering rule, checked on imports."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest

import openenv
import openenv.core
import openenv.core.env_server
import openenv.server

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", [openenv, openenv.server, openenv.core, openenv.core.env_server])
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
    """Every import of every module counts: at module level, inside a function, under TYPE_CHECKING.

    The drop-in ``openenv.core`` may import pydantic too (its extra, ``openenv-anyio[core]``), and
    FastMCP with its MCP SDK (the ``mcp`` extra).
    """
    allowed = {"anyio", "msgspec", "openenv", "typing_extensions"} | set(sys.stdlib_module_names)
    for path in (ROOT / "openenv").rglob("*.py"):
        imported = _imports(path)
        if path.is_relative_to(ROOT / "openenv" / "core"):
            imported -= {"pydantic", "fastmcp", "mcp"}
        assert imported <= allowed, f"{path.relative_to(ROOT)} imports {imported - allowed}"


def test_openenv_outside_its_core_never_imports_openenv_core() -> None:
    """``import openenv`` needs no pydantic: only the drop-in layer (``openenv.core``, ``openenv.auto``) reaches it."""
    for path in (ROOT / "openenv").rglob("*.py"):
        if any(path.is_relative_to(ROOT / "openenv" / layer) for layer in ("core", "auto")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            reached = [name for name in modules if name == "openenv.core" or name.startswith("openenv.core.")]
            assert not reached, f"{path.relative_to(ROOT)} imports {reached}"


def test_the_import_check_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from transports.server.runner import RunningServer\n"
        "def serve() -> None:\n    import starlette\n"
    )
    assert {"transports", "starlette"} <= _imports(module)


def test_openenv_docstring_examples_import_no_transport() -> None:
    """Core's examples reach transports as users should: through a URL (the registry), never an import."""
    for path in (ROOT / "openenv").rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            words = line.split()
            imports_transports = words[:1] in (["import"], ["from"]) and words[1].split(".")[0] == "transports"
            assert not imports_transports, f"{path.relative_to(ROOT)}:{number}: {line.strip()}"


def test_openenv_serve_has_the_servers_options_and_defaults() -> None:
    """`openenv.serve` forwards to the ``openenv.server`` entry point; mypy checks the types, this the defaults."""
    from transports.server.runner import serve as runner_serve

    def options(function: object) -> list[tuple[str, object]]:
        parameters = list(inspect.signature(function).parameters.values())  # type: ignore[arg-type]
        return [(p.name, p.default) for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]

    assert options(openenv.serve) == options(runner_serve)


def test_openenv_serve_without_a_server_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import openenv._serve

    monkeypatch.setattr(openenv._serve, "entry_points", lambda **selection: ())
    with pytest.raises(ImportError, match=r"pip install 'openenv-anyio\[server\]'"):
        openenv.serve("openenv.examples.echo:EchoEnvironment")


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
