"""The house's figures, read from the source: import cycles, imports up the layers, private reads, sizes.

``python -m tests.house`` prints them; `tests.core.test_house` holds the tree to them. Everything
here is read with `ast`, nothing is imported, so a broken module is still measured.

- An import is *module-level* when it runs on import (``if TYPE_CHECKING:`` blocks count: they
  tie the modules for a type checker and a reader alike), *deferred* when it is inside a function.
- The layers are `LAYERS`: a module may import its own layer and the ones below; an import of a
  higher layer runs up. ``openenv`` is the bottom and never imports ``transports``.
- A *private read* is ``something._name`` where ``_name`` is defined by another module of the tree
  (an attribute set or a name defined there) and not by the reading module itself: a reach into
  another module's class. Reads of other libraries' privates are fenced elsewhere
  (``tests/server/test_fences.py``) and not counted here.
- A module's *code lines* leave out blank lines, comments and docstrings.
"""

from __future__ import annotations

import ast
import itertools
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("openenv", "transports")

LAYERS: tuple[tuple[str, int], ...] = (
    ("openenv", 0),
    ("transports.shared", 1),
    ("transports.admission", 2),
    ("transports.link", 3),
    ("transports.websocket", 4),
    ("transports.http", 4),
    ("transports.inprocess", 4),
    ("transports.mcp_session", 5),
    ("transports.server", 6),
    ("transports.ray", 7),
    ("transports.project", 7),
    ("transports.bench", 7),
    # The retired paths: each re-exports the module that replaced it.
    ("transports.app", 8),
    ("transports.runner", 8),
    ("transports.openenv_http", 8),
    ("transports.task_api", 8),
    ("transports.cli", 9),
    ("transports", 10),
)
"""Each module's layer: that of the longest prefix here that names it or a package above it."""

MAX_CODE_LINES = 600


@dataclass
class Module:
    """One source file of the tree, as read."""

    name: str
    path: Path
    tree: ast.Module
    imports: set[str] = field(default_factory=set)
    deferred: set[str] = field(default_factory=set)
    defines: set[str] = field(default_factory=set)
    private_reads: list[tuple[int, str]] = field(default_factory=list)


def layer_of(module: str) -> int:
    """The layer of a module: that of the longest prefix in `LAYERS` that is it or a package above it."""
    best, depth = 0, -1
    for prefix, layer in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
            best, depth = layer, len(prefix)
    return best


def read_tree(root: Path = ROOT) -> dict[str, Module]:
    """Every module of the packages, by dotted name, with its imports, definitions and private reads."""
    modules: dict[str, Module] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            modules[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    for module in modules.values():
        _read_imports(module, modules)
        module.defines = set(_definitions(module.tree))
    for module in modules.values():
        module.private_reads = list(_private_reads(module, modules))
    return modules


def _resolve(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.name.split(".")
    if module.path.name != "__init__.py":
        package.pop()
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(module: Module, node: ast.Import | ast.ImportFrom, modules: dict[str, Module]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                yield name
        return
    source = _resolve(module, node)
    for alias in node.names:
        if f"{source}.{alias.name}" in modules:
            yield f"{source}.{alias.name}"
        elif source in modules:
            yield source


def _read_imports(module: Module, modules: dict[str, Module]) -> None:
    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found = set(_targets(module, child, modules)) - {module.name}
                (module.deferred if deferred else module.imports).update(found)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, True)
            else:
                visit(child, deferred)

    visit(module.tree, False)


def _definitions(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            yield node.attr
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.target.id
        elif isinstance(node, ast.alias):
            yield (node.asname or node.name).rpartition(".")[2]
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg  # a Struct or dataclass made with a private field by keyword


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_reads(module: Module, modules: dict[str, Module]) -> Iterator[tuple[int, str]]:
    elsewhere: set[str] = set()
    for other in modules.values():
        if other is not module:
            elsewhere |= other.defines
    own = {name for name in module.defines if not _imported_only(module, name)}
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if node.attr in own or node.attr not in elsewhere:
            continue
        yield node.lineno, node.attr
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom) and _resolve(module, node).split(".")[0] in PACKAGES:
            source = _resolve(module, node)
            for alias in node.names:
                if _is_private(alias.name) and f"{source}.{alias.name}" not in modules:  # a private module is fine
                    yield node.lineno, f"import {alias.name}"


def _imported_only(module: Module, name: str) -> bool:
    """Whether ``name`` comes into the module only by an import (so it is another module's)."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return False
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr == name:
            return False
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
            return False
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return False
        if isinstance(node, ast.keyword) and node.arg == name:
            return False
    return True


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def connect(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return sorted(found)


def module_cycles(modules: dict[str, Module]) -> list[list[str]]:
    """Import cycles among modules, module-level imports only."""
    return cycles({name: module.imports for name, module in modules.items()})


def room_of(module: str) -> str:
    """The folder (or loose file) a module stands in, one level below its package: its room in the house."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "transports" else parts[0]


def room_cycles(modules: dict[str, Module]) -> list[list[str]]:
    """Import cycles among the rooms of ``transports`` (``transports.link``, ``transports.server``, ...)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for name, module in modules.items():
        for target in module.imports:
            if room_of(target) != room_of(name):
                edges[room_of(name)].add(room_of(target))
    return cycles(edges)


def imports_up(modules: dict[str, Module], *, deferred: bool = False) -> list[tuple[str, str]]:
    """(importer, imported) pairs where the imported module stands on a higher layer."""
    found = []
    for name, module in sorted(modules.items()):
        for target in sorted(module.deferred if deferred else module.imports):
            if layer_of(target) > layer_of(name):
                found.append((name, target))
    return found


def private_reads(modules: dict[str, Module]) -> list[tuple[str, int, str]]:
    """(module, line, attribute) for every read of another module's private name."""
    return [(name, line, attr) for name, module in sorted(modules.items()) for line, attr in module.private_reads]


def code_lines(path: Path) -> int:
    """Lines of a file that are neither blank, nor comments, nor docstrings."""
    source = path.read_text()
    tree = ast.parse(source)
    docstring_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            first = body[0] if body else None
            value = first.value if isinstance(first, ast.Expr) else None
            if first is not None and isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstring_lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
        # An attribute's docstring: a string statement right after an assignment.
        for field_name in ("body", "orelse"):
            statements = getattr(node, field_name, None)
            if not isinstance(statements, list):
                continue
            for before, after in itertools.pairwise(statements):
                if (
                    isinstance(before, ast.Assign | ast.AnnAssign)
                    and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                ):
                    docstring_lines.update(range(after.lineno, (after.end_lineno or after.lineno) + 1))
    count = 0
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and number not in docstring_lines:
            count += 1
    return count


def sizes(modules: dict[str, Module]) -> list[tuple[int, str]]:
    """(code lines, module) for every module, largest first."""
    return sorted(((code_lines(module.path), name) for name, module in modules.items()), reverse=True)


def main() -> None:
    """Print the figures."""
    modules = read_tree()
    found = module_cycles(modules)
    print(f"modules: {len(modules)}")
    print(f"import cycles (module-level imports): {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))
    rooms = room_cycles(modules)
    print(f"import cycles between the rooms of transports: {len(rooms)}")
    for component in rooms:
        print("  " + " <-> ".join(component))
    up = imports_up(modules)
    print(f"module-level imports up the layers: {len(up)}")
    for importer, imported in up:
        print(f"  {importer} -> {imported}")
    late = imports_up(modules, deferred=True)
    print(f"deferred imports up the layers: {len(late)}")
    for importer, imported in late:
        print(f"  {importer} -> {imported}")
    reads = private_reads(modules)
    print(f"reads of another module's private names: {len(reads)}")
    for name, line, attr in reads:
        print(f"  {name}:{line} {attr}")
    big = [(lines, name) for lines, name in sizes(modules) if lines > MAX_CODE_LINES]
    print(f"modules over {MAX_CODE_LINES} code lines: {len(big)}")
    for lines, name in big:
        print(f"  {name}: {lines}")


if __name__ == "__main__":
    main()
