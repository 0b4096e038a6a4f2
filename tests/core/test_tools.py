"""MCP tool environments: tools from typed methods, the client's tool methods, mcp frames, over every transport."""

from __future__ import annotations

import json
import subprocess
import threading
import types
from pathlib import Path
from typing import Annotated, Any, ClassVar

import anyio
import msgspec
import pytest

import openenv
from openenv import CallToolAction, CallToolObservation, ListToolsAction, Observation, State
from openenv.examples.echo import EchoEnv, EchoEnvironment
from openenv.server import MCPEnvironment, ServerSession
from tests.envs import MessageEchoEnv
from tests.interop.reference_venv import OPENENV_0_10, ensure_reference_python, reference_env
from tests.interop.tool_docstrings import NAMES as DOCUMENTED_NAMES
from tests.interop.tool_docstrings import DocumentedTools
from tests.serving import TRANSPORTS, serving

pytestmark = pytest.mark.anyio

LIMIT = 30


class Point(msgspec.Struct):
    x: int
    y: int = 0


class Toolbox(MCPEnvironment[CallToolAction, CallToolObservation, State]):
    """Tools of every kind, for the tests."""

    threads: ClassVar[set[int]] = set()

    def __init__(self) -> None:
        self._state = State()

    def reset(self) -> Observation:
        return Observation()

    @property
    def state(self) -> State:
        return self._state

    @openenv.tool
    def add(self, a: int, b: Annotated[int, msgspec.Meta(ge=0)] = 1) -> int:
        """Add b to a.

        A plain method: it runs on the session's thread.
        """
        Toolbox.threads.add(threading.get_ident())
        return a + b

    @openenv.tool
    async def norm(self, point: Point) -> dict[str, int]:
        """The point's squared norm."""
        return {"norm": point.x**2 + point.y**2}

    @openenv.tool
    async def fail(self) -> None:
        """Always raises."""
        raise RuntimeError("tool broke")

    def helper(self) -> int:
        return 0


class SubToolbox(Toolbox):
    """Inherits the tools; hides one, adds one."""

    async def fail(self) -> None:  # overridden without the mark: no longer a tool
        return None

    @openenv.tool
    async def sub(self, a: int, b: int) -> int:
        """a - b."""
        return a - b


def test_tools_are_read_from_the_typed_methods() -> None:
    assert list(Toolbox.tools) == ["add", "norm", "fail"]
    assert list(SubToolbox.tools) == ["add", "norm", "sub"]
    add = Toolbox.tools["add"].describe()
    assert add.description == "Add b to a.\n\nA plain method: it runs on the session's thread."
    assert add.input_schema == {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "minimum": 0, "default": 1}},
        "required": ["a"],
        "additionalProperties": False,
    }
    norm = Toolbox.tools["norm"].input_schema
    assert norm["properties"]["point"] == {"$ref": "#/$defs/Point"}
    assert norm["$defs"]["Point"]["required"] == ["x"]
    assert Toolbox.action_type == CallToolAction | ListToolsAction


def test_a_reserved_or_variadic_tool_is_refused_when_the_class_is_made() -> None:
    with pytest.raises(ValueError, match="reserved"):

        class Stepper(MCPEnvironment[Any, Any, Any]):
            @openenv.tool
            def step(self, action: Any) -> Any:  # type: ignore[override]
                return action

    with pytest.raises(TypeError, match="no \\*args"):

        class Variadic(MCPEnvironment[Any, Any, Any]):
            @openenv.tool
            def spread(self, *values: int) -> int:
                return sum(values)


async def test_tool_calls_and_their_errors() -> None:
    async with openenv.EnvClient("inproc://", factory=Toolbox) as env:
        assert [tool.name for tool in await env.list_tools()] == ["add", "norm", "fail"]
        assert await env.call_tool("add", a=2) == 3
        assert await env.call_tool("add", a="2", b=3.0) == 5  # lax, as OpenEnv's tools are
        assert Toolbox.threads
        assert threading.get_ident() not in Toolbox.threads
        assert await env.call_tool("norm", point={"x": 3, "y": 4}) == {"norm": 25}
        for name, arguments, error_type, match in [
            ("nope", {}, "tool_not_found", "not found"),
            ("add", {"a": 1, "b": -1}, "invalid_args", ">= 0"),
            ("add", {"a": 1, "c": 2}, "invalid_args", "unknown field"),
            ("add", {}, "invalid_args", "missing required field `a`"),
            ("fail", {}, "execution_error", "RuntimeError: tool broke"),
        ]:
            with pytest.raises(openenv.ToolCallError, match=match) as caught:
                await env.call_tool(name, **arguments)
            assert (caught.value.tool_name, caught.value.error_type) == (name, error_type)
        # The whole observation, through step; the session went on after each error.
        result = await env.step(CallToolAction(tool_name="fail"))
        assert result.observation["error"] == {"error_type": "execution_error", "message": "RuntimeError: tool broke"}
        with pytest.raises(openenv.ValidationError):
            await env.step({"unexpected": 1})


class Walk(openenv.Action, kw_only=True):
    steps: int


class Walker(MCPEnvironment[Walk, Observation, State]):
    """Takes its own action beside the tool actions."""

    def reset(self) -> Observation:
        return Observation()

    @property
    def state(self) -> State:
        return State()

    async def step_other(self, action: Walk) -> Observation:
        return Observation(reward=action.steps)

    @openenv.tool
    async def look(self) -> str:
        """Look around."""
        return "a tree"


async def test_a_tool_environment_with_actions_of_its_own() -> None:
    assert Walker.action_type == CallToolAction | ListToolsAction | Walk
    assert Toolbox.action_type == CallToolAction | ListToolsAction
    async with openenv.EnvClient("inproc://", factory=Walker) as env:
        assert (await env.step({"steps": "3"})).reward == 3
        assert await env.call_tool("look") == "a tree"
    # Without the override, another action is an error of the environment's.
    with pytest.raises(ValueError, match="use ListToolsAction or CallToolAction"):
        MCPEnvironment.step_other(Walker(), Walk(steps=1))


@pytest.mark.parametrize("kind", ["inproc", "ws"])
async def test_an_environment_without_tools(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, MessageEchoEnv) as url, openenv.EnvClient(url) as env:
            assert await env.list_tools() == []  # it has none, as OpenEnv's MCPToolClient says
            with pytest.raises(openenv.ToolCallError, match="the environment has no MCP tools") as refused:
                await env.call_tool("echo_message", message="x")
            assert (refused.value.tool_name, refused.value.error_type) == ("echo_message", "tool_not_found")
            assert isinstance(refused.value.__cause__, openenv.ValidationError)
            with pytest.raises(openenv.MCPError, match="does not support MCP") as caught:
                await env.mcp("tools/list")
            assert caught.value.code == -32603
            assert (await env.step({"message": "still"})).observation == {"echoed_message": "still", "metadata": {}}
        # In production mode (tools over JSON-RPC, bypassing step), the same answers.
        async with serving(kind, MessageEchoEnv) as url, openenv.EnvClient(url, mode="production") as env:
            assert await env.list_tools() == []
            with pytest.raises(openenv.ToolCallError) as refused:
                await env.call_tool("echo_message", message="x")
            assert (refused.value.error_type, refused.value.message) == (
                "execution_error",
                "Environment does not support MCP",
            )


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        ({"method": "tools/list"}, -32603, "Environment does not support MCP"),
        ({"method": "tools/call", "params": {"name": "x"}}, -32603, "Environment does not support MCP"),
        # As OpenEnv 0.10's server: the params are checked first.
        ({"method": "tools/call", "params": {"arguments": {}}}, -32602, "Missing 'name' in params"),
        ({"method": "tools/call", "params": [1]}, -32602, "Params must be an object"),
        ({"method": "resources/list"}, -32601, "Method not found: resources/list"),
    ],
)
async def test_an_environment_without_tools_answers_mcp_as_openenv_does(
    request_: dict[str, Any], code: int, message: str
) -> None:
    session = ServerSession(MessageEchoEnv())
    reply = await ask(session, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 7, **request_}})
    assert reply["data"] == {"jsonrpc": "2.0", "id": 7, "error": {"code": code, "message": message, "data": None}}
    await session.aclose()


class ToolActionEnv(openenv.Environment[CallToolAction | ListToolsAction, Observation, State]):
    """Takes tool actions without being an MCPEnvironment: OpenEnv's server answers MCP with its steps."""

    def reset(self) -> Observation:
        return Observation()

    def step(self, action: Any) -> Any:
        if isinstance(action, ListToolsAction):
            return openenv.ListToolsObservation(tools=[openenv.Tool(name="shout", description="Shout.")])
        if action.tool_name == "odd":
            return Observation()
        return CallToolObservation(tool_name=action.tool_name, result=action.arguments["text"].upper())

    @property
    def state(self) -> State:
        return State()


async def test_tool_actions_without_tools_answer_mcp_through_step() -> None:
    session = ServerSession(ToolActionEnv())
    listed = await ask(session, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}})
    assert listed["data"]["result"] == {"tools": [{"name": "shout", "description": "Shout.", "input_schema": {}}]}
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "shout", "arguments": {"text": "hi"}}}
    called = await ask(session, {"type": "mcp", "data": call})
    assert called["data"]["result"]["result"] == "HI"
    call["params"] = {"name": "odd", "arguments": {}}
    odd = await ask(session, {"type": "mcp", "data": call})
    expected = "MCP-style tools/call step returned Observation, expected CallToolObservation"
    assert odd["data"]["error"]["message"] == expected
    await session.aclose()


async def ask(session: ServerSession, message: Any) -> Any:
    with anyio.fail_after(5):
        reply = await session.handle(json.dumps(message).encode())
    return None if reply is None else json.loads(reply)


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        ({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "nope"}, "id": 1}, -32602),
        ({"jsonrpc": "2.0", "method": "tools/call", "params": {"arguments": {}}, "id": 1}, -32602),
        ({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "add", "arguments": [1]}, "id": 1}, -32602),
        (
            {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "add", "arguments": {"a": "x"}}, "id": 1},
            -32602,
        ),
        ({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "fail"}, "id": 1}, -32603),
        ({"jsonrpc": "2.0", "method": "tools/call", "params": [1], "id": 1}, -32602),
        ({"jsonrpc": "2.0", "method": "resources/list", "id": 1}, -32601),
        ({"jsonrpc": "1.0", "method": "tools/list", "id": 1}, -32600),
        ({"jsonrpc": "2.0", "id": 1}, -32600),
    ],
)
async def test_mcp_frames_get_json_rpc_errors_and_the_session_goes_on(request_: dict[str, Any], code: int) -> None:
    session = ServerSession(Toolbox())
    reply = await ask(session, {"type": "mcp", "data": request_})
    assert reply["type"] == "mcp"
    assert reply["data"]["jsonrpc"] == "2.0"
    assert reply["data"]["error"]["code"] == code
    assert "result" not in reply["data"]
    ok = await ask(session, {"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list", "id": 2}})
    assert [tool["name"] for tool in ok["data"]["result"]["tools"]] == ["add", "norm", "fail"]
    await session.aclose()


async def test_mcp_tool_results_are_shaped_as_fastmcp_s() -> None:
    session = ServerSession(Toolbox())
    call = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "add", "arguments": {"a": 1}}, "id": "x"}
    reply = await ask(session, {"type": "mcp", "data": call})
    assert reply["data"] == {
        "jsonrpc": "2.0",
        "id": "x",
        "result": {
            "content": [{"type": "text", "text": "2"}],
            "structured_content": {"result": 2},
            "meta": None,
            "data": 2,
            "is_error": False,
        },
    }
    await session.aclose()


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_the_echo_tools_over_every_transport(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, EchoEnvironment) as url, EchoEnv(url) as env:
            assert [tool.name for tool in await env.list_tools()] == ["echo_message", "echo_with_length"]
            assert await env.call_tool("echo_with_length", message="four") == {"message": "four", "length": 4}
            with pytest.raises(openenv.ToolCallError):
                await env.call_tool("echo_message")
            result = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "Hi"}))
            assert (result.observation.echoed_message, result.observation.result) == ("Hi", "Hi")
            listed = await env.mcp("tools/call", {"name": "echo_message", "arguments": {"message": "rpc"}})
            assert listed["data"] == "rpc"
            assert (await env.state()).step_count == 4  # mcp frames bypass step


async def test_bad_mcp_frames_and_failing_tools_leave_other_sessions_unharmed() -> None:
    with anyio.fail_after(LIMIT):
        async with serving("ws", Toolbox) as url, openenv.EnvClient(url) as noisy, openenv.EnvClient(url) as quiet:
            assert await quiet.call_tool("add", a=1) == 2
            with pytest.raises(openenv.ToolCallError):
                await noisy.call_tool("fail")
            with pytest.raises(openenv.MCPError):
                await noisy.mcp("tools/call", {"name": "add", "arguments": "not an object"})
            with pytest.raises(openenv.ValidationError):
                await noisy.step({"type": "call_tool"})  # no tool_name
            assert await quiet.call_tool("add", a=2, b=2) == 4
            assert await noisy.call_tool("add", a=0) == 1  # and the noisy one goes on too


# Every method of DocumentedTools, as a tool.
DocumentedEnv = types.new_class(
    "DocumentedEnv",
    (MCPEnvironment[CallToolAction, CallToolObservation, State],),
    exec_body=lambda namespace: namespace.update(
        {name: openenv.tool(getattr(DocumentedTools, name)) for name in DOCUMENTED_NAMES}
    ),
)


def test_a_tool_is_described_by_its_docstring_as_fastmcp_describes_it() -> None:
    move = DocumentedEnv.tools["move"].describe()
    assert (
        move.description
        == "Move the agent on the grid.\n\nThe agent walks one cell per step; walls stop it.\nMore prose here."
    )
    properties = move.input_schema["properties"]
    assert properties["direction"]["description"] == 'Where to go: "north", "south",\n"east" or "west".'
    assert (properties["steps"]["description"], properties["fast"]["description"]) == (
        "How many cells.",
        "Run instead of walking.",
    )
    assert "description" not in DocumentedEnv.tools["undocumented"].input_schema["properties"]["x"]


@pytest.mark.interop
def test_tool_descriptions_match_fastmcps() -> None:
    """The same methods, as FastMCP 3 (in openenv 0.10.0's venv) and openenv describe them to an agent."""
    python = ensure_reference_python(reference=OPENENV_0_10)
    script = Path(__file__).resolve().parents[1] / "interop" / "reference_tools.py"
    done = subprocess.run(
        [str(python), str(script)], capture_output=True, text=True, timeout=120, cwd=script.parent, env=reference_env()
    )
    assert done.returncode == 0, done.stderr
    for theirs in json.loads(done.stdout):
        ours = DocumentedEnv.tools[theirs["name"]].describe()
        assert ours.description == (theirs["description"] or ""), theirs["name"]
        assert ours.input_schema == theirs["parameters"], theirs["name"]
