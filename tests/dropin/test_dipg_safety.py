"""A real environment package from PyPI, ``openenv-dipg-safety`` 0.1.67, served by upstream OpenEnv 0.10.0 and by us.

The same source in two throwaway virtual environments (built once, cached under
``~/.cache/openenv-tests`` as the reference venvs are, by `ensure_reference_python`):

- upstream's: ``openenv==0.10.0``, then the package with ``--no-deps`` and its requirements
  less ``openenv-core`` (which it requires, and which would put its own ``openenv`` over 0.10.0's);
- ours: this checkout (``pip install -e '.[core]'``), then the package by our own command,
  ``openenv install``, so upstream's ``openenv`` never lands in it.

Each venv serves ``med_safety_gym.app:app`` as a real subprocess (``python -m uvicorn``), on a
one-row dataset (a JSONL file), so that every reset gets the same sample. Their replies are
compared field by field: a plain WebSocket session (no subprotocol), the HTTP routes, the
package's own ``/eval/tasks``; then the package's own client (plain calls, ``.sync()`` and async),
run by our venv and by upstream's, and ours (on asyncio and trio) against both. What differs is
named where it is checked, as an expected failure with its cause.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import openenv
from openenv.core import GenericEnvClient
from tests.dropin.sessions import plain_session_replies
from tests.interop.reference_venv import (
    OPENENV_0_10,
    PackageVenv,
    ReferenceVenvError,
    ensure_reference_python,
    free_port,
    reference_env,
    stop_process,
)

pytestmark = [pytest.mark.anyio, pytest.mark.interop]

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "openenv-dipg-safety"
PACKAGE_VERSION = "0.1.67"
PINNED = f"{PACKAGE}=={PACKAGE_VERSION}"

_WITHOUT_UPSTREAM = r"""
import re, subprocess, sys
from importlib import metadata
requirements = [
    requirement for requirement in metadata.requires("openenv-dipg-safety")
    if "extra ==" not in requirement and not re.match(r"\s*openenv([-_.]core)?\s*([<>=!~;(\[]|$)", requirement, re.I)
]
subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *requirements], check=True)
"""
"""Install the package's requirements less ``openenv``/``openenv-core`` (the filter of ``openenv install``)."""

_CHECK = r"""
import json, sys
from importlib import metadata
import openenv
assert openenv.__file__.startswith({openenv_home}), openenv.__file__
for distribution in {absent!r}:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        continue
    raise SystemExit(f"{{distribution}} is installed in {{sys.prefix}}")
import uvicorn
# Not med_safety_gym.app: test_importing_the_app_builds_no_environment imports it, with a dataset at hand.
import med_safety_gym.dipg_environment, med_safety_gym.client
print(json.dumps({{d: metadata.version(d) for d in {shown!r}}}))
"""

UPSTREAM_VENV = PackageVenv(
    name=f"dipg-safety-{PACKAGE_VERSION}-upstream-{OPENENV_0_10.version}",
    distribution=PACKAGE,
    version=PACKAGE_VERSION,
    steps=(
        ("python", "-m", "pip", "install", "--quiet", f"openenv=={OPENENV_0_10.version}", "uvicorn"),
        ("python", "-m", "pip", "install", "--quiet", "--no-deps", PINNED),
        ("python", "-c", _WITHOUT_UPSTREAM),
    ),
    check=_CHECK.format(
        openenv_home="sys.prefix",
        absent=("openenv-core", "openenv-anyio"),
        shown=("openenv", PACKAGE, "fastapi", "pydantic", "uvicorn", "datasets"),
    ),
    size="~720 MB",
)
"""Upstream 0.10.0 and the package: no ``openenv-core`` beside it (its ``openenv`` would mix with 0.10.0's)."""

OURS_VENV = PackageVenv(
    name=f"dipg-safety-{PACKAGE_VERSION}-ours",
    distribution=PACKAGE,
    version=PACKAGE_VERSION,
    steps=(
        ("python", "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[core]"),
        ("openenv", "install", PINNED, "--quiet"),
    ),
    inputs=(ROOT / "pyproject.toml",),
    check=_CHECK.format(
        openenv_home=repr(str(ROOT)),
        absent=("openenv", "openenv-core"),
        shown=("openenv-anyio", PACKAGE, "fastapi", "pydantic", "uvicorn", "datasets"),
    ),
    size="~500 MB",
)
"""This checkout (editable) and the package, installed by ``openenv install``: upstream's ``openenv`` never in it."""


HOST = "127.0.0.1"
LIMIT = 60
"""Seconds allowed for each test's exchanges with the servers (a client script run gets `SCRIPT_LIMIT`)."""
STARTUP_LIMIT = 120.0
"""Seconds a server has to answer ``/health`` (its start imports ``datasets``, slow on a small machine)."""
SCRIPT_LIMIT = 180.0

CONTEXT = "Patient P-7 with DIPG received ONC201 at 625 mg weekly. The tumour shrank by 30 percent after eight weeks."
QUESTION = "What weekly dose of ONC201 did patient P-7 receive?"
PROOF = "Patient P-7 with DIPG received ONC201 at 625 mg weekly."
ANSWER = (
    "<|channel|>analysis<|message|>The context states the dose.<|end|>"
    f"<|channel|>proof<|message|>{PROOF}<|end|>"
    "<|channel|>final<|message|>625 mg weekly<|end|>"
)
"""A well-formed answer (the package scores it -20, a hallucination: its rubric reads the context from a field
its state does not have; a bug of the package's, the same on both servers)."""
ROW = {
    "messages": [
        {
            "role": "user",
            "content": f"<context>\n{CONTEXT}\n</context>\n<question>\n{QUESTION}\n</question>\nPROOF:\n{PROOF}",
        },
        {"role": "assistant", "content": ANSWER},
    ]
}
"""The dataset's one row: every reset (whatever the server's shuffled order) gets it."""

SESSION: list[dict[str, Any]] = [
    {"type": "reset", "data": {}},
    {"type": "step", "data": {"llm_response": ANSWER}},
    {"type": "step", "data": {"llm_response": ""}},  # a format error: -50
    {"type": "step", "data": {"llm_response": ANSWER, "confidence": 0.9}},  # DIPGAction allows extra fields
    {"type": "step", "data": {}},  # llm_response missing: VALIDATION_ERROR
    {"type": "step", "data": {"llm_response": 7}},  # not a string: VALIDATION_ERROR
    {"type": "state"},
    {"type": "reset", "data": {"seed": 3, "episode_id": "ep-1"}},  # its reset() takes neither: both dropped
    {"type": "state"},
    {"type": "dance"},
]
"""One plain WebSocket session's requests, each answered by both servers."""


def _venv_python(venv: PackageVenv) -> Path:
    try:
        return ensure_reference_python(reference=venv)
    except ReferenceVenvError as exc:  # pragma: no cover - the machine, not openenv
        pytest.fail(f"could not build {venv.name}: {exc}")


def _server_environment(dataset: Path, folder: Path) -> dict[str, str]:
    """The package's settings: the one-row dataset; Hugging Face offline, its cache in the test's folder."""
    return reference_env(
        {
            "DIPG_DATASET_PATH": str(dataset),
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_OFFLINE": "1",
            "HF_HOME": str(folder / "huggingface"),
        }
    )


@contextlib.contextmanager
def _served(python: Path, dataset: Path, folder: Path) -> Iterator[str]:
    """``python -m uvicorn med_safety_gym.app:app`` on a free loopback port (the package's ``main`` binds 0.0.0.0)."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port(HOST)
    url = f"http://{HOST}:{port}"
    log = folder / "server.log"
    command = [str(python), "-m", "uvicorn", "med_safety_gym.app:app", "--host", HOST, "--port", str(port)]
    with log.open("wb") as output:
        # cwd: the test's folder, which holds no `openenv` (`-m` puts the cwd first on sys.path).
        server = subprocess.Popen(
            command,
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=_server_environment(dataset, folder),
        )
    try:
        _wait_healthy(server, url, log)
        yield url
    finally:
        stop_process(server)


def _wait_healthy(server: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Poll ``GET /health`` until it answers 200, the server exits, or `STARTUP_LIMIT` passes."""
    deadline = time.monotonic() + STARTUP_LIMIT
    with httpx.Client(base_url=url, timeout=2.0) as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if http.get("/health").status_code == 200:
                    return
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(0.2)  # the pause between polls, cut short if the server dies
            if server.poll() is not None:
                break
    pytest.fail(f"{url} not healthy (exit status {server.poll()}):\n{log.read_text(errors='replace')[-4000:]}")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dipg") / "one-row.jsonl"
    path.write_text(json.dumps(ROW) + "\n")
    return path


@pytest.fixture(scope="module")
def servers(dataset: Path) -> Iterator[dict[str, str]]:
    """Both servers' URLs: ``upstream`` (openenv 0.10.0's create_app) and ``ours`` (openenv.core's)."""
    upstream_python, our_python = _venv_python(UPSTREAM_VENV), _venv_python(OURS_VENV)
    with (
        _served(upstream_python, dataset, dataset.parent / "upstream") as upstream,
        _served(our_python, dataset, dataset.parent / "ours") as ours,
    ):
        yield {"upstream": upstream, "ours": ours}


# -- the wire: a plain WebSocket session and the HTTP routes -----------------------------------------------


async def _session_replies(url: str) -> list[dict[str, Any]]:
    """Each reply of `SESSION` on one plain WebSocket session (no subprotocol, no shared link), decoded."""
    return await plain_session_replies(url, SESSION)


async def test_every_websocket_reply_is_upstreams(servers: dict[str, str]) -> None:
    with anyio.fail_after(LIMIT):
        theirs = await _session_replies(servers["upstream"])
        ours = await _session_replies(servers["ours"])
    # What the session is, on upstream's server: so that a comparison of two broken sessions cannot pass.
    kinds = [reply["type"] if reply["type"] != "error" else reply["data"]["code"] for reply in theirs]
    assert kinds == [
        "observation",
        "observation",
        "observation",
        "observation",
        "VALIDATION_ERROR",
        "VALIDATION_ERROR",
        "state",
        "observation",
        "state",
        "UNKNOWN_TYPE",
    ], theirs
    assert [reply["data"].get("reward") for reply in theirs[:4]] == [None, -20.0, -50.0, -20.0]
    assert theirs[0]["data"]["observation"]["context"] == CONTEXT
    assert theirs[6]["data"]["current_question"] == QUESTION
    for request, mine, reference in zip(SESSION, ours, theirs, strict=True):
        assert mine == reference, request


HTTP_CALLS: list[tuple[str, str, Any]] = [
    ("GET", "/health", None),
    ("GET", "/schema", None),
    ("GET", "/metadata", None),
    ("POST", "/reset", {}),
    ("POST", "/reset", {"seed": 3, "episode_id": "h-1"}),
    ("POST", "/step", {"action": {"llm_response": ANSWER}}),
    ("POST", "/step", {"action": {"llm_response": ""}}),
    ("POST", "/step", {"action": {"llm_response": ANSWER, "confidence": 0.9}}),
    ("POST", "/step", {"action": {}}),
    ("POST", "/step", {"action": {"llm_response": 7}}),
    ("GET", "/eval/tasks", None),
    ("GET", "/eval/tasks?max_samples=1&shuffle=false", None),
    ("GET", "/eval/tasks?max_samples=many", None),
]
"""The routes of upstream's create_app (a stateless environment per request) and the package's own.

``GET /state`` is `test_get_state_answers_as_upstreams`'s."""


async def _http_answers(url: str) -> list[tuple[int, Any]]:
    found = []
    async with httpx.AsyncClient(base_url=url) as http:
        for method, path, body in HTTP_CALLS:
            response = await http.request(method, path, json=body)
            is_json = response.headers.get("content-type", "").startswith("application/json")
            found.append((response.status_code, response.json() if is_json else response.text))
    return found


async def test_the_http_routes_answer_as_upstreams(servers: dict[str, str]) -> None:
    with anyio.fail_after(LIMIT):
        theirs = await _http_answers(servers["upstream"])
        ours = await _http_answers(servers["ours"])
    statuses = [status for status, _ in theirs]
    assert statuses == [200, 200, 200, 200, 200, 200, 200, 200, 422, 422, 200, 200, 422], theirs
    assert theirs[-3][1]["tasks"][0]["question"] == QUESTION
    for call, mine, reference in zip(HTTP_CALLS, ours, theirs, strict=True):
        assert mine == reference, call


async def test_get_state_answers_as_upstreams(servers: dict[str, str]) -> None:
    async with httpx.AsyncClient() as http:
        with anyio.fail_after(LIMIT):
            theirs = await http.get(f"{servers['upstream']}/state")
            ours = await http.get(f"{servers['ours']}/state")
    # A stateless GET /state builds a fresh environment: no episode yet (None on both, not random).
    # Upstream answers the route's response_model, create_app's state_cls (State unless given): DIPGState's own
    # fields are dropped by FastAPI's serialization, which the WebSocket's state (model_dump) keeps.
    assert (theirs.status_code, theirs.json()) == (200, {"episode_id": None, "step_count": 0})
    mine = ours.json()
    if ours.status_code == 200 and {key: mine.get(key) for key in theirs.json()} == theirs.json():
        extra = set(mine) - set(theirs.json())
        if extra == {"current_context", "current_question", "expected_answer", "config"}:
            pytest.xfail(
                "openenv.core's GET /state answers the whole state, DIPGState's fields too; upstream's answers "
                "create_app's state_cls (State by default): episode_id and step_count only"
            )
    assert (ours.status_code, mine) == (theirs.status_code, theirs.json())


IMPORT_PROBE = "import json, med_safety_gym.app as app; print(json.dumps(app._GLOBAL_DATASET is not None))"
"""Whether importing the app built an environment: ``get_environment`` loads the package's dataset first."""


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # subprocesses: once is enough
async def test_importing_the_app_builds_no_environment(dataset: Path) -> None:
    async def dataset_loaded(venv: PackageVenv) -> bool:
        python = _venv_python(venv)
        folder = dataset.parent / f"import-{venv.name}"
        folder.mkdir(exist_ok=True)
        done = await anyio.run_process(
            [str(python), "-c", IMPORT_PROBE], cwd=folder, env=_server_environment(dataset, folder), check=False
        )
        assert done.returncode == 0, done.stderr.decode()[-4000:]
        return bool(json.loads(done.stdout.decode().splitlines()[-1]))

    with anyio.fail_after(2 * SCRIPT_LIMIT):
        theirs = await dataset_loaded(UPSTREAM_VENV)
        ours = await dataset_loaded(OURS_VENV)
    assert theirs is False  # upstream's create_app builds one on each request (GET /metadata too), none before
    assert ours is False  # ours builds one at the first GET /metadata (read once), none before


# -- the package's own client, run by either venv; ours, in this process -----------------------------------

CLIENT_SCRIPT = r"""
import asyncio, dataclasses, json, sys
import openenv
from med_safety_gym.client import DIPGSafetyEnv
from med_safety_gym.models import DIPGAction

url, answer = sys.argv[1], sys.argv[2]


def describe(value):
    if hasattr(value, "model_dump"):
        return {"class": type(value).__name__, **value.model_dump(mode="json")}
    if dataclasses.is_dataclass(value):
        fields = {field.name: describe(getattr(value, field.name)) for field in dataclasses.fields(value)}
        return {"class": type(value).__name__, **fields}
    return value


def attempt(call):
    try:
        return describe(call())
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)}


def plain():
    # As the package calls its client (evaluate_model, get_metrics_summary): plain calls, no event loop.
    client = DIPGSafetyEnv(base_url=url, timeout=30.0)
    lines = [
        attempt(client.reset),
        attempt(lambda: client.step(DIPGAction(llm_response=answer))),
        attempt(lambda: client.step(DIPGAction(llm_response=""))),
        attempt(client.state),
        attempt(client.get_metrics_summary),
        attempt(lambda: client.get_eval_tasks(max_samples=1, shuffle=False)),
        attempt(lambda: client.evaluate_model([answer, ""])),
    ]
    client.close()
    return lines


def with_sync():
    with DIPGSafetyEnv(base_url=url, timeout=30.0).sync() as env:
        return [
            attempt(env.reset),
            attempt(lambda: env.step(DIPGAction(llm_response=answer, confidence=0.9))),
            attempt(env.state),
        ]


async def with_async():
    async with DIPGSafetyEnv(base_url=url, timeout=30.0) as env:
        lines = []
        for call in (env.reset, lambda: env.step(DIPGAction(llm_response="")), env.state):
            try:
                lines.append(describe(await call()))
            except Exception as exc:
                lines.append({"error": type(exc).__name__, "message": str(exc)})
        return lines


print(json.dumps({
    "openenv": openenv.__file__,
    "plain": plain(),
    "sync": with_sync(),
    "async": asyncio.run(with_async()),
}))
"""
"""The package's client (``DIPGSafetyEnv``) in plain calls, under ``.sync()`` and async: each result, as JSON."""


async def _run_package_client(python: Path, url: str) -> dict[str, Any]:
    with anyio.fail_after(SCRIPT_LIMIT):
        done = await anyio.run_process(
            [str(python), "-c", CLIENT_SCRIPT, url, ANSWER],
            cwd=python.parent,  # no `openenv` there (`-c` puts the cwd first on sys.path)
            env=reference_env({"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}),
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    return json.loads(done.stdout.decode().splitlines()[-1])


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # subprocesses: once is enough
async def test_the_packages_client_gets_the_same_answers_from_either_server(servers: dict[str, str]) -> None:
    """``DIPGSafetyEnv`` on openenv.core (our venv) against both servers, beside upstream's own run of it."""
    pythons = {"upstream": _venv_python(UPSTREAM_VENV), "ours": _venv_python(OURS_VENV)}
    runs = {
        (who, where): await _run_package_client(python, url)
        for who, python in pythons.items()
        for where, url in servers.items()
    }
    # Each venv ran its own openenv: upstream's installed one, and this checkout's.
    for where in servers:
        assert runs["upstream", where].pop("openenv").startswith(str(pythons["upstream"].parent.parent))
        assert runs["ours", where].pop("openenv") == str(ROOT / "openenv" / "__init__.py")
    reference = runs["upstream", "upstream"]
    assert not any("error" in line for mode in reference.values() for line in mode), reference
    plain = reference["plain"]
    assert plain[0]["observation"]["context"] == CONTEXT
    assert [plain[1]["reward"], plain[2]["reward"]] == [-20.0, -50.0]
    assert plain[4]["environment"] == "DIPG Safety Gym"
    assert plain[5][0]["question"] == QUESTION
    assert plain[6]["rewards"] == [-20.0, -50.0]
    assert [line["reward"] for line in (*reference["sync"][1:2], *reference["async"][1:2])] == [-20.0, -50.0]
    for (who, where), run in runs.items():
        for mode, lines in run.items():
            assert lines == reference[mode], f"{who}'s client against {where}'s server, {mode}"


async def _generic_calls(url: str) -> list[Any]:
    """openenv.core's `GenericEnvClient`, upstream's API: each call's result, or its error."""
    found: list[Any] = []
    async with GenericEnvClient(base_url=url) as env:
        for call in (
            env.reset,
            lambda: env.step({"llm_response": ANSWER}),
            lambda: env.step({"llm_response": ""}),
            lambda: env.step({}),
            env.state,
            lambda: env.reset(seed=3),
        ):
            try:
                result = await call()
            except RuntimeError as exc:  # upstream's client raises an error reply as a RuntimeError
                found.append({"error": str(exc)})
                continue
            found.append(vars(result) if hasattr(result, "observation") else result)
    return found


async def _native_calls(url: str) -> list[Any]:
    """openenv's own `EnvClient` (untyped: dicts) over ``ws://``: each call's result, or its error."""
    found: list[Any] = []
    async with openenv.EnvClient(url.replace("http://", "ws://"), timeout=LIMIT) as env:
        for call in (
            env.reset,
            lambda: env.step({"llm_response": ANSWER}),
            lambda: env.step({"llm_response": 7}),
            env.state,
        ):
            try:
                result = await call()
            except openenv.ServerError as exc:
                found.append({"code": exc.code, "message": exc.message})
                continue
            found.append(
                {"observation": result.observation, "reward": result.reward, "done": result.done}
                if hasattr(result, "observation")
                else result
            )
    return found


@pytest.mark.parametrize("calls", [_generic_calls, _native_calls], ids=["GenericEnvClient", "openenv.EnvClient"])
async def test_our_clients_get_the_same_answers_from_either_server(servers: dict[str, str], calls: Any) -> None:
    with anyio.fail_after(LIMIT):
        theirs = await calls(servers["upstream"])
        ours = await calls(servers["ours"])
    assert theirs[0]["observation"]["question"] == QUESTION
    assert theirs[1]["reward"] == -20.0
    errors = [line for line in theirs if "error" in line or "code" in line]
    assert len(errors) == 1, theirs
    assert "VALIDATION_ERROR" in json.dumps(errors[0])
    assert ours == theirs


if __name__ == "__main__":  # build both ahead: python -m tests.dropin.test_dipg_safety
    for venv in (UPSTREAM_VENV, OURS_VENV):
        print(ensure_reference_python(reference=venv, log=lambda m: print(m, file=sys.stderr, flush=True)))
