"""Wire compatibility with the references, openenv 0.10.0 and openenv-core 0.3.0 from PyPI, in both directions.

Each test runs against each (the ``reference`` fixture). A reference lives in
its own throwaway virtual environment (its import name clashes with ours),
built on first use by ``tests/interop/reference_venv.py``, and runs as a
subprocess: (a) our typed client against its server; (b) its own
``GenericEnvClient`` against our server, running the same script.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

import openenv
from openenv import Dialect, EnvClient, State
from openenv.examples.echo import (
    CallToolAction,
    EchoEnv,
    EchoEnvironment,
    EchoObservation,
    ListToolsAction,
    ListToolsObservation,
)
from tests.envs import TASKS, MessageAction, MessageEchoEnv, MessageObservation, TaskEchoEnv
from tests.interop.reference_venv import (
    OPENENV_0_10,
    REFERENCES,
    Reference,
    ReferenceServer,
    ensure_reference_python,
    reference_env,
    run_reference_client,
)
from transports.mcp_session import MCPSessionTransport
from transports.websocket import WebSocketTransport

pytestmark = [pytest.mark.interop, pytest.mark.anyio]

LIMIT = 60
ROOT = Path(__file__).resolve().parents[2]


class MessageEnv(EnvClient[MessageAction, MessageObservation, State]):
    pass


@pytest.fixture(scope="session", params=REFERENCES, ids=[r.version for r in REFERENCES])
def reference(request: pytest.FixtureRequest) -> Reference:
    """Each reference release in turn: openenv 0.10.0, then openenv-core 0.3.0."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def reference_python(reference: Reference) -> Path:
    """The reference venv's python: built once (a few minutes), then reused."""
    return ensure_reference_python(reference=reference)


@pytest.fixture(scope="module")
def reference_server(reference_python: Path) -> Iterator[ReferenceServer]:
    with ReferenceServer(reference_python, max_sessions=4) as server:
        yield server


class ManglingTransport(WebSocketTransport):
    """Replaces the next frame the client sends, to provoke the server's per-message errors."""

    replacement: bytes | None = None
    text = True

    async def send(self, frame: bytes) -> None:
        if self.replacement is not None:
            frame, self.replacement = self.replacement, None
        await super().send(frame)


# -- (a) our client, the reference server ---------------------------------------


async def test_our_typed_client_against_the_reference_server(reference_server: ReferenceServer) -> None:
    with anyio.fail_after(LIMIT):
        async with MessageEnv(reference_server.base_url) as env:
            assert env.transport is not None
            assert env.transport.dialect == Dialect()  # the reference selects no subprotocol
            # Offered the link subprotocols first, it selects none of them: a plain session.
            assert isinstance(env.transport, WebSocketTransport)
            assert (env.transport.subprotocol, env.transport.resumable) == (None, False)
            result = await env.reset(seed=42, episode_id="ep-1")
            assert result.observation == MessageObservation(echoed_message="", reward=0.0, done=False)
            result = await env.step(MessageAction(message="hello"))
            assert isinstance(result.observation, MessageObservation)
            assert (result.observation.echoed_message, result.reward, result.done) == ("hello", 5.0, False)
            result = await env.step_async(MessageAction(message="done"))
            assert result.done is True
            assert await env.state() == State(episode_id="ep-1", step_count=2)
            with pytest.raises(openenv.ExecutionError):
                await env.step(MessageAction(message="raise"))
            assert (await env.reset_async()).observation.echoed_message == ""


async def test_reference_error_codes_become_typed_errors(reference_server: ReferenceServer) -> None:
    transport = ManglingTransport(reference_server.base_url)
    with anyio.fail_after(LIMIT):
        async with EnvClient(transport=transport) as env:
            await env.reset()
            with pytest.raises(openenv.ValidationError) as info:
                await env.step({"messag": "typo"})
            assert {error["type"] for error in info.value.errors} == {"missing", "extra_forbidden"}
            transport.replacement = b"not json"
            with pytest.raises(openenv.InvalidJSONError):
                await env.state()
            transport.replacement = b'{"type": "bogus"}'
            with pytest.raises(openenv.UnknownTypeError, match="bogus"):
                await env.state()
            # The session survived each of them.
            assert (await env.step({"message": "ok"})).observation["echoed_message"] == "ok"


async def test_reference_capacity_is_a_typed_error(reference_python: Path) -> None:
    with ReferenceServer(reference_python, max_sessions=1) as server, anyio.fail_after(LIMIT):
        async with MessageEnv(server.base_url) as first:
            await first.reset()
            async with MessageEnv(server.base_url) as second:
                with pytest.raises(openenv.CapacityReachedError) as info:
                    await second.reset()
                assert info.value.data["max_sessions"] == 1
                with pytest.raises(openenv.ConnectionClosed):
                    await second.reset()
            # The first session is unharmed.
            assert (await first.step(MessageAction(message="still"))).reward == 5.0


async def test_a_timed_out_step_never_shifts_replies_on_the_reference(reference_server: ReferenceServer) -> None:
    """The reference client's known weakness: after a timeout every reply is off by one."""
    with anyio.fail_after(LIMIT):
        async with MessageEnv(reference_server.base_url) as env:
            await env.reset()
            with pytest.raises(openenv.TimeoutError):
                await env.step(MessageAction(message="sleep:0.5"), timeout=0.1)
            result = await env.step(MessageAction(message="next"))
            assert result.observation.echoed_message == "next"
            assert (await env.state()).step_count == 2


def test_our_sync_client_against_the_reference_server(reference_server: ReferenceServer) -> None:
    with MessageEnv(reference_server.base_url).sync() as env:
        env.reset(episode_id="sync")
        assert env.step(MessageAction(message="abc")).reward == 3.0
        assert env.state() == State(episode_id="sync", step_count=1)


# -- (b) the reference client, our server -----------------------------------------


def reference_script(url: str, *args: str, python: Path) -> list[dict[str, Any]]:
    """Run the reference client's script; its results, one per operation (its ``init`` line left out)."""
    return [result for result in run_reference_client(url, *args, python=python) if result["op"] != "init"]


def expected_script_results(results: list[dict[str, Any]], *, metadata: bool = True) -> None:
    """The default script's results; ``metadata``: observations carry it, as OpenEnv 0.10's server and ours send it."""
    with_metadata: dict[str, Any] = {"metadata": {}} if metadata else {}
    ops = [(r["op"], r["ok"]) for r in results]
    assert ops == [
        ("reset", True),
        ("step", True),
        ("state", True),
        ("step", False),
        ("step", True),
        ("state", True),
        ("close", True),
    ]
    reset, hello, state, typo, again, state2, _ = results
    assert reset["observation"] == {"echoed_message": "", **with_metadata}
    assert (reset["reward"], reset["done"]) == (0.0, False)
    assert hello["observation"] == {"echoed_message": "hello", **with_metadata}
    assert (hello["reward"], hello["done"]) == (5.0, False)
    assert state["state"] == {"episode_id": "ep-1", "step_count": 1}
    assert "VALIDATION_ERROR" in typo["error"]
    assert again["observation"] == {"echoed_message": "again", **with_metadata}
    assert state2["state"] == {"episode_id": "ep-1", "step_count": 2}


def test_the_script_against_the_reference_server_itself(
    reference: Reference, reference_python: Path, reference_server: ReferenceServer
) -> None:
    """The baseline the next test compares against: the reference client on its own server."""
    results = reference_script(reference_server.base_url, python=reference_python)
    expected_script_results(results, metadata=reference is OPENENV_0_10)


CLIENT_MODES = [
    pytest.param([], id="generic"),
    pytest.param(["--sync"], id="generic-sync"),
    pytest.param(["--typed"], id="typed"),
    pytest.param(["--typed", "--sync"], id="typed-sync"),
]


def without_metadata(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Results with no ``metadata`` in observations: openenv-core 0.3.0's server sends none, ours sends 0.10's."""
    return [
        {**result, "observation": {k: v for k, v in result["observation"].items() if k != "metadata"}}
        if isinstance(result.get("observation"), dict)
        else result
        for result in results
    ]


@pytest.mark.parametrize("mode", CLIENT_MODES)
async def test_reference_client_gets_from_our_server_what_it_gets_from_its_own(
    reference: Reference, reference_python: Path, reference_server: ReferenceServer, mode: list[str]
) -> None:
    """GenericEnvClient and a typed EnvClient, async and sync, on our uvicorn (asyncio) and trio servers."""
    with anyio.fail_after(LIMIT * 2):
        theirs = await anyio.to_thread.run_sync(
            lambda: reference_script(reference_server.base_url, *mode, python=reference_python)
        )
        async with openenv.serve(MessageEchoEnv, port=0) as server:
            ours = await anyio.to_thread.run_sync(lambda: reference_script(server.url, *mode, python=reference_python))
    if reference is OPENENV_0_10:
        assert ours == theirs
    else:
        assert without_metadata(ours) == without_metadata(theirs)
    if "--typed" not in mode:
        expected_script_results(ours)


async def test_reference_client_sees_our_errors(reference_python: Path) -> None:
    ops = (
        '[{"op": "reset"}, {"op": "step", "action": {"message": "raise"}},'
        ' {"op": "step", "action": {"message": "after"}}, {"op": "close"}]'
    )
    with anyio.fail_after(LIMIT * 2):
        async with openenv.serve(MessageEchoEnv, port=0) as server:
            results = await anyio.to_thread.run_sync(
                lambda: reference_script(server.url, "--ops", ops, python=reference_python)
            )
    assert [r["ok"] for r in results] == [True, False, True, True]
    assert "EXECUTION_ERROR" in results[1]["error"]
    assert results[2]["observation"] == {"echoed_message": "after", "metadata": {}}


async def test_reference_client_sends_pydantic_actions_to_our_server(reference_python: Path) -> None:
    """A typed OpenEnv client sends its Action whole, ``metadata`` included: our Action has it too."""
    ops = '[{"op": "reset"}, {"op": "step", "action": {"message": "typed"}, "model": true}, {"op": "close"}]'
    with anyio.fail_after(LIMIT * 2):
        async with openenv.serve(MessageEchoEnv, port=0) as server:
            results = await anyio.to_thread.run_sync(
                lambda: reference_script(server.url, "--ops", ops, python=reference_python)
            )
    assert [r["ok"] for r in results] == [True, True, True], results
    assert results[1]["observation"] == {"echoed_message": "typed", "metadata": {}}


async def test_reference_client_at_our_capacity(reference_python: Path) -> None:
    with anyio.fail_after(LIMIT * 2):
        async with openenv.serve(MessageEchoEnv, port=0, max_sessions=1) as server, MessageEnv(server.url) as holder:
            await holder.reset()
            results = await anyio.to_thread.run_sync(
                lambda: reference_script(server.url, "--ops", '[{"op": "reset"}]', python=reference_python)
            )
            assert results[0]["ok"] is False
            assert "CAPACITY_REACHED" in results[0]["error"]
            assert (await holder.step(MessageAction(message="x"))).reward == 1.0


# -- (c) OpenEnv's runtime validator and MCP tool environments ---------------------


@contextlib.contextmanager
def openenv_serve(factory: str) -> Iterator[str]:
    """Run ``openenv serve FACTORY --port 0`` in a subprocess; yield its URL (read from the line it prints)."""
    command = [sys.executable, "-m", "transports.cli", "serve", factory, "--port", "0", "--log-level", "warning"]
    process = subprocess.Popen(
        command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert process.stderr is not None
    try:
        deadline = time.monotonic() + LIMIT
        seen = b""
        while b"\n" not in seen.partition(b" on http://")[2]:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([process.stderr], [], [], max(remaining, 0))
            chunk = os.read(process.stderr.fileno(), 4096) if ready else b""
            assert chunk, f"openenv serve printed no URL: {seen.decode(errors='replace')}"
            seen += chunk
        url = re.search(rb"on (http://127\.0\.0\.1:\d+)", seen)
        assert url is not None, seen
        yield url.group(1).decode()
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def run_reference_tool(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a program of the reference venv (its ``openenv`` CLI or one of the scripts here) from a neutral folder."""
    return subprocess.run(
        [*args],
        cwd=Path(__file__).parent,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=LIMIT * 2,
        env=reference_env(),
    )


def test_the_reference_validator_passes_every_criterion_against_openenv_serve(reference_python: Path) -> None:
    with openenv_serve("openenv.examples.echo:EchoEnvironment") as url:
        validator = str(reference_python.parent / "openenv")
        done = run_reference_tool(reference_python, validator, "validate", "--url", url, "--json")
    report = json.loads(done.stdout)
    failed = [c for c in report["criteria"] if not c["passed"]]
    assert not failed, failed
    assert report["passed"] is True
    assert [c["id"] for c in report["criteria"]] == [
        "openapi_version_available",
        "health_endpoint",
        "metadata_endpoint",
        "schema_endpoint",
        "mcp_endpoint",
        "mode_endpoint_consistency",
    ]
    assert (report["standard_profile"], report["mode"]) == ("openenv-http/1.x", "simulation")
    assert done.returncode == 0, done.stderr


def mcp_client_script(python: Path, url: str, *options: str) -> list[dict[str, Any]]:
    """Run ``reference_mcp_client.py`` against ``url``; its results, one per operation."""
    script = str(Path(__file__).parent / "reference_mcp_client.py")
    done = run_reference_tool(python, str(python), script, url, *options)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def without_documented_differences(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The MCP script's results with what docs/migrating.md says differs taken out.

    openenv's echo gives a call a reward and its ``CallToolObservation.result``
    is the tool's value, where echo_env's is FastMCP's whole ``CallToolResult``;
    an unknown tool's message is worded differently (its error type is the
    same); episode ids are random.
    """
    normal = []
    for result in results:
        result = dict(result)
        if result["op"] == "step":
            value = result["result"]
            result["result"] = value["data"] if isinstance(value, dict) and "content" in value else value
            result.pop("reward")
        elif result["op"] == "call_tool" and result.get("ok") is False:
            message = result.pop("error")
            assert message.startswith("Tool 'no_such_tool' failed: "), message
            result["error_type_in_message"] = message.endswith("(type: tool_not_found)")
        elif result["op"] == "state":
            result["state"] = {**result["state"], "episode_id": "(random)"}
        normal.append(result)
    return normal


MCP_CLIENT_MODES = [
    pytest.param(["--mode", "production"], id="production"),
    pytest.param(["--mode", "production", "--sync"], id="production-sync"),
    pytest.param(["--mode", "simulation"], id="simulation"),
    pytest.param(["--mode", "simulation", "--sync"], id="simulation-sync"),
]


@pytest.mark.parametrize("options", MCP_CLIENT_MODES)
async def test_the_reference_mcp_client_drives_our_echo_as_it_drives_its_own(
    reference: Reference, reference_python: Path, reference_mcp_echo: ReferenceServer, options: list[str]
) -> None:
    """OpenEnv's ``MCPToolClient``, in each of its modes, gets from our echo what it gets from echo_env."""
    if reference is not OPENENV_0_10 and "production" in options:
        pytest.skip("openenv-core 0.3.0's MCPToolClient has no production mode")
    with anyio.fail_after(LIMIT * 4):
        theirs = await anyio.to_thread.run_sync(
            lambda: mcp_client_script(reference_python, reference_mcp_echo.base_url, *options)
        )
        async with openenv.serve(EchoEnvironment, port=0) as server:
            ours = await anyio.to_thread.run_sync(lambda: mcp_client_script(reference_python, server.url, *options))
    assert without_documented_differences(ours) == without_documented_differences(theirs)
    _, listing, echoed, measured, step, unknown, state, _ = ours
    assert [tool["name"] for tool in listing["tools"]] == ["echo_message", "echo_with_length"]
    assert listing["tools"][0]["input_schema"] == {
        "type": "object",
        "properties": {"message": {"type": "string"}},
        "required": ["message"],
        "additionalProperties": False,
    }
    assert (echoed["result"], measured["result"]) == ("Hello!", {"message": "abc", "length": 3})
    assert (step["tool_name"], step["result"]) == ("echo_message", "stepped")
    assert unknown["ok"] is False
    # Tool calls are steps in simulation mode; in production mode they go over HTTP, bypassing step.
    assert state["state"]["step_count"] == (5 if "simulation" in options else 1)


@pytest.fixture(scope="module")
def reference_mcp_echo(reference_python: Path) -> Iterator[ReferenceServer]:
    with ReferenceServer(reference_python, max_sessions=4, extra_args=["--mcp-echo"]) as server:
        yield server


async def test_our_client_drives_the_reference_mcp_echo(
    reference: Reference, reference_mcp_echo: ReferenceServer
) -> None:
    with anyio.fail_after(LIMIT):
        async with EchoEnv(reference_mcp_echo.base_url) as env:
            reset = await env.reset()
            assert isinstance(reset.observation, EchoObservation)  # the empty observation fits the union's first
            assert (reset.reward, reset.done) == (0.0, False)
            # Its metadata, intact, where the server sends it (0.3.0's never does).
            metadata = {"status": "ready"} if reference is OPENENV_0_10 else {}
            assert reset.metadata == reset.observation.metadata == metadata
            tools = await env.list_tools()
            assert [tool.name for tool in tools] == ["echo_message", "echo_with_length"]
            assert tools[1].input_schema["required"] == ["message"]
            assert await env.call_tool("echo_message", message="Hello!") == "Hello!"
            assert await env.call_tool("echo_with_length", message="abc") == {"message": "abc", "length": 3}
            with pytest.raises(openenv.ToolCallError) as caught:
                await env.call_tool("no_such_tool")
            assert caught.value.error_type == "tool_not_found"
            # A typed step: the reply is decoded into the member of the union it fits.
            listing = await env.step(ListToolsAction())
            assert isinstance(listing.observation, ListToolsObservation)
            called = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "typed"}))
            assert isinstance(called.observation, EchoObservation)
            assert called.observation.tool_name == "echo_message"
            assert called.observation.result["data"] == "typed"  # FastMCP's CallToolResult, whole
            # An mcp frame, answered with JSON-RPC, bypassing step.
            listed = await env.mcp("tools/list")
            assert [tool["name"] for tool in listed["tools"]] == ["echo_message", "echo_with_length"]
            with pytest.raises(openenv.MCPError) as rpc_error:
                await env.mcp("no/such/method")
            assert rpc_error.value.code == -32601
            assert (await env.state()).step_count == 6


@pytest.mark.parametrize("scheme", ["http", "http+mcp"])
async def test_our_client_in_production_mode_against_the_reference(
    reference: Reference, reference_mcp_echo: ReferenceServer, scheme: str
) -> None:
    """Tools over JSON-RPC, bypassing step; with ``http+mcp://``, in a session made over ``POST /mcp`` (0.10 only)."""
    if reference is not OPENENV_0_10 and scheme == "http+mcp":
        pytest.skip("openenv-core 0.3.0 makes no sessions over POST /mcp")
    with anyio.fail_after(LIMIT):
        url = reference_mcp_echo.base_url.replace("http", scheme, 1)
        async with EchoEnv(url, mode="production") as env:
            reset = await env.reset(episode_id="prod")
            assert reset.reward == 0.0
            assert [tool.name for tool in await env.list_tools()] == ["echo_message", "echo_with_length"]
            assert await env.call_tool("echo_with_length", message="abc") == {"message": "abc", "length": 3}
            with pytest.raises(openenv.ToolCallError) as caught:
                await env.call_tool("no_such_tool")
            assert caught.value.error_type == "execution_error"  # the reference's -32603 names no type
            state = await env.state()
            assert (state.episode_id, state.step_count) == ("prod", 0)
            if scheme == "http+mcp":
                transport = env.transport
                assert isinstance(transport, MCPSessionTransport)
                session_id = transport.session_id
                async with httpx.AsyncClient() as http:
                    call = {"name": "echo_message", "arguments": {"message": "x"}, "session_id": session_id}
                    message = {"jsonrpc": "2.0", "method": "tools/call", "params": call, "id": 1}
                    reply = (await http.post(f"{reference_mcp_echo.base_url}/mcp", json=message)).json()
                assert reply["result"]["data"] == "x"


async def test_our_mcp_frames_match_the_reference_for_an_environment_without_tools(
    reference_server: ReferenceServer,
) -> None:
    """An environment that has no tools answers an mcp frame with the same JSON-RPC error on both servers."""
    with anyio.fail_after(LIMIT):
        async with MessageEnv(reference_server.base_url) as theirs:
            with pytest.raises(openenv.MCPError) as reference_error:
                await theirs.mcp("tools/list")
        async with openenv.serve(MessageEchoEnv, port=0) as server, MessageEnv(server.url) as ours:
            with pytest.raises(openenv.MCPError) as our_error:
                await ours.mcp("tools/list")
    assert (our_error.value.code, our_error.value.message) == (
        reference_error.value.code,
        reference_error.value.message,
    )


async def test_validation_errors_carry_the_same_errors_list_on_both_servers(reference_server: ReferenceServer) -> None:
    """A step without data, and one with a non-object: both servers name the field, the same way."""

    async def errors_of(url: str, frame: bytes) -> list[dict[str, Any]]:
        transport = ManglingTransport(url)
        async with EnvClient(transport=transport) as env:
            transport.replacement = frame
            with pytest.raises(openenv.ValidationError) as info:
                await env.state()
            return info.value.errors

    with anyio.fail_after(LIMIT):
        async with openenv.serve(MessageEchoEnv, port=0) as server:
            for frame in (b'{"type": "step"}', b'{"type": "step", "data": "hi"}'):
                theirs = await errors_of(reference_server.base_url, frame)
                ours = await errors_of(server.url, frame)
                assert [error["loc"] for error in ours] == [error["loc"] for error in theirs] == [["data"]]
    assert ours[0]["input"] == theirs[0]["input"] == "hi"


# -- (d) OpenEnv 0.10's HTTP additions: the Task API, /schema's reset_observation, metadata ----


TASK_REQUESTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/list_environments", None),
    ("GET", "/{name}/splits", None),
    ("POST", "/{name}/tasks", {"split": "train"}),
    ("POST", "/{name}/num_tasks", {"split": "test"}),
    ("POST", "/{name}/task", {"split": "train", "index": 1}),
    ("POST", "/{name}/task", {"split": "train", "index": 3}),
    ("POST", "/{name}/task_range", {"split": "train", "start": 1}),
    ("POST", "/{name}/task_range", {"split": "train", "start": 0, "stop": 2}),
    ("POST", "/{name}/tasks", {}),
    ("GET", "/other_env/splits", None),
]


async def task_answers(url: str, name: str) -> list[tuple[int, Any]]:
    """Each of `TASK_REQUESTS`' answers: its status, and its body with the environment's name as ``{name}``."""
    answers = []
    async with httpx.AsyncClient(base_url=url) as http:
        for method, path, body in TASK_REQUESTS:
            response = await http.request(method, path.format(name=name), json=body)
            content = json.loads(response.text.replace(name, "{name}"))
            if response.status_code == 422:
                content = "(pydantic's or msgspec's wording)"
            answers.append((response.status_code, content))
    return answers


async def test_the_task_api_answers_as_openenv_0_10_does(reference: Reference, reference_python: Path) -> None:
    if reference is not OPENENV_0_10:
        pytest.skip("the Task API is new in openenv 0.10")
    with ReferenceServer(reference_python, extra_args=["--tasks"]) as theirs, anyio.fail_after(LIMIT):
        expected = await task_answers(theirs.base_url, "echo_env")
        async with openenv.serve(TaskEchoEnv, port=0) as ours:
            assert await task_answers(ours.url, "TaskEchoEnv") == expected
    assert expected[2] == (200, {"tasks": TASKS["train"], "env_name": "{name}"})
    assert expected[5] == (400, {"detail": "Invalid task index"})


async def test_an_environment_without_tasks_answers_501_as_openenv_0_10_does(
    reference: Reference, reference_server: ReferenceServer
) -> None:
    if reference is not OPENENV_0_10:
        pytest.skip("the Task API is new in openenv 0.10")
    with anyio.fail_after(LIMIT):
        expected = await task_answers(reference_server.base_url, "echo_env")
        async with openenv.serve(MessageEchoEnv, port=0) as ours:
            assert await task_answers(ours.url, "MessageEchoEnv") == expected
    assert expected[1] == (501, {"detail": "list_splits is not supported for this environment"})


async def test_the_schema_has_what_openenv_0_10_has(reference: Reference, reference_server: ReferenceServer) -> None:
    with anyio.fail_after(LIMIT):
        async with httpx.AsyncClient() as http:
            theirs = (await http.get(f"{reference_server.base_url}/schema")).json()
            async with openenv.serve(MessageEchoEnv, port=0) as server:
                ours = (await http.get(f"{server.url}/schema")).json()
    assert set(ours) == set(theirs) | {"reset_observation"}
    if reference is OPENENV_0_10:
        # The same observation (named differently: the twins' classes are named differently).
        assert theirs["reset_observation"] == theirs["observation"]
        assert ours["reset_observation"] == ours["observation"]
        assert set(ours["reset_observation"]["properties"]) == set(theirs["reset_observation"]["properties"])


GRADED = [
    pytest.param(MessageEchoEnv, [{"message": "one"}, {"message": "two"}, {"message": "done"}], id="echo"),
    pytest.param(
        EchoEnvironment,
        [
            # No list_tools step: a listing has no reward, which Level Two's reward grader refuses (on any server).
            {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hi"}},
            {"type": "call_tool", "tool_name": "echo_with_length", "arguments": {"message": "abc"}},
        ],
        id="mcp-echo",
    ),
]


@pytest.mark.parametrize(("factory", "actions"), GRADED)
async def test_openenv_0_10s_runtime_graders_pass_our_server(
    reference: Reference,
    reference_python: Path,
    reference_server: ReferenceServer,
    factory: Any,
    actions: list[dict[str, Any]],
) -> None:
    """RFC 008's graders (rewards, observations against /schema, the state contract) on one raw episode each."""
    if reference is not OPENENV_0_10:
        pytest.skip("the runtime graders are new in openenv 0.10")
    script = str(Path(__file__).parent / "reference_graders.py")

    def grade(url: str) -> list[dict[str, Any]]:
        done = run_reference_tool(reference_python, str(reference_python), script, url, json.dumps(actions))
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    passed = [
        {"check_id": check, "status": "pass", "evidence": ["observed runtime contract holds"]}
        for check in ("runtime.reward_well_formed", "runtime.observation_schema", "runtime.state_contract")
    ] + [{"check_id": "collection", "status": "complete", "evidence": []}]
    with anyio.fail_after(LIMIT * 4):
        if factory is MessageEchoEnv:  # the baseline: its twin, the reference server, graded by its own graders
            assert await anyio.to_thread.run_sync(grade, reference_server.base_url) == passed
        async with openenv.serve(factory, port=0) as server:
            assert await anyio.to_thread.run_sync(grade, server.url) == passed
