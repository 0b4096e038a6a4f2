"""EnvClient's own logic: types, aliases, lifecycle and reply matching, on scripted transports."""

from __future__ import annotations

import json
import logging
import re
import ssl as ssl_module
import subprocess
import sys
from collections import deque
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import openenv
from openenv import Dialect, EnvClient, Transport
from openenv._limits import SEND_GRACE
from openenv.examples.echo import (
    CallToolAction,
    EchoEnv,
    EchoEnvironment,
    EchoObservation,
    EchoState,
    ListToolsAction,
)
from tests.envs import AsyncCounterEnv, CountAction, CountObservation, CountState
from tests.helpers import CounterClient, ManualClock, all_tasks_blocked, cancel_when_blocked
from transports.inprocess import InProcessTransport
from transports.server._logs import configure_console_logging

pytestmark = pytest.mark.anyio


class ScriptedTransport(Transport):
    """Answers each sent frame with the next scripted reply (bytes), or raises what is scripted."""

    def __init__(self, replies: list[Any], *, dialect: Dialect = Dialect(), connect_error: Exception | None = None):
        self.dialect = dialect
        self.replies: deque[Any] = deque(replies)
        self.sent: list[dict[str, Any]] = []
        self.inbox: deque[bytes] = deque()
        self.connect_error = connect_error
        self.closed = False

    async def __aenter__(self) -> ScriptedTransport:
        if self.connect_error is not None:
            raise self.connect_error
        return self

    async def send(self, frame: bytes) -> None:
        if self.closed:
            raise openenv.ConnectionClosed("closed")
        self.sent.append(json.loads(frame))
        if self.sent[-1]["type"] == "close":
            return
        reply = self.replies.popleft()
        if isinstance(reply, Exception):
            raise reply
        self.inbox.append(reply)

    async def receive(self) -> bytes:
        if not self.inbox:
            raise openenv.ConnectionClosed("no more frames")
        return self.inbox.popleft()

    async def aclose(self) -> None:
        self.closed = True


def observation(count: int, **extra: Any) -> bytes:
    return json.dumps(
        {"type": "observation", "data": {"observation": {"count": count}, "reward": 1.0, "done": False}, **extra}
    ).encode()


def test_type_parameters_drive_decoding() -> None:
    assert CounterClient.observation_type is CountObservation
    assert CounterClient.state_type is CountState
    assert EchoEnv.action_type == CallToolAction | ListToolsAction
    assert EnvClient.observation_type is dict

    class Deeper(CounterClient):
        pass

    assert Deeper.observation_type is CountObservation
    client = EnvClient("inproc://x:y", observation_type=EchoObservation, state_type=EchoState)
    assert client.observation_type is EchoObservation


async def test_a_subscripted_client_is_typed_without_a_subclass() -> None:
    """``EnvClient[A, O, S](url)`` decodes into O and S, like a subclass would."""
    with anyio.fail_after(5):
        async with EnvClient[CountAction, CountObservation, CountState](
            transport=InProcessTransport(factory=AsyncCounterEnv)
        ) as env:
            result = await env.step(CountAction(by=3))
            assert isinstance(result.observation, CountObservation)
            assert result.observation.count == 3
            assert isinstance(await env.state(), CountState)
        # Types given to the constructor still win over the alias's.
        async with EnvClient[CountAction, CountObservation, CountState](
            transport=InProcessTransport(factory=AsyncCounterEnv), observation_type=dict
        ) as env:
            assert isinstance((await env.reset()).observation, dict)
            assert isinstance(await env.state(), CountState)


def test_aliases_are_the_native_methods() -> None:
    assert EnvClient.reset_async is EnvClient.reset
    assert EnvClient.step_async is EnvClient.step

    class Logged(CounterClient):
        async def step(self, action: CountAction, **kwargs: Any) -> Any:
            return "overridden"

    assert Logged.step_async is Logged.step


def test_a_url_or_a_transport_is_needed() -> None:
    with pytest.raises(ValueError, match="base_url or a transport"):
        EnvClient()


async def test_explicit_transport_overrides_the_url() -> None:
    transport = InProcessTransport(factory=AsyncCounterEnv)
    with anyio.fail_after(5):
        async with CounterClient("ws://127.0.0.1:9/never", transport=transport) as env:
            assert env.transport is transport
            assert (await env.step(CountAction(by=2))).observation.count == 2


@pytest.mark.parametrize("dialect", [Dialect(), Dialect(request_ids=True), Dialect("msgpack", True)])
async def test_every_dialect_matches_late_replies(dialect: Dialect) -> None:
    transport = InProcessTransport(factory=AsyncCounterEnv, dialect=dialect)
    clock = ManualClock()
    with anyio.fail_after(5):
        async with CounterClient(transport=transport, clock=clock) as env:
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(clock.advance_when_blocked, 2.0)  # the step is at the environment
                with pytest.raises(openenv.TimeoutError):
                    await env.step(CountAction(by=10, delay=0.2), timeout=1.0)
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(cancel_when_blocked, task_group.cancel_scope)
                await env.step(CountAction(by=100, delay=0.2))
            result = await env.step(CountAction(by=1))
            assert (result.observation.count, result.reward) == (111, 1.0)


async def test_plain_dialect_sends_no_ids_and_ids_are_checked() -> None:
    transport = ScriptedTransport([observation(1)])
    async with CounterClient(transport=transport) as env:
        await env.step(CountAction())
    assert "id" not in transport.sent[0]
    assert transport.sent[-1] == {"type": "close"}

    transport = ScriptedTransport([observation(1, id=99)], dialect=Dialect(request_ids=True))
    async with CounterClient(transport=transport) as env:
        with pytest.raises(openenv.ProtocolError, match="id 99"):
            await env.step(CountAction())


async def test_malformed_reply_is_a_protocol_error() -> None:
    transport = ScriptedTransport([b"\x00garbage", b'{"type": "error", "data": {"code": "WHAT", "message": "m"}}'])
    async with CounterClient(transport=transport) as env:
        with pytest.raises(openenv.ProtocolError):
            await env.step(CountAction())
        with pytest.raises(openenv.ServerError) as info:
            await env.step(CountAction())
        assert type(info.value) is openenv.ServerError
        assert info.value.code == "WHAT"


async def test_wrong_reply_kind_is_a_protocol_error() -> None:
    state = json.dumps({"type": "state", "data": {"count": 1}}).encode()
    transport = ScriptedTransport([state, observation(1)])
    async with CounterClient(transport=transport) as env:
        with pytest.raises(openenv.ProtocolError, match="observation"):
            await env.step(CountAction())
        with pytest.raises(openenv.ProtocolError, match="state"):
            await env.state()


async def test_the_reason_a_server_gave_before_closing_is_raised() -> None:
    capacity = json.dumps(
        {
            "type": "error",
            "data": {"message": "full", "code": "CAPACITY_REACHED", "active_sessions": 1, "max_sessions": 1},
        }
    ).encode()
    transport = ScriptedTransport([openenv.ConnectionClosed("closed by peer")])
    transport.inbox.append(capacity)
    async with CounterClient(transport=transport) as env:
        with pytest.raises(openenv.CapacityReachedError) as info:
            await env.reset()
    assert info.value.data["max_sessions"] == 1
    assert isinstance(info.value.__cause__, openenv.ConnectionClosed)


async def test_connection_closed_without_a_reason() -> None:
    transport = ScriptedTransport([openenv.ConnectionClosed("closed by peer")])
    async with CounterClient(transport=transport) as env:
        with pytest.raises(openenv.ConnectionClosed, match="closed by peer"):
            await env.reset()


async def test_foreign_connect_errors_are_translated() -> None:
    transport = ScriptedTransport([], connect_error=OSError("refused"))
    with pytest.raises(openenv.ConnectError, match="refused") as info:
        async with CounterClient(transport=transport):
            pass
    assert isinstance(info.value, ConnectionError)


async def test_unloadable_inproc_factory_is_a_connect_error() -> None:
    for url in ("inproc://no.such.module:Env", "inproc://tests.envs:Nothing", "inproc://missing-colon"):
        with pytest.raises(openenv.ConnectError):
            async with EnvClient(url):
                pass


async def test_repr_names_the_state() -> None:
    env = EchoEnv("inproc://openenv.examples.echo:EchoEnvironment")
    assert "unopened" in repr(env)
    async with env:
        assert "opened" in repr(env)
    assert "closed" in repr(env)


async def test_echo_environment_reports_tool_errors() -> None:
    async with EchoEnv(transport=InProcessTransport(factory=EchoEnvironment)) as env:
        result = await env.step(CallToolAction(tool_name="shout"))
        assert result.observation.error == openenv.ToolError(
            error_type="tool_not_found", message="Tool 'shout' not found; available: echo_message, echo_with_length"
        )
        assert result.observation.result is None
        with pytest.raises(openenv.ToolCallError, match="str") as caught:
            await env.call_tool("echo_message", message=3)
        assert (caught.value.tool_name, caught.value.error_type) == ("echo_message", "invalid_args")
        assert await env.call_tool("echo_message", message="still here") == "still here"


class StallingTransport(Transport):
    """With request ids: the first send never completes (as if cut off before any byte left).

    While it stalls, the client's clock moves on by ``stall`` seconds.
    """

    dialect = Dialect(request_ids=True)

    def __init__(self, clock: ManualClock, stall: float) -> None:
        self.inbox: deque[bytes] = deque()
        self.sends = 0
        self.clock = clock
        self.stall = stall

    async def __aenter__(self) -> StallingTransport:
        return self

    async def send(self, frame: bytes) -> None:
        self.sends += 1
        if self.sends == 1:
            self.clock.advance(self.stall)
            await anyio.sleep_forever()
        message = json.loads(frame)
        if message["type"] != "close":
            self.inbox.append(observation(self.sends, id=message["id"]))

    async def receive(self) -> bytes:
        return self.inbox.popleft()

    async def aclose(self) -> None:
        pass


async def test_a_request_cut_off_while_sending_is_skipped_by_id() -> None:
    clock = ManualClock()
    transport = StallingTransport(clock, stall=2.0)
    with anyio.fail_after(5):
        async with CounterClient(transport=transport, clock=clock) as env:
            with pytest.raises(openenv.TimeoutError):
                await env.step(CountAction(), timeout=1.0)
            result = await env.step(CountAction())
            assert result.observation.count == 2
            assert env.is_connected


async def test_plain_dialect_closes_the_client_when_a_send_is_cut_off() -> None:
    clock = ManualClock()
    transport = StallingTransport(clock, stall=1.0 + SEND_GRACE)  # past the deadline and the send's grace
    transport.dialect = Dialect()
    with anyio.fail_after(5):
        async with CounterClient(transport=transport, clock=clock) as env:
            with pytest.raises(openenv.TimeoutError, match="closed"):
                await env.step(CountAction(), timeout=1.0)
            assert not env.is_connected
            with pytest.raises(openenv.ClientStateError):
                await env.step(CountAction())


async def test_plain_dialect_timeout_that_elapsed_before_sending_keeps_the_session() -> None:
    """A deadline already past sends nothing: a TimeoutError, and the session goes on (it closed the client)."""
    transport = ScriptedTransport([observation(1), observation(2)])
    with anyio.fail_after(5):
        async with CounterClient(transport=transport) as env:
            with pytest.raises(openenv.TimeoutError, match="before the request was sent"):
                await env.step(CountAction(), timeout=0)
            assert env.is_connected
            assert transport.sent == []
            assert (await env.step(CountAction())).observation.count == 1


class SilentTransport(ScriptedTransport):
    """With request ids: answers each request with a count, except while ``silent``: then no reply ever comes."""

    def __init__(self) -> None:
        super().__init__([], dialect=Dialect(request_ids=True))
        self.silent = False

    async def send(self, frame: bytes) -> None:
        message = json.loads(frame)
        self.sent.append(message)
        if not self.silent and message["type"] != "close":
            self.inbox.append(observation(len(self.sent), id=message["id"]))

    async def receive(self) -> bytes:
        if not self.inbox:
            await anyio.sleep_forever()
        return self.inbox.popleft()


async def test_each_call_times_out_at_its_own_deadline_whatever_came_before() -> None:
    """A shorter timeout after a longer one, and a longer one after a shorter one, each fire on time."""
    clock = ManualClock()
    transport = SilentTransport()

    async def step_silently(timeout: float) -> None:
        transport.silent = True
        try:
            with pytest.raises(openenv.TimeoutError, match=f"no reply within {timeout} s"):
                await env.step(CountAction(), timeout=timeout)
        finally:
            transport.silent = False

    with anyio.fail_after(5):
        async with CounterClient(transport=transport, clock=clock, timeout=60.0) as env:
            await env.step(CountAction())  # a 60 s deadline, armed and left unused
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(clock.advance_when_blocked, 1.0)
                await step_silently(1.0)

            await env.step(CountAction(), timeout=2.0)  # a 2 s deadline, armed and left unused
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(step_silently, 5.0)
                await clock.advance_when_blocked(4.9)  # past the earlier call's deadline, not this one's
                await all_tasks_blocked()
                assert transport.silent  # still waiting
                await clock.advance_when_blocked(0.1)
            assert not transport.silent
            assert (await env.step(CountAction())).observation.count == 5  # the session goes on


class SlowSendTransport(ScriptedTransport):
    """Plain dialect; the first send takes longer than the call's timeout on the client's clock, then goes whole."""

    def __init__(self, replies: list[Any], clock: ManualClock, send_takes: float) -> None:
        super().__init__(replies)
        self.clock = clock
        self.send_takes = send_takes

    async def send(self, frame: bytes) -> None:
        if not self.sent:
            self.clock.advance(self.send_takes)  # the call's deadline passes while the frame goes out
            await anyio.lowlevel.checkpoint()
        await super().send(frame)

    async def receive(self) -> bytes:
        await anyio.lowlevel.checkpoint()  # waits, as a network's reply does
        return await super().receive()


async def test_plain_dialect_timeout_that_elapses_while_sending_keeps_the_session() -> None:
    """The deadline passing mid-send does not cut the send short (which closed the client): the reply is late."""
    clock = ManualClock()
    transport = SlowSendTransport([observation(1), observation(2)], clock, send_takes=SEND_GRACE / 2)
    with anyio.fail_after(5):
        async with CounterClient(transport=transport, clock=clock) as env:
            with pytest.raises(openenv.TimeoutError, match="no reply within"):
                await env.step(CountAction(), timeout=SEND_GRACE / 4)
            assert env.is_connected
            # The first request went out whole; its late reply is dropped, not handed to this call.
            assert (await env.step(CountAction())).observation.count == 2


async def test_a_reply_to_an_unknown_id_is_a_protocol_error() -> None:
    transport = ScriptedTransport([observation(1, id=1), observation(1, id=1)], dialect=Dialect(request_ids=True))
    async with CounterClient(transport=transport) as env:
        await env.step(CountAction())
        with pytest.raises(openenv.ProtocolError, match="unknown request id 1"):
            await env.step(CountAction())


async def test_types_msgspec_cannot_decode_fail_on_connect() -> None:
    transport = ScriptedTransport([])
    with pytest.raises(TypeError):
        async with EnvClient(transport=transport, observation_type=object()):
            pass
    assert transport.closed


@pytest.mark.anyio
async def test_an_uncaught_validation_error_says_why() -> None:
    async with EnvClient("inproc://tests.envs:AsyncCounterEnv") as env:
        await env.reset()
        with pytest.raises(openenv.ValidationError) as caught:
            await env.step({"by": "two"})
    assert str(caught.value) == "[VALIDATION_ERROR] Invalid message: Expected `int`, got `str` (at by)"


def test_a_validation_error_names_every_problem_a_server_reports() -> None:
    # OpenEnv's server reports all of pydantic's errors; openenv's reports the first.
    error = openenv.ValidationError(
        "Invalid message",
        data={
            "message": "Invalid message",
            "code": "VALIDATION_ERROR",
            "errors": [
                {"type": "enum", "loc": ["direction"], "msg": "Invalid enum value 'diagonal'"},
                {"type": "missing", "loc": ["target", 0], "msg": "Field required"},
                {"type": "odd", "loc": [], "msg": "Something else"},
                "not a dict",
            ],
        },
    )
    assert str(error) == (
        "[VALIDATION_ERROR] Invalid message: Invalid enum value 'diagonal' (at direction); "
        "Field required (at target.0); Something else"
    )
    assert str(openenv.ValidationError("Invalid message")) == "[VALIDATION_ERROR] Invalid message"


def test_a_plain_with_says_to_use_async_with_or_sync() -> None:
    def as_a_new_user_writes_it() -> None:
        with EchoEnv("ws://127.0.0.1:8000"):  # type: ignore[misc]
            pass

    with pytest.raises(TypeError, match=r"EchoEnv is async: use `async with EchoEnv\(...\) as env:`, or `with EchoEnv"):
        as_a_new_user_writes_it()


def test_an_in_process_environment_error_the_caller_catches_prints_nothing() -> None:
    script = (
        "import anyio, openenv\n"
        "async def main():\n"
        "    async with openenv.EnvClient('inproc://tests.envs:AsyncCounterEnv') as env:\n"
        "        await env.reset()\n"
        "        try:\n"
        "            await env.step({'fail': True})\n"
        "        except openenv.ExecutionError as exc:\n"
        "            print(exc)\n"
        "anyio.run(main)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[EXECUTION_ERROR] RuntimeError: asked to fail"
    assert result.stderr == ""


def test_openenv_serve_still_logs_environment_errors_to_its_console() -> None:
    openenv_logger = logging.getLogger("openenv")
    before = list(openenv_logger.handlers)
    try:
        configure_console_logging("info")
        assert any(type(handler) is logging.StreamHandler for handler in openenv_logger.handlers)
    finally:
        openenv_logger.handlers[:] = before


@pytest.mark.parametrize(
    ("url", "options", "expected"),
    [
        (
            "ws://127.0.0.1:8000",
            {"message_timeout_s": 30.0},
            "unknown option message_timeout_s= for ws:// URLs (OpenEnv's message_timeout_s= is timeout= here); "
            "the options are: action_type, auth_token, clock, close_timeout, ",
        ),
        ("http+poll://127.0.0.1:8000", {"max_message_size_mb": 10}, "is max_message_size= here (in bytes)"),
        # OpenEnv 0.10's names.
        (
            "ws://127.0.0.1:8000",
            {"websocket_ping_interval_s": 5.0, "websocket_ping_timeout_s": 5.0},
            "unknown option websocket_ping_interval_s=, websocket_ping_timeout_s= for ws:// URLs (OpenEnv's "
            "websocket_ping_interval_s= is ping_interval= here; websocket_ping_timeout_s= is ping_timeout= here); ",
        ),
        ("ws://127.0.0.1:8000", {"provider": object()}, "OpenEnv's provider= has no counterpart: a project:// URL"),
        ("inproc://tests.envs:DictEnv", {"connect_timeout": 1.0}, "unknown option connect_timeout= for inproc:// URLs"),
    ],
)
def test_an_unknown_transport_option_fails_at_construction(url: str, options: dict[str, Any], expected: str) -> None:
    with pytest.raises(TypeError, match=re.escape(expected)):
        EnvClient(url, **options)


@pytest.mark.parametrize(
    ("url", "options", "expected"),
    [
        (
            "ws://127.0.0.1:8000",
            {"connect_timeout": "10"},
            "the connect_timeout= option of ws:// URLs takes float | None, not str ('10')",
        ),
        ("ws://h", {"headers": [("X-Trace", 1)]}, "the headers= option of ws:// URLs takes Mapping[str, str] |"),
        ("ws://h", {"subprotocols": "openenv.v1.json"}, "takes Sequence[str] | None, not str"),
        ("ws://h", {"resume": 1}, "the resume= option of ws:// URLs takes bool, not int (1)"),
        ("http+poll://h", {"retries": 2.5}, "the retries= option of http+poll:// URLs takes int, not float (2.5)"),
        (
            "http+poll://h",
            {"client": "httpx"},
            "the client= option of http+poll:// URLs takes httpx.AsyncClient | None",
        ),
        (
            "inproc://tests.envs:DictEnv",
            {"close_timeout": None},
            "the close_timeout= option of inproc:// URLs takes float",
        ),
    ],
)
def test_an_option_of_the_wrong_type_fails_at_construction(url: str, options: dict[str, Any], expected: str) -> None:
    with pytest.raises(TypeError, match=re.escape(expected)):
        EnvClient(url, **options)
    with pytest.raises(TypeError, match=re.escape(expected)):
        openenv.create_transport(url, **options)


def test_an_option_not_one_of_its_choices_fails_at_construction() -> None:
    expected = "unknown encoding 'xml' for wss:// URLs; use one of 'json', 'msgpack'"
    with pytest.raises(ValueError, match=re.escape(expected)):
        EnvClient("wss://h", encoding="xml")
    with pytest.raises(ValueError, match=re.escape(expected)):
        openenv.create_transport("wss://h", encoding="xml")


def test_an_option_of_a_type_msgspec_cannot_check_is_left_to_the_transport() -> None:
    def factory(url: str, *, ssl: ssl_module.SSLContext | bool = True, dialect: openenv.Dialect | None = None) -> Any:
        return (ssl, dialect)

    openenv.register_transport("test-unchecked", factory)
    assert openenv.create_transport("test-unchecked://x", ssl=False) == (False, None)  # type: ignore[comparison-overlap]
    with pytest.raises(
        TypeError, match=r"the dialect= option of test-unchecked:// URLs takes openenv\.Dialect \| None"
    ):
        openenv.create_transport("test-unchecked://x", dialect="json")


def test_options_of_the_declared_types_pass_construction() -> None:
    EnvClient(
        "ws://127.0.0.1:8000",
        connect_timeout=1,  # an int is a float
        ping_interval=None,
        headers=[["X-Trace", "1"]],  # a pair as a list unpacks alike
        subprotocols=("openenv.v1.json",),
        encoding="msgpack",
        ssl_context=None,
    )
    EnvClient("http+poll://127.0.0.1:8000", headers={"X-Trace": "1"}, retries=0, poll_timeout=5)


def test_options_a_transport_takes_and_unknown_schemes_pass_construction() -> None:
    EnvClient("ws://127.0.0.1:8000", connect_timeout=1.0, timeout=2.0)
    EnvClient("no-such-scheme://x", whatever=1)  # the scheme is reported at connect, as before
