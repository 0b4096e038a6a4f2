"""By hand, not by CI: how many of upstream OpenEnv's own environments run unchanged on openenv.core.

    python -m tests.dropin.upstream_envs --checkout DIR [--envs a,b,c] [--work /tmp/upstream-envs] \
        [--report /tmp/upstream_envs_report.md]

``DIR`` is a work tree of upstream's repository (its environments under ``envs/<name>/``, its
tests under ``tests/envs/``). Nothing of upstream's is copied here: each environment is
installed into two virtual environments under ``--work`` and run from there.

- ``up``: upstream's release (``openenv==0.10.0``) and the environment package, as its
  ``pyproject.toml`` asks.
- ``ours``: this checkout (``pip install -e '.[core]'``), then the package with
  ``--no-deps`` and its requirements less ``openenv``/``openenv-core``, so pip never puts
  upstream's ``openenv`` over ours.

Per environment:

- one server per venv as its Dockerfile starts it: ``python -m uvicorn`` with the Dockerfile's
  app (``server.app:app``, or ``<package>.server.app:app``) and its plain ``ENV`` settings, in
  the package's folder, with ``MAX_CONCURRENT_ENVS=4`` (and ``PYTHONHASHSEED=0``, so that a
  set's order is no difference between the two servers);
- ``/health``, ``/schema`` and ``/metadata`` of both servers compared;
- one scripted session of ``GenericEnvClient`` (reset with ``seed=0``, steps of a minimal action
  built from the action's JSON Schema or of `ACTIONS`'s in turn, an action with an unknown field,
  the state), run by both venvs' clients against both servers, each reply compared with
  upstream's client against upstream's server, which runs it twice: what differs between its
  own two runs is the environment's randomness;
- the package's own client (reset and one step of its action class; an ``MCPToolClient``'s
  ``list_tools`` and ``call_tool`` instead), in both venvs, against both servers;
- steps per second of one session of upstream's client against either server;
- upstream's own tests of that environment, run by either venv's python from a view of the
  checkout without its ``src/`` (upstream's own ``openenv``, which would hide the venv's).

The report is a Markdown table and a list of every difference, with the raw results as JSON
beside it. What a package needs that pip does not bring, or that this machine cannot fetch,
is set in `OUR_EXTRAS`, `EXTRA_REQUIREMENTS`, `SERVER_SETTINGS`, `ACTIONS`, `DESELECTED`,
`MORE_TEST_FILES` and `SYSTEM_PACKAGES`, each with why; the MCP environments left out are in
`MCP_LEFT_OUT`.

The same file, run by a venv's python with ``--worker MODE`` (a JSON spec on stdin, a JSON
answer on stdout), drives the clients: it imports only the standard library and that venv's
``openenv``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CANDIDATES = (
    "echo_env",
    "connect4_env",
    "maze_env",
    "grid_world_env",
    "snake_env",
    "wildfire_env",
    "chess_env",
    "coding_env",
    "textarena_env",
    "reasoning_gym_env",
    "openspiel_env",
    "atari_env",
    "dm_control_env",
    "repl_env",
)
"""The environments tried, in order: those that need no account, GPU or browser."""
MCP_LEFT_OUT = {
    "coding_tools_env": "each episode runs in an E2B cloud sandbox: reset without E2B_API_KEY ends it at once",
    "jupyter_env": "each episode runs in an E2B cloud sandbox (E2B_API_KEY, the network)",
    "terminus_env": "each episode runs in an E2B cloud sandbox (E2B_API_KEY, the network)",
    "opencode_env": "each episode runs opencode in an E2B sandbox against an LLM endpoint (E2B and model API keys)",
    "finqa_env": "its data (SEC filings and questions) is downloaded from Hugging Face; without it, reset fails",
}
"""MCP environments (an `MCPEnvironment` over FastMCP, an `MCPToolClient`) not tried, each with why."""

UPSTREAM_RELEASE = "openenv==0.10.0"
OURS = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve()
DROPPED_REQUIREMENTS = {"openenv", "openenv-core"}
"""Upstream's distributions: never installed into ``ours`` (they would put their ``openenv`` over ours)."""
OUR_EXTRAS = {"echo_env": ("mcp",)}
"""Extras of ours installed beside ``core``: upstream's openenv requires FastMCP outright, ours with ``[mcp]`` only,
and an MCP package does not declare it (echo's asks for ``openenv[core]``, FastMCP coming with it upstream)."""
EXTRA_REQUIREMENTS = {"openspiel_env": ("open_spiel",)}
"""What a package needs but does not declare (its Docker base image builds it): installed into both venvs."""
SERVER_SETTINGS = {"textarena_env": {"TEXTARENA_ENV_ID": "GuessTheNumber-v0", "TEXTARENA_DOWNLOAD_NLTK": "0"}}
"""Settings given to both servers: Wordle, textarena's default, needs NLTK's word list, which it downloads at start."""
DESELECTED = {
    "test_repl_env.py": (
        # `uv run --project .` builds an environment of its own from the package's lock file (upstream's openenv):
        # it tests neither venv, and it stops the file under -x where uv is missing.
        "tests/envs/test_repl_env.py::TestPythonExecutor::test_server_app_imports_from_env_root_without_path_rewrite",
    ),
    "test_websockets.py": (
        # connect4's tests (the file serves echo and connect4; it runs in echo's venvs): they need connect4's numpy,
        # which echo's `ours` lacks (upstream's openenv brings it, through gradio).
        "tests/envs/test_websockets.py::TestSmokeFactoryPattern::test_smoke_connect4_env_factory_pattern",
        "tests/envs/test_websockets.py::TestConnect4Environment",
        # They fail on upstream's own release too (step_count 0): an MCPToolClient is in production mode by
        # default, whose tool calls go by POST /mcp, past the environment's step, so none is counted.
        "tests/envs/test_websockets.py::TestProtocolWebSocketClient::test_protocol_client_state",
        "tests/envs/test_websockets.py::TestProtocolWebSocketClient::test_protocol_client_multiple_episodes",
    ),
}
"""Upstream's tests left out (``--deselect``), each with why."""
MORE_TEST_FILES = {"echo_env": ("test_websockets.py",)}
"""Upstream's test files given to an environment beside those `upstream_test_files` finds, each with why:
``test_websockets.py`` serves echo (most of its tests) and connect4, so it belongs to neither by the imports;
connect4's own file is skipped in its favour."""
ACTIONS: dict[str, tuple[dict[str, Any], ...]] = {
    "dm_control_env": ({"values": [0.0]},),
    "echo_env": (
        {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "Hello!"}},
        {"type": "list_tools"},
        {"type": "call_tool", "tool_name": "echo_with_length", "arguments": {"message": "Hello!"}},
        {"type": "call_tool", "tool_name": "no_such_tool", "arguments": {}},
    ),
}
"""Actions given instead of the schema's minimal one, stepped in turn (the speed and the own client take the first):
dm_control's default (no actions) fits none of its tasks (cartpole, the default task, takes one); an MCP
environment's schema is `CallToolAction`'s, whose minimal action names no tool, so its session lists the tools,
calls each and one it lacks (an error observation)."""
SYSTEM_PACKAGES = {"dm_control_env": "OSMesa (Debian's libosmesa6, as its Dockerfile installs; MUJOCO_GL=osmesa)"}
"""What a package needs from the system, not from pip: said in the report's notes (install it by hand first)."""
TEST_TOOLS = ("pytest", "pytest-asyncio", "requests", "gunicorn")
"""What upstream's tests need beside the package: its server tests start ``gunicorn`` (found on ``PATH``)."""
DOCKER_ENV_SKIPPED = {"PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "ENABLE_WEB_INTERFACE", "WORKERS", "PORT"}
"""Dockerfile ``ENV`` settings not copied to the servers (the web interface stays off on both)."""

PIP_TIMEOUT_S = 900.0
HEALTH_TIMEOUT_S = 180.0
WORKER_TIMEOUT_S = 300.0
TEST_TIMEOUT_S = 900.0
SPEED_SECONDS = 3.0
STEPS = 3
UNKNOWN_FIELD = "harness_unknown_field"
TAIL_LINES = 15

# -- the worker side: run by either venv's python, stdlib and that venv's openenv only ------------------------


def _describe(value: Any) -> Any:
    """A client's result as JSON: a pydantic model dumped, a `StepResult`'s fields, a list item by item, anything
    else as it is."""
    if isinstance(value, list):
        return [_describe(item) for item in value]
    if hasattr(value, "model_dump"):
        return {"class": type(value).__name__, **value.model_dump(mode="json")}
    if hasattr(value, "observation"):
        return {
            "observation": _describe(value.observation),
            "reward": value.reward,
            "done": value.done,
            "metadata": getattr(value, "metadata", None),
        }
    return value


def _attempt(call: Callable[[], Any]) -> Any:
    """The call's result described, or its exception as ``{"error": type, "message": text}``."""
    try:
        return _describe(call())
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)[:2000]}


def _one_call(env: Any, call: dict[str, Any]) -> Callable[[], Any]:
    if call["type"] == "reset":
        return lambda: env.reset(**call["data"])
    if call["type"] == "step":
        return lambda: env.step(call["data"])
    return lambda: env.state()


def _openenv_file() -> str:
    import openenv

    return str(openenv.__file__)


def worker_session(spec: dict[str, Any]) -> dict[str, Any]:
    """One scripted session of this venv's ``GenericEnvClient``: each call's reply or error."""
    from openenv.core.generic_client import GenericEnvClient

    client = GenericEnvClient(base_url=spec["url"], message_timeout_s=60.0)
    with client.sync() as env:
        replies = [_attempt(_one_call(env, call)) for call in spec["calls"]]
    return {"openenv": _openenv_file(), "replies": replies}


def _own_client_class(package: str) -> type:
    """The package's `EnvClient` subclass: in ``<package>.client`` first, else among the package's names."""
    import importlib

    from openenv.core.env_client import EnvClient
    from openenv.core.generic_client import GenericEnvClient

    def subclasses(module: Any) -> list[type]:
        found = [value for value in vars(module).values() if isinstance(value, type) and issubclass(value, EnvClient)]
        found = [cls for cls in found if cls not in (EnvClient, GenericEnvClient)]
        return sorted(found, key=lambda cls: cls.__module__ != module.__name__)

    for name in (f"{package}.client", package):
        found = subclasses(importlib.import_module(name))
        if found:
            return found[0]
    raise LookupError(f"no EnvClient subclass in {package}.client or {package}")


def _own_action(package: str, class_name: str | None, data: dict[str, Any]) -> Any:
    """The action, built by the package's own class (named by ``/schema``'s title) from the minimal data."""
    import importlib

    from openenv.core.env_server.types import Action

    models = importlib.import_module(f"{package}.models")
    if class_name and isinstance(getattr(models, class_name, None), type):
        cls = getattr(models, class_name)
    else:
        found = [v for v in vars(models).values() if isinstance(v, type) and issubclass(v, Action) and v is not Action]
        if not found:
            raise LookupError(f"no Action subclass in {package}.models")
        cls = found[0]
    return cls(**data)


def worker_own_client(spec: dict[str, Any]) -> dict[str, Any]:
    """The package's own client: reset (``seed=0``) and one step of its action class, against ``url``.

    An `MCPToolClient` (an MCP environment's) is driven by its own calls instead: `list_tools` and `call_tool` of
    the action's tool. Its package has no action class of its own (its actions are openenv's `ListToolsAction`
    and `CallToolAction`), and these two are what it offers: `call_tool` steps a `CallToolAction` and returns
    the tool's result, `list_tools` steps a `ListToolsAction` and returns its tools.
    """
    from openenv.core.mcp_client import MCPToolClient

    answer: dict[str, Any] = {"openenv": _openenv_file()}
    try:
        cls = _own_client_class(spec["package"])
        answer["client"] = f"{cls.__module__}.{cls.__qualname__}"
        mcp = issubclass(cls, MCPToolClient)
        action = None if mcp else _own_action(spec["package"], spec.get("action_class"), spec["action"])
        with cls(base_url=spec["url"]).sync() as env:
            answer["reset"] = _describe(env.reset(seed=0))
            if mcp:
                answer["list_tools"] = _describe(env.list_tools())
                answer["call_tool"] = _describe(
                    env.call_tool(spec["action"]["tool_name"], **spec["action"]["arguments"])
                )
            else:
                answer["step"] = _describe(env.step(action))
        answer["ok"] = True
    except Exception as exc:
        answer.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000], traceback=traceback.format_exc()[-3000:])
    return answer


def worker_speed(spec: dict[str, Any]) -> dict[str, Any]:
    """Steps per second of one ``GenericEnvClient`` session: the same action, a reset when the episode ends."""
    from openenv.core.generic_client import GenericEnvClient

    steps = 0
    with GenericEnvClient(base_url=spec["url"]).sync() as env:
        env.reset(seed=0)
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < spec["seconds"]:
            result = env.step(spec["action"])
            steps += 1
            if result.done:
                env.reset(seed=0)
    return {"openenv": _openenv_file(), "steps": steps, "seconds": elapsed, "rate": steps / elapsed}


def worker_requires(spec: dict[str, Any]) -> dict[str, Any]:
    """The distribution's requirements that apply here (no extras), less upstream's own distributions."""
    from importlib import metadata

    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

    kept, dropped = [], []
    for text in metadata.requires(spec["distribution"]) or []:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        (dropped if canonicalize_name(requirement.name) in spec["drop"] else kept).append(text)
    return {"kept": kept, "dropped": dropped}


WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "session": worker_session,
    "own-client": worker_own_client,
    "speed": worker_speed,
    "requires": worker_requires,
}

PROBE_PLUGIN = '''"""Counts a pytest run's outcomes and says which openenv it imported (written by upstream_envs.py)."""
import json, os, sys

_found = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "first_failure": None, "first_skip": None}


def _failure(report):
    if _found["first_failure"] is None:
        _found["first_failure"] = {"test": report.nodeid, "text": report.longreprtext[-4000:]}


def pytest_runtest_logreport(report):
    if report.passed and report.when == "call":
        _found["passed"] += 1
    elif report.skipped:
        _found["skipped"] += 1
        if _found["first_skip"] is None and isinstance(report.longrepr, tuple):
            _found["first_skip"] = str(report.longrepr[2])
    elif report.failed:
        _found["failed" if report.when == "call" else "errors"] += 1
        _failure(report)


def pytest_collectreport(report):
    if report.failed:
        _found["errors"] += 1
        _failure(report)


def pytest_sessionfinish(session, exitstatus):
    module = sys.modules.get("openenv")
    _found["exit"] = int(exitstatus)
    _found["openenv"] = getattr(module, "__file__", None)
    with open(os.environ["UPSTREAM_ENVS_PROBE"], "w") as out:
        json.dump(_found, out)
'''

# -- the harness side -----------------------------------------------------------------------------------------


@dataclass
class Project:
    """One environment package of the checkout, as its pyproject and Dockerfile describe it."""

    name: str
    path: Path
    distribution: str
    package: str
    requires_python: str | None
    openenv_by_url: bool
    app: str
    docker_env: dict[str, str]
    settings: dict[str, str]


@dataclass
class Install:
    """How one venv's install went."""

    ok: bool
    python: str
    seconds: float = 0.0
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for every subprocess: no PYTHONPATH or web interface, no proxy for loopback."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.pop("ENABLE_WEB_INTERFACE", None)
    env.update(PYTHONNOUSERSITE="1", PYTHONUNBUFFERED="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    env["NO_PROXY"] = env["no_proxy"] = ",".join(x for x in (env.get("NO_PROXY", ""), "127.0.0.1,localhost") if x)
    env.update(extra or {})
    return env


def tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last lines of a command's output."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run(
    cmd: list[str], timeout: float, cwd: Path, log: Path | None = None, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run a command to its end (or its timeout: exit code -1); its exit code and combined output.

    The command runs in a process group of its own, ended whole after it: what it started and
    left behind goes too (upstream's server tests kill gunicorn's master, not its worker).
    """
    process = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env or clean_env(),
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        process.kill()
        output = f"{process.communicate()[0]}\n[timed out after {timeout:.0f} s]"
        code = -1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    if log is not None:
        with log.open("a") as file:
            file.write(f"$ {' '.join(cmd)}\n{output}\n[exit {code}]\n")
    return code, output


def load_project(checkout: Path, name: str) -> Project:
    """An environment package's facts: its distribution and package, and how its Dockerfile serves it."""
    path = checkout / "envs" / name
    pyproject = tomllib.loads((path / "pyproject.toml").read_text())
    project = pyproject["project"]
    packages = pyproject.get("tool", {}).get("setuptools", {}).get("packages") or [name]
    dockerfile = path / "server" / "Dockerfile"
    text = dockerfile.read_text() if dockerfile.exists() else ""
    found = re.search(r"uvicorn[\"',\s]+([\w.]+:\w+)", text)
    app = found.group(1).removeprefix("envs.") if found else "server.app:app"
    docker_env = {}
    for key, value in re.findall(r"^ENV\s+(\w+)[=\s]\"?([^\"\s]*)\"?\s*$", text, flags=re.M):
        if key not in DOCKER_ENV_SKIPPED and "$" not in value:
            docker_env[key] = value
    by_url = any(
        re.match(r"openenv(\[[^\]]*\])?\s*@", requirement.strip()) for requirement in project.get("dependencies", [])
    )
    settings = SERVER_SETTINGS.get(name, {})
    return Project(
        name, path, project["name"], packages[0], project.get("requires-python"), by_url, app, docker_env, settings
    )


def python_versions() -> dict[str, str]:
    """Interpreters found on this machine (``python3``, ``python3.X``, pyenv's), by their version."""
    names = ["python3", *(f"python3.{minor}" for minor in range(11, 15))]
    candidates = [found for name in names if (found := shutil.which(name))]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")))
    found: dict[str, str] = {}
    for candidate in candidates:
        code, output = run([candidate, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"], 30, Path("/"))
        if code == 0 and output.strip() and output.strip() not in found:
            found[output.strip()] = candidate
    return found


def choose_python(requires_python: str | None, pythons: dict[str, str]) -> str | None:
    """The first interpreter that fits both the package's ``requires-python`` and ours (3.11 or later)."""
    from packaging.specifiers import SpecifierSet

    ours = SpecifierSet(">=3.11")
    theirs = SpecifierSet(requires_python or "")
    for version, python in pythons.items():
        if version in ours and version in theirs:
            return python
    return None


def venv_python(path: Path) -> Path:
    return path / "bin" / "python"


def pip(python: Path, arguments: list[str], log: Path, timeout: float) -> tuple[bool, str]:
    """One bounded pip call: whether it worked, and the last lines of its output."""
    code, output = run([str(python), "-m", "pip", "install", "--no-input", *arguments], timeout, log.parent, log)
    return code == 0, tail(output)


def build_venv(kind: str, project: Project, base: str, work: Path, args: argparse.Namespace) -> Install:
    """The ``up`` or ``ours`` venv of one environment, built once (reused while its marker says it worked)."""
    path = work / project.name / kind
    marker = path / ".upstream-envs-ok"
    if marker.exists() and venv_python(path).exists() and not args.rebuild:
        return Install(**json.loads(marker.read_text()))
    started = time.monotonic()
    log = work / project.name / f"pip-{kind}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    if path.exists():
        run(["rm", "-rf", str(path)], 300, work)
    code, output = run([base, "-m", "venv", str(path)], 300, work, log)
    install = Install(ok=code == 0, python=str(venv_python(path)), error=None if code == 0 else tail(output))
    if install.ok:
        steps = _up_steps(project) if kind == "up" else _our_steps(project)
        for step in steps:
            install.ok, install.error = step(venv_python(path), log, args.pip_timeout, install.notes)
            if not install.ok:
                break
    install.seconds = round(time.monotonic() - started, 1)
    if install.ok:
        marker.write_text(json.dumps(asdict(install)))
    return install


Step = Callable[[Path, Path, float, list[str]], tuple[bool, str | None]]


def _pip_step(arguments: list[str]) -> Step:
    def step(python: Path, log: Path, timeout: float, notes: list[str]) -> tuple[bool, str | None]:
        ok, output = pip(python, arguments, log, timeout)
        return ok, None if ok else f"pip install {' '.join(arguments)}:\n{output}"

    return step


def _requirements_step(project: Project, more: list[str]) -> Step:
    """Install the package's requirements less upstream's distributions, read from its installed metadata."""

    def step(python: Path, log: Path, timeout: float, notes: list[str]) -> tuple[bool, str | None]:
        spec = {"distribution": project.distribution, "drop": sorted(DROPPED_REQUIREMENTS)}
        answer = run_worker(python, "requires", spec, log.parent)
        if "error" in answer:
            return False, f"reading the requirements: {answer['error']}"
        notes.append(f"dropped {answer['dropped']}")
        wanted = [*answer["kept"], *more]
        return _pip_step(wanted)(python, log, timeout, notes) if wanted else (True, None)

    return step


def _up_steps(project: Project) -> list[Step]:
    extra = list(EXTRA_REQUIREMENTS.get(project.name, ()))
    if not project.openenv_by_url:
        return [_pip_step([UPSTREAM_RELEASE, str(project.path), *extra])]

    def noted(python: Path, log: Path, timeout: float, notes: list[str]) -> tuple[bool, str | None]:
        notes.append("openenv is required from a git URL: installed as the release instead, the rest as declared")
        return _pip_step(["--no-deps", str(project.path)])(python, log, timeout, notes)

    release = f"openenv[core]{UPSTREAM_RELEASE.removeprefix('openenv')}"
    return [noted, _requirements_step(project, [release, *extra])]


def _our_steps(project: Project) -> list[Step]:
    extra = list(EXTRA_REQUIREMENTS.get(project.name, ()))
    extras = ",".join(("core", *OUR_EXTRAS.get(project.name, ())))

    def ours_installed(python: Path, log: Path, timeout: float, notes: list[str]) -> tuple[bool, str | None]:
        if extras != "core":
            notes.append(f"ours installed with [{extras}]")
        return _pip_step(["-e", f"{OURS}[{extras}]"])(python, log, timeout, notes)

    def ours_kept(python: Path, log: Path, timeout: float, notes: list[str]) -> tuple[bool, str | None]:
        code, output = run([str(python), "-c", "import openenv; print(openenv.__file__)"], 60, log.parent)
        where = output.strip().splitlines()[-1] if output.strip() else output
        if code != 0 or not where.startswith(str(OURS)):
            return False, f"openenv is not ours after the install: {where}"
        return True, None

    return [
        ours_installed,
        _pip_step(["--no-deps", str(project.path)]),
        _requirements_step(project, extra),
        ours_kept,
    ]


def run_worker(
    python: Path | str, mode: str, spec: dict[str, Any], cwd: Path, timeout: float = WORKER_TIMEOUT_S
) -> Any:
    """Run this file as a worker with a venv's python: its JSON answer, or ``{"error": ...}``."""
    try:
        done = subprocess.run(
            [str(python), str(WORKER), "--worker", mode],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            cwd=cwd,
            timeout=timeout,
            env=clean_env(),
        )
    except subprocess.TimeoutExpired:
        return {"error": f"the {mode} worker timed out after {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": tail(done.stderr or done.stdout, 25) or f"exit {done.returncode}"}
    return json.loads(lines[-1])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def http_get(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """A GET's status and JSON body (or its text)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status, body = response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read().decode(errors="replace")
    try:
        return {"status": status, "body": json.loads(body)}
    except ValueError:
        return {"status": status, "body": body}


@contextlib.contextmanager
def serving(python: str, project: Project, log: Path) -> Iterator[str]:
    """A server of the package, started as its Dockerfile starts it; its URL. Stopped on the way out."""
    port = free_port()
    settings = {**project.docker_env, **project.settings, "PYTHONPATH": str(project.path), "MAX_CONCURRENT_ENVS": "4"}
    env = clean_env({**settings, "PYTHONHASHSEED": "0"})  # a set's order the same in both servers (repl's names)
    command = [python, "-m", "uvicorn", project.app, "--host", "127.0.0.1", "--port", str(port)]
    with log.open("w") as output:
        process = subprocess.Popen(
            command, cwd=project.path, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(process, url, log)
        yield url
    finally:
        _stop(process)


def _wait_healthy(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}):\n{tail(log.read_text(), 25)}")
        with contextlib.suppress(OSError, ValueError):
            if http_get(f"{url}/health", timeout=2.0)["status"] == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"no healthy /health within {HEALTH_TIMEOUT_S:.0f} s:\n{tail(log.read_text(), 25)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the server this harness started: SIGTERM, then SIGKILL to the process group it was started in."""
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
    with contextlib.suppress(ProcessLookupError):  # what is left of its group: the server, or its children
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


# -- comparing ------------------------------------------------------------------------------------------------


def same_shape(theirs: Any, ours: Any) -> bool:
    """Whether two JSON values have the same structure: the same keys, and values of the same types.

    Lists are compared by their first items (an empty list fits any list), so a board or a list
    of legal moves that differs from one episode to the next still has the same shape.
    """
    if isinstance(theirs, dict) and isinstance(ours, dict):
        return theirs.keys() == ours.keys() and all(same_shape(theirs[key], ours[key]) for key in theirs)
    if isinstance(theirs, list) and isinstance(ours, list):
        return not theirs or not ours or same_shape(theirs[0], ours[0])
    return type(theirs) is type(ours)


def json_diff(theirs: Any, ours: Any, path: str = "$", limit: int = 8) -> list[str]:
    """Where two JSON values differ (at most ``limit`` paths)."""
    if theirs == ours:
        return []
    if isinstance(theirs, dict) and isinstance(ours, dict):
        found: list[str] = []
        for key in sorted(set(theirs) | set(ours)):
            if key not in ours:
                found.append(f"{path}.{key}: only upstream's")
            elif key not in theirs:
                found.append(f"{path}.{key}: only ours")
            else:
                found += json_diff(theirs[key], ours[key], f"{path}.{key}", limit)
        return found[:limit]
    if isinstance(theirs, list) and isinstance(ours, list) and len(theirs) == len(ours):
        found = []
        for index, (a, b) in enumerate(zip(theirs, ours, strict=True)):
            found += json_diff(a, b, f"{path}[{index}]", limit)
        return found[:limit]
    return [f"{path}: upstream {short(theirs, 160)} / ours {short(ours, 160)}"]


def short(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, sort_keys=True, default=repr)
    return text if len(text) <= limit else text[:limit] + "..."


def error_code(reply: Any) -> str | None:
    if isinstance(reply, dict) and "error" in reply:
        found = re.search(r"\(code: (\w+)\)", reply.get("message", ""))
        return found.group(1) if found else reply["error"]
    return None


def classify(reference: Any, other: Any) -> str:
    """``exact``, ``shape`` (same keys and types, or the same error code) or ``different``."""
    if reference == other:
        return "exact"
    if error_code(reference) is not None or error_code(other) is not None:
        return "shape" if error_code(reference) == error_code(other) else "different"
    return "shape" if same_shape(reference, other) else "different"


REFERENCE = "up client -> up server"
AGAIN = "up client -> up server, again"
"""Upstream's session run twice on upstream's server: the replies that differ between them vary by themselves."""


def compare_sessions(calls: list[dict[str, Any]], runs: dict[str, Any]) -> dict[str, Any]:
    """Each run's replies against upstream's client on upstream's server: the counts, and each difference.

    A difference at a reply that also differs between upstream's two runs (`AGAIN`) is marked
    ``varies_on_upstream``: the environment's own randomness (an episode id, an unseeded start).
    """
    reference = runs.get(REFERENCE, {}).get("replies")
    again = runs.get(AGAIN, {}).get("replies") or []
    varying = {index for index, (a, b) in enumerate(zip(reference or [], again, strict=False)) if a != b}
    summary: dict[str, Any] = {}
    for label, run_ in runs.items():
        if label == REFERENCE:
            continue
        if reference is None or "replies" not in run_:
            summary[label] = {"error": run_.get("error") or "no reference session"}
            continue
        counts = {"exact": 0, "shape": 0, "different": 0}
        differences = []
        for index, (call, theirs, ours) in enumerate(zip(calls, reference, run_["replies"], strict=False)):
            kind = classify(theirs, ours)
            counts[kind] += 1
            if kind != "exact":
                where = json_diff(theirs, ours)
                differences.append({"call": call, "kind": kind, "where": where, "varies_on_upstream": index in varying})
        varies = sum(item["varies_on_upstream"] for item in differences)
        summary[label] = {**counts, "varies_on_upstream": varies, "differences": differences}
    return summary


def compare_own_clients(runs: dict[str, Any]) -> dict[str, Any]:
    """Each run of the package's own client against upstream's client on upstream's server: reset, then step
    (an `MCPToolClient`'s: reset, `list_tools`, `call_tool`)."""
    reference = runs.get("up client -> up server", {})
    calls = [call for call in ("reset", "step", "list_tools", "call_tool") if call in reference]
    found: dict[str, Any] = {}
    for label, run_ in runs.items():
        if label != "up client -> up server" and reference.get("ok") and run_.get("ok"):
            kinds = {call: classify(reference[call], run_.get(call)) for call in calls}
            where = {
                call: json_diff(reference[call], run_.get(call)) for call, kind in kinds.items() if kind != "exact"
            }
            found[label] = {"kinds": kinds, "where": where}
    return found


# -- one environment ------------------------------------------------------------------------------------------


def session_calls(actions: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """The scripted session: reset, a few steps of the actions in turn (the minimal one, or `ACTIONS`), the first
    with an unknown field, the state."""
    calls: list[dict[str, Any]] = [{"type": "reset", "data": {"seed": 0}}]
    if actions:
        calls += [{"type": "step", "data": actions[index % len(actions)]} for index in range(max(STEPS, len(actions)))]
        calls.append({"type": "step", "data": {**actions[0], UNKNOWN_FIELD: 1}})
    calls.append({"type": "state"})
    return calls


def minimal_action_of(schema: Any) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """The minimal action of ``/schema``'s action schema, its class's name (the title), and why none."""
    from transports.bench import SchemaActionError, minimal_action

    action_schema = schema.get("action") if isinstance(schema, dict) else None
    if not isinstance(action_schema, dict):
        return None, None, "no action schema at /schema"
    try:
        return minimal_action(action_schema), action_schema.get("title"), None
    except SchemaActionError as exc:
        return None, action_schema.get("title"), f"no minimal action: {exc}"


def compare_routes(urls: dict[str, str]) -> dict[str, Any]:
    """``/health``, ``/schema`` and ``/metadata`` of both servers: equal, or where they differ."""
    found: dict[str, Any] = {}
    for route in ("/health", "/schema", "/metadata"):
        theirs, ours = http_get(urls["up"] + route), http_get(urls["ours"] + route)
        found[route] = {"equal": theirs == ours, "up": theirs, "ours": ours, "where": json_diff(theirs, ours)}
    return found


def drive_servers(project: Project, installs: dict[str, Install], work: Path) -> dict[str, Any]:
    """Start both servers and run every client comparison against them; the servers are stopped after."""
    result: dict[str, Any] = {"servers": {}}
    pythons = {kind: installs[kind].python for kind in ("up", "ours")}
    logs = {kind: work / project.name / f"server-{kind}.log" for kind in pythons}
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        for kind, python in pythons.items():
            try:
                urls[kind] = stack.enter_context(serving(python, project, logs[kind]))
                result["servers"][kind] = "ok"
            except RuntimeError as exc:
                result["servers"][kind] = str(exc)
        if set(urls) != {"up", "ours"}:
            return result
        result["routes"] = compare_routes(urls)
        action, action_class, why = minimal_action_of(result["routes"]["/schema"]["up"]["body"])
        actions = ACTIONS.get(project.name) or ((action,) if action is not None else ())
        action = actions[0] if actions else None
        result.update(action=action, action_class=action_class, action_note=None if project.name in ACTIONS else why)
        calls = session_calls(actions)
        result["calls"] = calls
        result["sessions"] = {
            f"{client} client -> {server} server": run_worker(
                pythons[client], "session", {"url": url, "calls": calls}, work
            )
            for client in ("up", "ours")
            for server, url in urls.items()
        }
        result["sessions"][AGAIN] = run_worker(pythons["up"], "session", {"url": urls["up"], "calls": calls}, work)
        result["replies"] = compare_sessions(calls, result["sessions"])
        spec = {"package": project.package, "action_class": action_class, "action": action or {}}
        result["own_client"] = {
            f"{client} client -> {server} server": run_worker(pythons[client], "own-client", {**spec, "url": url}, work)
            for client in ("up", "ours")
            for server, url in urls.items()
        }
        result["own_client_replies"] = compare_own_clients(result["own_client"])
        if action is not None:
            result["speed"] = {
                server: run_worker(
                    pythons["up"], "speed", {"url": url, "action": action, "seconds": SPEED_SECONDS}, work
                )
                for server, url in urls.items()
            }
    return result


def upstream_test_files(checkout: Path, name: str, names: list[str]) -> list[Path]:
    """Upstream's tests of one environment.

    A file ``tests/envs/test_<stem>*.py`` belongs to the environment whose stem (its name less
    ``_env``) is the longest to fit; a file that fits none belongs to the one environment it
    imports, if it imports exactly one (``envs.<name>`` or ``<name>``).
    """
    stems = {n: n.removesuffix("_env") for n in names}
    found = []
    for path in sorted((checkout / "tests" / "envs").glob("test_*.py")):
        owners = [n for n, stem in stems.items() if path.stem.removeprefix("test_").startswith(stem)]
        if not owners:
            text = path.read_text()
            owners = [n for n in names if re.search(rf"^\s*(from|import) (envs\.)?{n}\b", text, flags=re.M)]
            owners = owners if len(owners) == 1 else []
        mine = bool(owners) and max(owners, key=lambda n: len(stems[n])) == name
        if mine or path.name in MORE_TEST_FILES.get(name, ()):
            found.append(path)
    return found


def test_root(checkout: Path, work: Path) -> Path:
    """The checkout as upstream's tests see it, less ``src/``: a folder of links to everything else.

    ``src/`` holds upstream's own ``openenv``; its tests put it first on ``sys.path`` (and on the
    ``PYTHONPATH`` of the servers they start), which would hide the venv's: ours, or the 0.10.0
    release. Through these links, that path names nothing.
    """
    root = work / "test-root"
    root.mkdir(parents=True, exist_ok=True)
    for entry in checkout.iterdir():
        link = root / entry.name
        if entry.name != "src" and not link.is_symlink():
            link.symlink_to(entry)
    return root


def run_tests(python: str, files: list[Path], root: Path, work: Path, kind: str) -> dict[str, Any]:
    """Upstream's tests of the environment with one venv's python, file by file: counts and the first failure.

    Each file runs from `test_root` (the checkout without ``src/``), with that root on
    ``PYTHONPATH`` (its tests import ``envs.<name>``) and the venv's ``bin`` first on ``PATH``
    (its server tests start ``gunicorn``). A probe plugin counts the outcomes and says which
    ``openenv`` each run imported.
    """
    totals: dict[str, Any] = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "first_failure": None, "files": {}}
    ok, output = pip(Path(python), list(TEST_TOOLS), work / f"pip-{kind}.log", PIP_TIMEOUT_S)
    if not ok:
        return {**totals, "errors": 1, "first_failure": {"file": "-", "test": "pip install", "text": output}}
    plugins = work / "plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "upstream_envs_probe.py").write_text(PROBE_PLUGIN)
    path_env = os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")])
    for path in files:
        probe = work / f"probe-{kind}-{path.stem}.json"
        probe.unlink(missing_ok=True)
        pythonpath = os.pathsep.join([str(plugins), str(root)])
        env = clean_env({"PYTHONPATH": pythonpath, "PATH": path_env, "UPSTREAM_ENVS_PROBE": str(probe)})
        command = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "upstream_envs_probe"]
        deselected = [f"--deselect={test}" for test in DESELECTED.get(path.name, ())]
        code, output = run([*command, *deselected, f"tests/envs/{path.name}"], TEST_TIMEOUT_S, root, env=env)
        found = json.loads(probe.read_text()) if probe.exists() else {"errors": 1, "exit": code}
        if not probe.exists():
            found["first_failure"] = {"test": path.name, "text": tail(output, 25)}
        keys = ("passed", "failed", "skipped", "errors", "exit", "first_skip", "openenv")
        totals["files"][path.name] = {key: found.get(key) for key in keys} | {"deselected": len(deselected)}
        for key in ("passed", "failed", "skipped", "errors"):
            totals[key] += found.get(key) or 0
        if totals["first_failure"] is None and found.get("first_failure"):
            totals["first_failure"] = {"file": path.name, **found["first_failure"]}
    return totals


def run_project(project: Project, args: argparse.Namespace, pythons: dict[str, str]) -> dict[str, Any]:
    """Everything measured for one environment."""
    started = time.monotonic()
    result: dict[str, Any] = {"name": project.name, "project": {**asdict(project), "path": str(project.path)}}
    base = choose_python(project.requires_python, pythons)
    if base is None:
        result["skipped"] = f"no interpreter here fits requires-python {project.requires_python} and ours (>=3.11)"
        return result
    result["base_python"] = base
    installs = {kind: build_venv(kind, project, base, args.work, args) for kind in ("up", "ours")}
    result["installs"] = {kind: asdict(install) for kind, install in installs.items()}
    if all(install.ok for install in installs.values()):
        result.update(drive_servers(project, installs, args.work))
    files = upstream_test_files(args.checkout, project.name, sorted(p.name for p in (args.checkout / "envs").iterdir()))
    result["test_files"] = [path.name for path in files]
    if files and not args.skip_tests:
        root = test_root(args.checkout, args.work)
        result["tests"] = {
            kind: run_tests(install.python, files, root, args.work / project.name, kind)
            for kind, install in installs.items()
            if install.ok
        }
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


# -- the report -----------------------------------------------------------------------------------------------


def cause(text: str | None) -> str:
    """The line of an error's text that says why: a missing module or name, else its last exception line."""
    if not text:
        return ""
    for pattern in (r"No module named '[^']+'", r"cannot import name '[^']+' from '[^']+'"):
        found = re.search(pattern, text)
        if found:
            return found.group(0)
    cleaned = (re.sub(r"^E\s+", "", line.strip()).strip(" *") for line in text.strip().splitlines())
    lines = [line for line in cleaned if line]  # less pytest's "E   " and NLTK's rows of stars
    errors = [index for index, line in enumerate(lines) if re.match(r"^[\w.]+(Error|Exception|Exit)\b", line)]
    if not errors:
        return lines[-1][:300]
    found = lines[errors[-1]]
    if found.endswith(":") and errors[-1] + 1 < len(lines):  # the message on the lines after (NLTK's, say)
        found += " " + lines[errors[-1] + 1]
    return found[:300]


def _installs_cell(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return "skipped"
    installs = result["installs"]
    return " / ".join(f"{kind} {'ok' if installs[kind]['ok'] else 'FAILED'}" for kind in ("up", "ours"))


def _routes_cell(result: dict[str, Any]) -> str:
    routes = result.get("routes")
    if not routes:
        return "-"
    return ", ".join(f"{route.strip('/')} {'=' if found['equal'] else '≠'}" for route, found in routes.items())


def _replies_cell(result: dict[str, Any]) -> str:
    labels = (
        ("up client -> ours server", "up→ours"),
        ("ours client -> ours server", "ours→ours"),
        (AGAIN, "up→up again"),
    )
    cells = []
    for label, short_label in labels:
        found = result.get("replies", {}).get(label)
        if found is None:
            continue
        if "error" in found:
            cells.append(f"{short_label} error")
            continue
        varies = f" ({found['varies_on_upstream']} vary on upstream)" if found.get("varies_on_upstream") else ""
        cells.append(f"{short_label} {found['exact']}/{found['shape']}/{found['different']}{varies}")
    return "; ".join(cells) or "-"


def _own_client_cell(result: dict[str, Any]) -> str:
    own = result.get("own_client")
    if not own:
        return "-"
    compared = result.get("own_client_replies", {})

    def cell(client: str) -> str:
        label = f"{client} client -> ours server"
        if not own[label].get("ok"):
            return "FAIL"
        kinds = set(compared.get(label, {}).get("kinds", {}).values())
        return "ok" + ("" if not kinds or kinds == {"exact"} else " (" + "/".join(sorted(kinds - {"exact"})) + ")")

    return " / ".join(cell(client) for client in ("up", "ours"))


def _speed_cell(result: dict[str, Any]) -> str:
    speed = result.get("speed")
    if not speed:
        return "-"
    rates = {server: speed[server].get("rate") for server in ("up", "ours")}
    if None in rates.values():
        return " / ".join(f"{s} {'error' if r is None else f'{r:.0f}'}" for s, r in rates.items())
    return f"{rates['up']:.0f} vs {rates['ours']:.0f} (x{rates['ours'] / rates['up']:.2f})"


def _tests_cell(result: dict[str, Any]) -> str:
    tests = result.get("tests")
    if not tests:
        return "none" if not result.get("test_files") else "-"

    def counts(kind: str) -> str:
        found = tests.get(kind)
        if found is None:
            return "-"
        return f"{found['passed']}p {found['failed']}f {found['skipped']}s {found['errors']}e"

    return f"{counts('ours')} vs {counts('up')}"


def _notes_cell(result: dict[str, Any]) -> str:
    notes = [f"needs {SYSTEM_PACKAGES[result['name']]}"] if result["name"] in SYSTEM_PACKAGES else []
    if result["name"] in OUR_EXTRAS:
        notes.append(f"ours installed with [{','.join(('core', *OUR_EXTRAS[result['name']]))}] (see OUR_EXTRAS)")
    if "skipped" in result:
        notes.append(result["skipped"])
    for kind, install in result.get("installs", {}).items():
        if not install["ok"]:
            notes.append(f"{kind} install: {cause(install['error'])}")
    servers = result.get("servers", {})
    if servers and all(state != "ok" for state in servers.values()):
        notes.append("skipped: neither server starts here")
    for kind, state in servers.items():
        if state != "ok":
            notes.append(f"{kind} server: {cause(state)}")
    for label, found in result.get("own_client", {}).items():
        if not found.get("ok"):
            notes.append(f"own {label}: {cause(found.get('error'))}")
    if result.get("action_note"):
        notes.append(result["action_note"])
    failure = (result.get("tests", {}).get("ours") or {}).get("first_failure")
    if failure:
        notes.append(f"ours' first test failure: {cause(failure['text'])}")
    notes += [f"{name} ran {where}" for name, where in foreign_openenv(result)]
    files = (result.get("tests", {}).get("ours") or {}).get("files", {})
    notes += [f"{found['deselected']} of {name} deselected" for name, found in files.items() if found.get("deselected")]
    return "; ".join(note.replace("|", "\\|").replace("\n", " ") for note in notes)


def foreign_openenv(result: dict[str, Any]) -> list[tuple[str, str]]:
    """Upstream's test files that, on ours, imported another ``openenv`` than ours (upstream's ``src/``, say)."""
    files = (result.get("tests", {}).get("ours") or {}).get("files", {})
    return [
        (name, f"openenv from {found['openenv']}")
        for name, found in files.items()
        if found.get("openenv") and not found["openenv"].startswith(str(OURS))
    ]


def render_report(results: list[dict[str, Any]], args: argparse.Namespace, seconds: float) -> str:
    """The Markdown report: the table, then every difference found."""
    lines = [
        "# Upstream OpenEnv's environments on openenv.core",
        "",
        f"Checkout: `{args.checkout}`; run took {seconds / 60:.1f} min. Replies are `exact/shape/different`"
        " against upstream's client on upstream's server (up→ours: upstream 0.10.0's GenericEnvClient against"
        " our server; ours→ours: ours against ours; up→up again: upstream's own session run a second time,"
        " the environment's own randomness). Shape: the same keys and types, or the same error code."
        " Own client: the package's client (reset + one step; an MCP client's reset, list_tools and call_tool)"
        " against our server, run on upstream / on ours"
        " (in brackets: how its results compare with upstream's client on upstream's server)."
        " Tests: `ours vs up`, passed/failed/skipped/errors (pytest -x, so a failure stops a file).",
        "",
        "| env | installs | schema/metadata equal | replies (exact/shape/different) | own client up/ours"
        " | steps/s up vs ours (ratio) | upstream tests ours vs up | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        cells = [
            result["name"],
            _installs_cell(result),
            _routes_cell(result),
            _replies_cell(result),
            _own_client_cell(result),
            _speed_cell(result),
            _tests_cell(result),
            _notes_cell(result),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Differences", ""]
    for result in results:
        found = list(differences(result))
        if found:
            lines += [f"### {result['name']}", "", *(f"- {item}" for item in found), ""]
    return "\n".join(lines) + "\n"


def differences(result: dict[str, Any]) -> Iterator[str]:
    """Every difference of one environment, each with what it showed."""
    for kind, install in result.get("installs", {}).items():
        if not install["ok"]:
            yield f"{kind} install failed: ```{tail(install['error'] or '', 6)}```".replace("\n", " ⏎ ")
    for kind, state in result.get("servers", {}).items():
        if state != "ok":
            yield f"{kind} server did not start: {cause(state)}"
    for route, found in result.get("routes", {}).items():
        if not found["equal"]:
            yield f"GET {route} differs: " + "; ".join(found["where"])
    for label, found in result.get("replies", {}).items():
        if "error" in found:
            yield f"session {label}: {cause(found['error'])}"
        for item in found.get("differences", []) if label != AGAIN else []:
            call = item["call"]["type"] + (" (unknown field)" if UNKNOWN_FIELD in item["call"].get("data", {}) else "")
            varies = " (varies between upstream's own two runs too)" if item.get("varies_on_upstream") else ""
            yield f"session {label}, {call}: {item['kind']}{varies}: " + "; ".join(item["where"])
    for label, found in result.get("own_client", {}).items():
        if not found.get("ok"):
            yield f"own client, {label}: {found.get('error')}"
    for label, found in result.get("own_client_replies", {}).items():
        for call, where in found["where"].items():
            yield f"own client, {label}, {call}: {found['kinds'][call]}: " + "; ".join(where)
    for server, found in (result.get("speed") or {}).items():
        if "error" in found:
            yield f"speed against {server}'s server: {cause(found['error'])}"
    for kind, found in result.get("tests", {}).items():
        failure = found.get("first_failure")
        if failure:
            where = failure["test"] if "::" in failure["test"] else f"{failure.get('file')}::{failure['test']}"
            yield f"upstream tests on {kind}: first failure {where}: {cause(failure['text'])}"
    for name, found in (result.get("tests", {}).get("ours") or {}).get("files", {}).items():
        if found.get("first_skip"):
            up = (result["tests"].get("up") or {}).get("files", {}).get(name, {})
            same = "the same on upstream" if up.get("first_skip") == found["first_skip"] else f"upstream: {up}"
            yield f"upstream tests on ours: {name} skipped {found['skipped']}: {found['first_skip']} ({same})"
    for name, where in foreign_openenv(result):
        yield f"upstream tests on ours: {name} ran {where}, not ours (it puts upstream's src/ first on sys.path)"


# -- the command line -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, help="a work tree of upstream OpenEnv's repository")
    parser.add_argument("--envs", default=",".join(CANDIDATES), help="environments to try, comma-separated")
    parser.add_argument("--work", type=Path, default=Path("/tmp/upstream-envs"), help="where the venvs live")
    parser.add_argument("--report", type=Path, default=Path("/tmp/upstream_envs_report.md"))
    parser.add_argument("--rebuild", action="store_true", help="build the venvs again even where they worked")
    parser.add_argument("--skip-tests", action="store_true", help="do not run upstream's tests")
    parser.add_argument("--pip-timeout", type=float, default=PIP_TIMEOUT_S, help="seconds for each pip call")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is None and args.checkout is None:
        parser.error("--checkout is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](json.load(sys.stdin)), default=repr))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the servers and pip calls are ended on the way out
    args.checkout, args.work = args.checkout.resolve(), args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    pythons = python_versions()
    results: list[dict[str, Any]] = []
    for name in [n.strip() for n in args.envs.split(",") if n.strip()]:
        print(f"[{time.strftime('%H:%M:%S')}] {name}", flush=True)
        try:
            result = run_project(load_project(args.checkout, name), args, pythons)
        except Exception:
            result = {"name": name, "skipped": f"the harness failed: {traceback.format_exc()[-1500:]}"}
        results.append(result)
        args.report.with_suffix(".json").write_text(json.dumps(results, indent=1, default=repr))
    seconds = time.monotonic() - started
    args.report.write_text(render_report(results, args, seconds))
    print(f"wrote {args.report} and {args.report.with_suffix('.json')} in {seconds / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
