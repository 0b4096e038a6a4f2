"""The house's rules hold: no import cycle, no import up the layers, no reach into another module's privates.

The measure is `tests.house` (``python -m tests.house`` prints the figures); the rules are those of
``docs/architecture.md``. The last tests check the measure itself on a small tree of their own.
"""

from __future__ import annotations

import ast
import importlib
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from tests import house

RETIRED = {
    "transports.app": "transports.server.app",
    "transports.runner": "transports.server.runner",
    "transports.openenv_http": "transports.server.routes.openenv_http",
    "transports.task_api": "transports.server.routes.task_api",
}
"""Each retired import path and the module that replaced it."""


@pytest.fixture(scope="module")
def modules() -> dict[str, house.Module]:
    return house.read_tree()


def test_no_module_level_import_cycle(modules: dict[str, house.Module]) -> None:
    assert house.module_cycles(modules) == []


def test_no_import_cycle_between_the_folders_of_transports(modules: dict[str, house.Module]) -> None:
    assert house.room_cycles(modules) == []


def test_no_import_runs_up_the_layers(modules: dict[str, house.Module]) -> None:
    assert house.imports_up(modules) == []
    assert house.imports_up(modules, deferred=True) == []


def test_openenv_never_imports_transports(modules: dict[str, house.Module]) -> None:
    reaching = [
        (name, target)
        for name, module in modules.items()
        if name.split(".")[0] == "openenv"
        for target in module.imports | module.deferred
        if target.split(".")[0] == "transports"
    ]
    assert reaching == []


def test_no_module_reads_another_modules_private_names(modules: dict[str, house.Module]) -> None:
    assert house.private_reads(modules) == []


def test_no_module_is_over_the_size_limit(modules: dict[str, house.Module]) -> None:
    too_big = [(lines, name) for lines, name in house.sizes(modules) if lines > house.MAX_CODE_LINES]
    assert too_big == []


def test_every_module_says_its_concern_in_a_docstring(modules: dict[str, house.Module]) -> None:
    silent = [name for name, module in modules.items() if not (ast.get_docstring(module.tree) or "").strip()]
    assert silent == []


def test_every_module_of_transports_has_a_layer_of_its_own_folder(modules: dict[str, house.Module]) -> None:
    prefixes = [prefix for prefix, _ in house.LAYERS if prefix != "transports"]
    unplaced = [
        name
        for name in modules
        if name.startswith("transports.")
        and not any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)
    ]
    assert unplaced == []


def test_the_architecture_page_names_every_folder(modules: dict[str, house.Module]) -> None:
    page = (house.ROOT / "docs" / "architecture.md").read_text()
    folders = {name for name, module in modules.items() if module.path.name == "__init__.py"}
    missing = [name for name in sorted(folders) if f"`{name.replace('.', '/')}/`" not in page]
    assert missing == []


@pytest.mark.parametrize(("old", "new"), sorted(RETIRED.items()))
def test_a_retired_path_warns_and_gives_the_same_objects(old: str, new: str) -> None:
    replacement = importlib.import_module(new)
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"^{old} is deprecated: import {new}$"):
        retired = importlib.import_module(old)
    assert retired.__all__ == replacement.__all__
    for name in replacement.__all__:
        assert getattr(retired, name) is getattr(replacement, name), name
    sys.modules.pop(old, None)


def test_the_current_paths_import_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for new in RETIRED.values():
            importlib.import_module(new)


# The measure itself, on a tree made here.


def write(root: Path, relative: str, source: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))


@pytest.fixture
def small_tree(tmp_path: Path) -> Path:
    write(tmp_path, "openenv/__init__.py", '"""Bottom."""\n')
    write(
        tmp_path,
        "openenv/_a.py",
        '''\
        """A: defines a private attribute, imports B."""
        from openenv import _b


        class Thing:
            def __init__(self) -> None:
                self._secret = 1
        ''',
    )
    write(
        tmp_path,
        "openenv/_b.py",
        '''\
        """B: imports A back (a cycle), and reads A's private attribute."""
        from openenv import _a


        def peek(thing: "_a.Thing") -> int:
            return thing._secret
        ''',
    )
    write(tmp_path, "transports/__init__.py", '"""Top."""\n')
    write(tmp_path, "transports/shared/__init__.py", '"""Shared."""\n')
    write(
        tmp_path,
        "transports/shared/_low.py",
        '''\
        """Low: imports a module of a higher layer, late."""


        def late() -> None:
            from transports.server import app  # noqa: F401
        ''',
    )
    write(tmp_path, "transports/server/__init__.py", '"""Server."""\n')
    write(tmp_path, "transports/server/app.py", '"""App."""\nfrom transports.shared import _low  # noqa: F401\n')
    return tmp_path


def test_the_measure_finds_a_cycle_a_private_read_and_an_import_up(small_tree: Path) -> None:
    modules = house.read_tree(small_tree)
    assert house.module_cycles(modules) == [["openenv._a", "openenv._b"]]
    assert house.private_reads(modules) == [("openenv._b", 6, "_secret")]
    assert house.imports_up(modules) == []
    assert house.imports_up(modules, deferred=True) == [("transports.shared._low", "transports.server.app")]


def test_a_module_reading_its_own_private_names_is_no_reach_in(small_tree: Path) -> None:
    write(
        small_tree,
        "openenv/_b.py",
        '''\
        """B, alone: its class sets the private name it reads."""


        class Other:
            def __init__(self) -> None:
                self._secret = 2

            def peek(self, other: "Other") -> int:
                return other._secret
        ''',
    )
    assert house.private_reads(house.read_tree(small_tree)) == []


def test_code_lines_leave_out_docstrings_comments_and_blank_lines(tmp_path: Path) -> None:
    write(
        tmp_path,
        "m.py",
        '''\
        """A module.

        Its docstring runs on.
        """

        # a comment
        LIMIT = 3
        """LIMIT's docstring."""


        def f() -> int:
            """F."""
            return LIMIT  # counted
        ''',
    )
    assert house.code_lines(tmp_path / "m.py") == 3
