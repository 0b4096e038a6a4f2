"""Every Python example in the documentation runs, so the docs cannot drift from the code.

What runs:

- every fenced block whose language is ``python`` on every page under ``docs/``;
  a page's blocks run in order in one shared namespace (a later block may use a
  class an earlier one defined);
- every ``python`` block in the docstrings of the names the API reference
  renders (the ``::: dotted.name`` lines of ``docs/reference/*.md``, and their
  public members), each docstring in a fresh namespace.

A block may use top-level ``await``: it is then run under ``anyio.run`` on
asyncio and on trio, so a page (or docstring) with such a block is one test per
backend. Other blocks run as plain code. Each block runs in a thread of its own,
so a hung example fails its test instead of hanging the suite.

While a page runs, ``openenv.examples.echo:EchoEnvironment`` is served (WebSocket
and HTTP long-polling) on an ephemeral port, and every ``127.0.0.1:8000`` or
``localhost:8000`` in a block is rewritten to its address: examples are written
as a reader would type them.

An HTML comment on the line right before a fence changes how it runs:

- ``<!-- docs-test: skip (why) -->``: not run (only for blocks that cannot run by
  nature); ``test_skipped_blocks_have_reasons`` lists them all;
- ``<!-- docs-test: reference -->``: run by the reference OpenEnv's python
  (openenv-core in its own venv), as a subprocess, against the running server;
- ``<!-- docs-test: file=path/name.py -->``: written to that path in a temporary
  directory that is on ``sys.path`` for the rest of the page (a module the page
  then serves or loads with ``inproc://``).

A shell block's ``openenv serve FACTORY ...`` command does what it says: from
there on, the page's ``127.0.0.1:8000`` is a server of FACTORY (say, the module
a ``file=`` block wrote), started on an ephemeral port and stopped at the end of
the page. No other shell command runs.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import inspect
import linecache
import re
import shlex
import subprocess
import sys
import textwrap
import threading
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import pytest

import openenv
from tests.interop.reference_venv import REFERENCES, Reference, ensure_reference_python, reference_env

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BACKENDS = ("asyncio", "trio")
# Seconds one block may take, however slow the machine; examples take a fraction of it.
BLOCK_LIMIT = 60.0
SERVER_FACTORY = "openenv.examples.echo:EchoEnvironment"

_OPENING = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
_SKIP = re.compile(r"^skip\b\s*(?:\((?P<paren>.*)\)|:?\s*(?P<bare>.*))$", re.DOTALL)
_FILE = re.compile(r"^file\s*=\s*(?P<path>\S+)$")
_DOCS_ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|localhost):8000\b")
_AUTODOC = re.compile(r"^:::\s*(?P<name>[\w.]+)\s*$", re.MULTILINE)
_PYTHON = {"python", "py", "python3"}
_SHELL = {"bash", "sh", "shell", "console", "zsh"}


# -- finding the blocks --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced ``python`` block, and how the marker before it says to run it."""

    source: str  # "docs/quickstart.md", or "docstring of openenv.EnvClient"
    line: int  # 1-based line of the first code line, in the page or the docstring
    code: str
    mode: str = "run"  # "run", "skip", "reference", "file", "serve" or "invalid"
    argument: str = ""  # the skip's reason, the file's path, the factory served, or what was invalid

    @property
    def is_async(self) -> bool:
        if self.mode != "run":
            return False
        try:
            return bool(_compile(self.code, "<check>").co_flags & inspect.CO_COROUTINE)
        except SyntaxError:
            return False  # run once, and fail there with the error

    def where(self) -> str:
        return f"{self.source}, block at line {self.line}"


def _marker(line: str) -> tuple[str, str] | None:
    match = _MARKER.match(line)
    if match is None:
        return None
    body = match["body"]
    if body == "reference":
        return "reference", ""
    if skip := _SKIP.match(body):
        return "skip", (skip["paren"] if skip["paren"] is not None else skip["bare"] or "").strip()
    if file := _FILE.match(body):
        return "file", file["path"]
    return "invalid", f"unknown docs-test marker {body!r}"


def python_blocks(text: str, source: str) -> list[Block]:
    """Every fenced ``python`` block of a Markdown text, dedented to its fence, with its marker."""
    lines = text.splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _OPENING.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        language = opening["info"].strip().lstrip("{").lstrip(".").split(" ")[0].lower()
        body: list[str] = []
        end = index + 1
        while end < len(lines):
            stripped = lines[end].strip()
            if stripped.startswith(fence) and set(stripped) == {fence[0]}:
                break
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end].lstrip())
            end += 1
        if language in _PYTHON:
            marker = _marker(lines[index - 1]) if index > 0 else None
            mode, argument = marker or ("run", "")
            code = "\n".join(body) + "\n"
            blocks.append(Block(source, index + 2, code, mode, argument))
        elif language in _SHELL:
            blocks += _serve_commands(body, source, index + 2)
        index = end + 1
    return blocks


def _serve_commands(body: list[str], source: str, first_line: int) -> list[Block]:
    """The ``openenv serve FACTORY`` commands of a shell block, as blocks that serve FACTORY."""
    found: list[Block] = []
    line_number, command = first_line, ""
    for offset, line in enumerate(body):
        if not command:
            line_number = first_line + offset
        command += line.rstrip().removesuffix("\\") + " "
        if line.rstrip().endswith("\\"):
            continue
        for segment in re.split(r"&&|\|\||;", command):
            try:
                words = shlex.split(segment, comments=True)
            except ValueError:
                continue
            for at, word in enumerate(words[:-1]):
                if Path(word).name == "openenv" and words[at + 1] == "serve":
                    command_text = " ".join(segment.split())
                    found.append(Block(source, line_number, command_text, "serve", _serve_factory(words[at + 2 :])))
        command = ""
    return found


def _serve_factory(arguments: list[str]) -> str:
    """The FACTORY argument of ``openenv serve``'s arguments (every option of it takes a value)."""
    words = iter(arguments)
    for word in words:
        if word.startswith("-"):
            if "=" not in word and word not in ("-h", "--help"):
                next(words, None)
            continue
        return word
    return ""


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _page_name(path: Path) -> str:
    return path.relative_to(DOCS).as_posix()


def page_blocks(path: Path) -> list[Block]:
    return python_blocks(path.read_text(encoding="utf-8"), f"docs/{_page_name(path)}")


def _autodoc_names() -> list[str]:
    """The dotted names the API reference renders with ``::: name``."""
    names: list[str] = []
    for path in sorted((DOCS / "reference").glob("*.md")):
        names += [match["name"] for match in _AUTODOC.finditer(path.read_text(encoding="utf-8"))]
    return names


def _resolve(dotted: str) -> Any:
    """Import ``package.module.Name`` (or a module) by its dotted name."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(dotted)


def _documented(dotted: str, obj: Any) -> Iterator[tuple[str, Any]]:
    """An object the reference renders and its public members, as mkdocstrings walks them."""
    yield dotted, obj
    if inspect.ismodule(obj):
        names = getattr(obj, "__all__", None) or [n for n in vars(obj) if not n.startswith("_")]
        for name in names:
            member = getattr(obj, name)
            if inspect.isclass(member) or inspect.isroutine(member):
                yield from _documented(f"{dotted}.{name}", member)
    elif inspect.isclass(obj):
        for name, member in vars(obj).items():
            documented = isinstance(member, (property, classmethod, staticmethod, type)) or inspect.isfunction(member)
            if documented and (name == "__init__" or not name.startswith("_")):
                yield f"{dotted}.{name}", member


def docstring_blocks() -> dict[str, list[Block]]:
    """The ``python`` blocks of every docstring the API reference renders, by the name that owns it."""
    found: dict[str, list[Block]] = {}
    seen: set[int] = set()
    for root in _autodoc_names():
        for dotted, member in _documented(root, _resolve(root)):
            target = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            doc = target.__dict__.get("__doc__") if inspect.isclass(target) else getattr(target, "__doc__", None)
            if not isinstance(doc, str) or id(target) in seen:
                continue
            seen.add(id(target))
            blocks = python_blocks(inspect.cleandoc(doc), f"docstring of {dotted}")
            if blocks:
                found[dotted] = blocks
    return found


PAGES = {_page_name(path): page_blocks(path) for path in _pages()}
DOCSTRINGS = docstring_blocks()


def _runs(blocks: list[Block]) -> list[str]:
    """The backends to run a group of blocks under: both if one awaits, else one plain run."""
    if not any(block.mode in ("run", "file") for block in blocks):
        return []
    return list(BACKENDS) if any(block.is_async for block in blocks) else ["plain"]


def _cases(groups: dict[str, list[Block]]) -> list[Any]:
    return [pytest.param(name, run, id=f"{name}-{run}") for name, blocks in groups.items() for run in _runs(blocks)]


# -- running them -----------------------------------------------------------------------


def _compile(code: str, filename: str, first_line: int = 1) -> types.CodeType:
    # Leading newlines keep the line numbers of tracebacks those of the page.
    return compile("\n" * (first_line - 1) + code, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def _in_thread(run: Callable[[], None], limit: float) -> BaseException | None:
    """Run ``run`` in a thread of its own, bounded; what it raised, if anything."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            run()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=target, name="docs-example", daemon=True)
    thread.start()
    thread.join(limit)
    if not outcome:
        return TimeoutError(f"the block did not finish within {limit:.0f} s")
    return outcome[0]


def _fail(block: Block, code: str, how: str, error: BaseException | str, filename: str = "") -> None:
    numbered = "\n".join(f"{block.line + i:5d} | {line}" for i, line in enumerate(code.splitlines()))
    if isinstance(error, BaseException):
        # Start the traceback at the example: the runner's own frames say nothing.
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != filename:
            tb = tb.tb_next
        error = "".join(traceback.format_exception(type(error), error, tb or error.__traceback__))
    pytest.fail(f"{block.where()} failed ({how}):\n{numbered}\n\n{error}", pytrace=False)


class Namespace:
    """Where a page's (or a docstring's) blocks run: one module, and a directory for ``file=`` blocks."""

    def __init__(self, name: str, directory: Path) -> None:
        self.module = types.ModuleType(name)
        self.module.__dict__["__file__"] = str(directory / f"{name}.py")
        self.directory = directory

    def __enter__(self) -> Namespace:
        sys.modules[self.module.__name__] = self.module
        sys.path.insert(0, str(self.directory))
        return self

    def __exit__(self, *exc_info: object) -> None:
        sys.path.remove(str(self.directory))
        del sys.modules[self.module.__name__]
        # Forget the modules the page's files defined: another page may reuse the names.
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(self.directory)):
                del sys.modules[name]

    def write(self, block: Block) -> None:
        path = self.directory / block.argument
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.code, encoding="utf-8")
        importlib.invalidate_caches()

    def run(self, block: Block, code: str, filename: str, backend: str) -> BaseException | None:
        compiled = _compile(code, filename, block.line if filename.endswith(".md") else 1)
        namespace = self.module.__dict__
        if not compiled.co_flags & inspect.CO_COROUTINE:
            return _in_thread(lambda: exec(compiled, namespace), BLOCK_LIMIT)

        async def main() -> None:
            with anyio.fail_after(BLOCK_LIMIT):
                await eval(compiled, namespace)

        return _in_thread(lambda: anyio.run(main, backend=backend), BLOCK_LIMIT + 10)


class Servers:
    """The echo server every page starts with, and a way to serve others from the same event loop."""

    def __init__(self, portal: anyio.from_thread.BlockingPortal, echo: str) -> None:
        self.portal = portal
        self.echo = echo

    @contextlib.contextmanager
    def serving(self, factory: str) -> Iterator[str]:
        """Serve ``factory`` for the ``with`` block; its host:port."""
        options = {"port": 0, "startup_timeout": 30.0, "shutdown_timeout": 5.0}
        with self.portal.wrap_async_context_manager(openenv.serve(factory, **options)) as server:
            yield f"{server.host}:{server.port}"


def run_blocks(blocks: list[Block], name: str, filename: str, servers: Servers, backend: str, tmp: Path) -> None:
    """Run a group of blocks in order, in one namespace; fail with the first block that fails.

    An ``openenv serve FACTORY`` command of the page does what it says: from there
    on, the page's ``127.0.0.1:8000`` is a server of FACTORY (the module a
    ``file=`` block wrote earlier, say), as it would be for a reader.
    """
    slug = re.sub(r"\W", "_", name)
    address = servers.echo
    with Namespace(f"docs_example_{slug}_{backend}", tmp) as namespace, contextlib.ExitStack() as page_servers:
        for block in blocks:
            code = _DOCS_ADDRESS.sub(address, block.code)
            if block.mode == "file":
                namespace.write(dataclasses.replace(block, code=code))
            elif block.mode == "serve":
                if block.argument == SERVER_FACTORY:
                    address = servers.echo
                    continue
                try:
                    address = page_servers.enter_context(servers.serving(block.argument))
                except Exception as exc:
                    _fail(block, code, "openenv serve", exc)
            elif block.mode == "run":
                where = filename
                if not filename.endswith(".md"):
                    # Docstrings have no file of their own: show their code in tracebacks.
                    where = f"<{block.where()}>"
                    linecache.cache[where] = (len(code), None, code.splitlines(True), where)
                error = namespace.run(block, code, where, backend)
                if error is not None:
                    _fail(block, code, backend, error, where)


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    """The echo environment served for the whole module (WebSocket and HTTP polling)."""
    with anyio.from_thread.start_blocking_portal("asyncio") as portal:
        servers = Servers(portal, "")
        with servers.serving(SERVER_FACTORY) as echo:
            servers.echo = echo
            yield servers


@pytest.mark.parametrize(("page", "backend"), _cases(PAGES))
def test_page_examples_run(page: str, backend: str, servers: Servers, tmp_path: Path) -> None:
    run_blocks(PAGES[page], page, str(DOCS / page), servers, backend, tmp_path)


@pytest.mark.parametrize(("name", "backend"), _cases(DOCSTRINGS))
def test_docstring_examples_run(name: str, backend: str, servers: Servers, tmp_path: Path) -> None:
    run_blocks(DOCSTRINGS[name], name, name, servers, backend, tmp_path)


# The reference's client as a script: top-level await runs under asyncio.
_REFERENCE_RUNNER = """
import ast, asyncio, inspect, sys
path, name = sys.argv[1], sys.argv[2]
code = compile(open(path).read(), name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
namespace = {"__name__": "__main__"}
if code.co_flags & inspect.CO_COROUTINE:
    async def main():
        await eval(code, namespace)
    asyncio.run(main())
else:
    exec(code, namespace)
"""

_REFERENCE_PAGES = {page: [b for b in blocks if b.mode == "reference"] for page, blocks in PAGES.items()}


@pytest.mark.interop
@pytest.mark.parametrize("reference", REFERENCES, ids=[r.version for r in REFERENCES])
@pytest.mark.parametrize("page", [page for page, blocks in _REFERENCE_PAGES.items() if blocks])
def test_reference_examples_run(page: str, reference: Reference, servers: Servers, tmp_path: Path) -> None:
    """The "before" examples of pages on coming from OpenEnv run on each reference release."""
    python = ensure_reference_python(reference=reference)
    runner = tmp_path / "run_reference_block.py"
    runner.write_text(_REFERENCE_RUNNER, encoding="utf-8")
    for block in _REFERENCE_PAGES[page]:
        code = _DOCS_ADDRESS.sub(servers.echo, block.code)
        script = tmp_path / f"block_{block.line}.py"
        # Padded so the reference's tracebacks give the page's line numbers.
        script.write_text("\n" * (block.line - 1) + code, encoding="utf-8")
        try:
            result = subprocess.run(
                [str(python), str(runner), str(script), str(DOCS / page)],
                cwd=tmp_path,  # holds no `openenv` package to shadow the reference's
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=BLOCK_LIMIT,
                env=reference_env(),
            )
        except subprocess.TimeoutExpired:
            _fail(block, code, "reference", f"the block did not finish within {BLOCK_LIMIT:.0f} s")
        if result.returncode != 0:
            _fail(block, code, "reference", f"exit status {result.returncode}\n{result.stdout}\n{result.stderr}")


# -- the markers themselves -------------------------------------------------------------


def _all_blocks() -> list[Block]:
    return [block for blocks in (*PAGES.values(), *DOCSTRINGS.values()) for block in blocks]


def test_skipped_blocks_have_reasons() -> None:
    """Every skipped example, listed for reviewers (``pytest -s``); each must say why."""
    skipped = [block for block in _all_blocks() if block.mode == "skip"]
    for block in skipped:
        print(f"skipped: {block.where()}: {block.argument or '(no reason given)'}")
    assert all(block.argument for block in skipped), [b.where() for b in skipped if not b.argument]


def test_markers_are_known_and_in_place() -> None:
    """No misspelt marker, and none that is not right before a ``python`` fence (it would do nothing)."""
    invalid = [f"{b.where()}: {b.argument}" for b in _all_blocks() if b.mode == "invalid"]
    assert not invalid, invalid
    stray = []
    for page in _pages():
        lines = page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            if _MARKER.match(line):
                following = _OPENING.match(lines[number]) if number < len(lines) else None
                language = following["info"].strip().lstrip("{.").split(" ")[0].lower() if following else ""
                if language not in _PYTHON:
                    stray.append(f"docs/{_page_name(page)}:{number}")
    assert not stray, f"markers not followed by a python fence: {stray}"


def _bindings(tree: ast.Module) -> dict[str, bool]:
    """Every name a block binds, anywhere in it; ``True`` for those an import binds."""
    bound: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound.update({(alias.asname or alias.name).partition(".")[0]: True for alias in node.names})
        elif isinstance(node, ast.ImportFrom):
            bound.update({alias.asname or alias.name: True for alias in node.names})
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.setdefault(node.name, False)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.setdefault(node.id, False)
    return bound


def test_each_example_imports_what_it_uses() -> None:
    """A reader may copy any one block: it imports every name it uses that an earlier block imported.

    What an earlier block of the page defines (a class, a function) may be used:
    the page introduces it. Imports may not be borrowed.
    """
    borrowing = []
    for page in _pages():
        imported: dict[str, bool] = {}  # each name the page has bound so far: by an import?
        for block in page_blocks(page):
            if block.mode not in ("run", "file"):
                continue
            try:
                tree = ast.parse(block.code)
            except SyntaxError:
                continue  # test_page_examples_run reports it
            own = _bindings(tree)
            used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
            if missing := sorted(name for name in used - set(own) if imported.get(name)):
                borrowing.append(f"{block.where()}: imports nothing for {', '.join(missing)}")
            imported.update(own)
    assert not borrowing, borrowing


def test_the_runner_finds_blocks_and_markers() -> None:
    """The parser itself: indented fences, markers, other languages left alone."""
    text = textwrap.dedent(
        """\
        # Page

        ```bash
        pip install openenv-anyio && openenv serve --host 127.0.0.1 \\
            my_env:MyEnv --port 8000  # a comment
        openenv demo
        ```

        <!-- docs-test: file=my_env.py -->
        ```python title="my_env.py"
        X = 1
        ```

        !!! example
            <!-- docs-test: skip (serves forever) -->
            ```python
            openenv.run(MyEnv)
            ```

        ~~~py
        await something()
        ~~~
        """
    )
    blocks = python_blocks(text, "page.md")
    assert [(b.line, b.mode, b.argument, b.code) for b in blocks] == [
        (4, "serve", "my_env:MyEnv", "openenv serve --host 127.0.0.1 my_env:MyEnv --port 8000 # a comment"),
        (11, "file", "my_env.py", "X = 1\n"),
        (17, "skip", "serves forever", "openenv.run(MyEnv)\n"),
        (21, "run", "", "await something()\n"),
    ]
    assert [b.is_async for b in blocks] == [False, False, False, True]
    assert _DOCS_ADDRESS.sub("127.0.0.1:4321", "ws://localhost:8000 http://127.0.0.1:8000/ws :80001") == (
        "ws://127.0.0.1:4321 http://127.0.0.1:4321/ws :80001"
    )
