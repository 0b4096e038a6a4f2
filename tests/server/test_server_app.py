"""The server app: its HTTP routes, the session registry, and the /ws endpoint on the wire.

The /ws tests speak raw WebSocket frames (websockets' sans-I/O protocol over an
anyio stream, so they run on asyncio and trio alike) against a real embedded
server: uvicorn under asyncio, hypercorn under trio.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, ClassVar

import anyio
import httpx
import msgspec
import pytest
from anyio.abc import ByteStream
from websockets.client import ClientProtocol
from websockets.frames import Close, Opcode
from websockets.http11 import Response
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

import openenv
from openenv import Action, EnvironmentMetadata, Observation, State
from openenv.examples.echo import CallToolAction, EchoEnv, EchoEnvironment
from openenv.server import Environment
from tests.helpers import ManualClock, wait_until
from transports.admission._sessions import IDLE_TIMEOUT_REASON, SHUTDOWN_REASON, SessionRegistry
from transports.server.app import create_app, environment_schemas
from transports.server.runner import RunningServer, serve

pytestmark = pytest.mark.anyio

LIMIT = 10  # seconds: the bound of every wait in these tests


# -- a raw WebSocket client ------------------------------------------------------


class WebSocketClosed(Exception):
    """The server closed the connection (or it broke)."""

    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__(f"closed: {code} {reason!r}")
        self.code = code
        self.reason = reason


class RawWebSocket:
    """A minimal WebSocket client for the tests: frames in, frames out, nothing more."""

    def __init__(self, stream: ByteStream, protocol: ClientProtocol) -> None:
        self._stream = stream
        self._protocol = protocol
        self._frames: list[Any] = []

    @property
    def subprotocol(self) -> str | None:
        return self._protocol.subprotocol

    @classmethod
    @asynccontextmanager
    async def connect(cls, url: str, subprotocols: list[str] | None = None) -> AsyncIterator[RawWebSocket]:
        uri = parse_uri(url)
        stream = await anyio.connect_tcp(uri.host, uri.port)
        offer = [Subprotocol(name) for name in subprotocols] if subprotocols else None
        protocol = ClientProtocol(uri, subprotocols=offer, max_size=None)
        try:
            protocol.send_request(protocol.connect())
            await stream.send(b"".join(protocol.data_to_send()))
            events: list[Any] = []
            while not events:
                protocol.receive_data(await stream.receive())
                events = protocol.events_received()
            if not isinstance(events[0], Response) or protocol.handshake_exc is not None:
                raise AssertionError(f"the handshake failed: {protocol.handshake_exc or events[0]}")
            websocket = cls(stream, protocol)
            websocket._frames.extend(events[1:])  # frames that came with the response (CAPACITY_REACHED)
            yield websocket
        finally:
            await stream.aclose()

    async def _flush(self) -> None:
        data = b"".join(self._protocol.data_to_send())
        if data:
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await self._stream.send(data)

    async def send_text(self, text: str) -> None:
        self._protocol.send_text(text.encode())
        await self._flush()

    async def send_bytes(self, data: bytes) -> None:
        self._protocol.send_binary(data)
        await self._flush()

    async def flood(self, frames: Callable[[ClientProtocol], object], limit: int) -> int:
        """Send what ``frames`` queues on the protocol, over and over, until a send stalls; the bytes sent.

        A send that makes no progress for 2 s counts as held back (the server
        stopped reading); past ``limit`` bytes sent, the flood stops anyway.
        """
        frames(self._protocol)
        chunk = b"".join(self._protocol.data_to_send())
        sent = 0
        while sent < limit:
            with anyio.move_on_after(2) as scope:
                await self._stream.send(chunk)
                sent += len(chunk)
            if scope.cancelled_caught:
                return sent
        raise AssertionError(f"{sent} bytes were read without backpressure")

    async def receive(self) -> str | bytes:
        """The next data frame; raises `WebSocketClosed` once the server has closed."""
        while True:
            while self._frames:
                frame = self._frames.pop(0)
                if frame.opcode is Opcode.TEXT:
                    return frame.data.decode()  # type: ignore[no-any-return]
                if frame.opcode is Opcode.BINARY:
                    return bytes(frame.data)
                if frame.opcode is Opcode.CLOSE:
                    await self._flush()  # our half of the closing handshake
                    close = Close.parse(frame.data) if frame.data else None
                    raise WebSocketClosed(close.code if close else None, close.reason if close else "")
            try:
                data = await self._stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._protocol.receive_eof()
                raise WebSocketClosed(None, "connection lost") from None
            self._protocol.receive_data(data)
            await self._flush()  # pongs
            self._frames.extend(self._protocol.events_received())

    async def ping(self, payload: bytes = b"ping") -> None:
        """Ping the server and wait for the pong; data frames that come meanwhile stay for `receive`."""
        self._protocol.send_ping(payload)
        await self._flush()
        while True:
            for index, frame in enumerate(self._frames):
                if frame.opcode is Opcode.PONG and bytes(frame.data) == payload:
                    del self._frames[index]
                    return
            try:
                data = await self._stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise WebSocketClosed(None, "connection lost") from None
            self._protocol.receive_data(data)
            self._frames.extend(self._protocol.events_received())

    async def receive_json(self) -> Any:
        frame = await self.receive()
        assert isinstance(frame, str), f"expected a text frame, got {frame!r}"
        return json.loads(frame)

    async def receive_bytes(self) -> bytes:
        frame = await self.receive()
        assert isinstance(frame, bytes), f"expected a binary frame, got {frame!r}"
        return frame

    async def request(self, text: str) -> Any:
        await self.send_text(text)
        return await self.receive_json()

    async def expect_close(self) -> WebSocketClosed:
        """Wait for the server to close; fail on any data frame first."""
        try:
            frame = await self.receive()
        except WebSocketClosed as closed:
            return closed
        raise AssertionError(f"expected the server to close, got {frame!r}")

    async def close(self, code: int = 1000) -> None:
        self._protocol.send_close(code)
        await self._flush()
        with anyio.move_on_after(2):
            while True:
                try:
                    await self.receive()
                except WebSocketClosed:
                    break


# -- environments ----------------------------------------------------------------


class MessageAction(Action):
    message: str
    delay: float = 0.0


class MessageObservation(Observation):
    echoed_message: str = ""


class WireEchoEnv(Environment[MessageAction, MessageObservation, State]):
    """The wire document's echo environment: reward is the message's length; "raise" raises."""

    closed: ClassVar[list[WireEchoEnv]] = []
    stepping: ClassVar[threading.Event] = threading.Event()

    def __init__(self) -> None:
        self._state = State()

    async def reset(self, seed: int | None = None, episode_id: str | None = None) -> MessageObservation:
        self._state = State(episode_id=episode_id)
        return MessageObservation(echoed_message="", reward=0.0, done=False)

    async def step(self, action: MessageAction) -> MessageObservation:
        if action.delay:
            WireEchoEnv.stepping.set()
            await anyio.sleep(action.delay)
        if action.message == "raise":
            raise RuntimeError("echo env: step raised on request")
        self._state.step_count += 1
        return MessageObservation(echoed_message=action.message, reward=float(len(action.message)))

    @property
    def state(self) -> State:
        return self._state

    async def close(self) -> None:
        WireEchoEnv.closed.append(self)


class SlowSyncEnv(Environment[MessageAction, MessageObservation, State]):
    """Plain methods, so steps run in a worker thread; records when it is closed."""

    closed: ClassVar[list[SlowSyncEnv]] = []
    stepping: ClassVar[threading.Event] = threading.Event()

    def reset(self, **kwargs: Any) -> MessageObservation:
        return MessageObservation()

    def step(self, action: MessageAction) -> MessageObservation:
        SlowSyncEnv.stepping.set()
        threading.Event().wait(action.delay)
        return MessageObservation(echoed_message=action.message)

    @property
    def state(self) -> State:
        return State()

    def close(self) -> None:
        SlowSyncEnv.closed.append(self)


class SlowCloseEnv(Environment[MessageAction, MessageObservation, State]):
    """Plain methods; its close blocks on the session's thread until the test lets it finish."""

    closing: ClassVar[threading.Event] = threading.Event()
    may_close: ClassVar[threading.Event] = threading.Event()

    def reset(self, **kwargs: Any) -> MessageObservation:
        return MessageObservation()

    def step(self, action: MessageAction) -> MessageObservation:
        return MessageObservation(echoed_message=action.message)

    @property
    def state(self) -> State:
        return State()

    def close(self) -> None:
        SlowCloseEnv.closing.set()
        SlowCloseEnv.may_close.wait(LIMIT)


def broken_factory() -> WireEchoEnv:
    raise OSError("no GPU left")


@pytest.fixture(autouse=True)
def _forget_closed_envs() -> None:
    WireEchoEnv.closed.clear()
    WireEchoEnv.stepping.clear()
    SlowSyncEnv.closed.clear()
    SlowSyncEnv.stepping.clear()
    SlowCloseEnv.closing.clear()
    SlowCloseEnv.may_close.clear()


@asynccontextmanager
async def ws_server(factory: Any = WireEchoEnv, **options: Any) -> AsyncIterator[tuple[RunningServer, str]]:
    async with serve(factory, **options) as server:
        yield server, server.ws_url


def registry_of(server: RunningServer) -> SessionRegistry:
    registry = server.app.state.sessions
    assert isinstance(registry, SessionRegistry)
    return registry


# -- HTTP routes -------------------------------------------------------------------


@asynccontextmanager
async def http_client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as client:
        yield client


async def test_health() -> None:
    with anyio.fail_after(LIMIT):
        async with http_client(create_app(EchoEnvironment)) as client:
            response = await client.get("/health")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"status": "healthy"}


async def test_schema_of_an_environment_class() -> None:
    with anyio.fail_after(LIMIT):
        async with http_client(create_app(EchoEnvironment)) as client:
            response = await client.get("/schema")
    assert response.status_code == 200
    schemas = response.json()
    assert set(schemas) == {"action", "observation", "state", "reset_observation"}
    # A tool environment takes two actions; the call names the tools it can call.
    assert schemas["action"]["anyOf"] == [{"$ref": "#/$defs/CallToolAction"}, {"$ref": "#/$defs/ListToolsAction"}]
    action = schemas["action"]["$defs"]["CallToolAction"]
    assert set(action["properties"]) == {"type", "tool_name", "arguments", "metadata"}
    assert action["properties"]["tool_name"]["enum"] == ["echo_message", "echo_with_length"]
    assert action["required"] == ["tool_name"]
    # The observation model itself, at the top, as the reference's pydantic schema is.
    observation = schemas["observation"]
    assert observation["title"] == "EchoObservation"
    assert set(observation["properties"]) == {
        "done",
        "reward",
        "metadata",
        "tool_name",
        "result",
        "error",
        "echoed_message",
    }
    assert "ToolError" in observation["$defs"]
    state = schemas["state"]
    assert set(state["properties"]) == {"episode_id", "step_count"}


def test_schema_of_functions() -> None:
    def untyped() -> Any:
        return WireEchoEnv()

    def annotated() -> WireEchoEnv:
        return WireEchoEnv()

    loose = environment_schemas(untyped)
    assert loose == {
        "action": {"type": "object"},
        "observation": {"type": "object"},
        "state": {"type": "object"},
        "reset_observation": {"type": "object"},
    }
    typed = environment_schemas(annotated)
    assert typed["action"]["title"] == "MessageAction"
    assert typed["action"]["required"] == ["message"]
    assert set(typed["observation"]["properties"]) == {"done", "reward", "metadata", "echoed_message"}


async def test_metadata_from_the_class_or_given() -> None:
    with anyio.fail_after(LIMIT):
        async with http_client(create_app("openenv.examples.echo:EchoEnvironment")) as client:
            meta = (await client.get("/metadata")).json()
        assert meta["name"] == "EchoEnvironment"
        assert meta["description"].startswith("Echoes messages back")
        # Every field is there, as the reference server sends them (null when unknown).
        assert set(meta) == {"name", "description", "readme_content", "version", "author", "documentation_url"}
        given = EnvironmentMetadata(name="echo", description="An echo.", version="1.2.3")
        async with http_client(create_app(EchoEnvironment, metadata=given)) as client:
            meta = (await client.get("/metadata")).json()
        assert meta["name"] == "echo"
        assert meta["version"] == "1.2.3"
        assert meta["author"] is None


def test_create_app_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="form"):
        create_app("no_colon_here")
    with pytest.raises(ImportError):
        create_app("openenv.examples.echo:Missing")
    with pytest.raises(ValueError, match="max_sessions"):
        create_app(EchoEnvironment, max_sessions=0)
    with pytest.raises(ValueError, match="session_idle_timeout"):
        create_app(EchoEnvironment, session_idle_timeout=0)
    app = create_app(EchoEnvironment, max_sessions=3, session_idle_timeout=30)
    registry = app.state.sessions
    assert (registry.max_sessions, registry.session_idle_timeout) == (3, 30)
    assert app.state.factory is EchoEnvironment


# -- the session registry ----------------------------------------------------------


def test_registry_capacity_and_release() -> None:
    registry = SessionRegistry(max_sessions=2)
    first = registry.open()
    second = registry.open(transport="http+poll")
    assert first is not None
    assert second is not None
    assert first.id != second.id
    assert registry.active == 2
    assert registry.full
    assert registry.open() is None
    first.release()
    assert registry.active == 1
    assert not registry.full
    first.release()  # idempotent
    assert registry.active == 1
    third = registry.open()
    assert third is not None
    assert registry.active == 2
    assert registry.leases() == [second, third]
    second.release()
    third.release()
    assert registry.active == 0
    assert first.released
    assert second.released
    assert third.released


async def test_a_vacated_slot_is_free_while_its_lease_is_still_held() -> None:
    registry = SessionRegistry(max_sessions=1, queue_timeout=LIMIT)
    ending = registry.open()
    assert ending is not None
    ending.vacate()  # over; its environment is closing
    ending.vacate()  # idempotent
    assert (registry.active, registry.full, registry.leases()) == (0, False, [ending])
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as group:
            newcomer = registry.open()
            assert newcomer is not None
            admitted: list[Any] = []

            async def queue_up() -> None:
                admitted.append(await registry.admit())

            group.start_soon(queue_up)
            await wait_until(lambda: registry.queued == 1, "the third session waits for a slot")
            assert registry.expire_idle(registry.clock.now() + 3600) == []  # no idle timeout: nothing to reap
            registry.close_all()  # asks the newcomer to end, not the session already over
            assert (newcomer.close_reason, ending.close_reason) == (SHUTDOWN_REASON, None)
        assert admitted == [None]  # turned away: the server is stopping
        ending.release()
        assert registry.leases() == [newcomer]
        newcomer.vacate()
        newcomer.release()
        assert registry.active == 0
        await registry.wait_empty()


def test_a_vacated_lease_is_not_reaped() -> None:
    clock = ManualClock()
    registry = SessionRegistry(max_sessions=1, session_idle_timeout=1.0, clock=clock)
    lease = registry.open()
    assert lease is not None
    lease.vacate()
    clock.advance(10.0)
    assert registry.expire_idle() == []
    assert lease.close_reason is None


async def test_a_freed_slot_goes_to_the_queue_when_vacated() -> None:
    registry = SessionRegistry(max_sessions=1, queue_timeout=LIMIT)
    first = registry.open()
    assert first is not None
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as group:
            admitted: list[Any] = []

            async def queue_up() -> None:
                admitted.append(await registry.admit())

            group.start_soon(queue_up)
            await wait_until(lambda: registry.queued == 1, "the second session waits for a slot")
            first.vacate()
    (second,) = admitted
    assert second is not None
    assert (registry.active, registry.leases()) == (1, [first, second])
    first.release()
    assert registry.active == 1  # released after vacating: not freed twice
    second.release()
    assert registry.active == 0


def test_registry_without_limit() -> None:
    registry = SessionRegistry()
    leases = [registry.open() for _ in range(100)]
    assert all(lease is not None for lease in leases)
    assert registry.active == 100
    assert not registry.full
    assert registry.reap_interval is None


def test_registry_expires_only_idle_sessions() -> None:
    clock = ManualClock()
    expired: list[str] = []
    registry = SessionRegistry(session_idle_timeout=10.0, clock=clock)
    idle = registry.open(on_close=lambda: expired.append("idle"))
    busy = registry.open(on_close=lambda: expired.append("busy"))
    touched = registry.open(on_close=lambda: expired.append("touched"))
    assert idle is not None
    assert busy is not None
    assert touched is not None
    busy.mark_busy()
    clock.advance(9.0)
    touched.touch()
    assert registry.expire_idle() == []
    clock.advance(2.0)  # idle: 11 s; touched: 2 s; busy: never idle
    assert idle.idle_for() == pytest.approx(11.0)
    assert busy.idle_for() == 0.0
    assert registry.expire_idle() == [idle]
    assert expired == ["idle"]
    assert idle.close_reason == IDLE_TIMEOUT_REASON
    assert not idle.released  # the endpoint releases it, once the session has ended
    assert registry.active == 3
    clock.advance(100.0)
    assert registry.expire_idle() == [touched]  # expired once only
    assert expired == ["idle", "touched"]
    idle.release()
    touched.release()
    busy.release()
    assert registry.active == 0


def test_registry_survives_a_failing_expire_callback(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    registry = SessionRegistry(session_idle_timeout=1.0, clock=clock)

    def fail() -> None:
        raise RuntimeError("boom")

    lease = registry.open(on_close=fail)
    assert lease is not None
    clock.advance(5)
    assert registry.expire_idle() == [lease]
    assert "boom" in caplog.text


async def test_reaper_task_expires_idle_sessions() -> None:
    clock = ManualClock()
    registry = SessionRegistry(session_idle_timeout=600.0, clock=clock)
    assert registry.reap_interval == 5.0
    expired = anyio.Event()
    lease = registry.open(on_close=expired.set)
    assert lease is not None
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(registry.run_reaper)
            await clock.advance_when_blocked(595.0)  # a look, at 595 s of 600: not yet
            await clock.advance_when_blocked(5.0)
            assert not expired.is_set()
            await clock.advance_when_blocked(5.0)  # the first look past 600 s ends it
            await expired.wait()
            task_group.cancel_scope.cancel()
    assert lease.close_reason == IDLE_TIMEOUT_REASON


def test_close_all_ends_idle_sessions_now_and_busy_ones_later() -> None:
    registry = SessionRegistry()
    calls: list[str] = []
    idle = registry.open(on_close=lambda: calls.append("idle"))
    busy = registry.open(on_close=lambda: calls.append("busy"))
    assert idle is not None
    assert busy is not None
    busy.mark_busy()
    registry.close_all()
    assert calls == ["idle"]  # the busy one finishes its request, then sees close_reason
    assert idle.close_reason == busy.close_reason == SHUTDOWN_REASON
    registry.close_all("again")
    assert calls == ["idle"]
    assert idle.close_reason == SHUTDOWN_REASON


def test_close_all_calls_what_lasts_beyond_sessions_once_and_not_what_was_forgotten() -> None:
    registry = SessionRegistry()
    calls: list[str] = []
    registry.notify_closing(lambda: calls.append("waiting"))
    forget = registry.notify_closing(lambda: calls.append("forgotten"))
    forget()
    assert calls == []
    registry.close_all()  # with no session at all
    assert calls == ["waiting"]
    registry.cut_all()
    assert calls == ["waiting"]
    registry.notify_closing(lambda: calls.append("late"))()  # the server stops already: at once
    assert calls == ["waiting", "late"]


# -- the /ws endpoint ----------------------------------------------------------------


async def test_plain_openenv_frames_exactly_as_the_reference() -> None:
    with anyio.fail_after(LIMIT):
        async with ws_server() as (server, url), RawWebSocket.connect(url) as ws:
            assert ws.subprotocol is None
            await ws.send_text('{"type": "reset", "data": {"seed": 42, "episode_id": "ep-1"}}')
            assert await ws.receive() == (
                '{"type":"observation","data":{"observation":{"echoed_message":"","metadata":{}},"reward":0.0,"done":false}}'
            )
            await ws.send_text('{"type": "step", "data": {"message": "hello"}}')
            assert await ws.receive() == (
                '{"type":"observation","data":{"observation":{"echoed_message":"hello","metadata":{}},"reward":5.0,'
                '"done":false}}'
            )
            await ws.send_text('{"type": "state"}')
            assert await ws.receive() == '{"type":"state","data":{"episode_id":"ep-1","step_count":1}}'
            await ws.send_text('{"type": "close"}')
            closed = await ws.expect_close()
            assert closed.code == 1000
            await wait_until(lambda: registry_of(server).active == 0)
            assert len(WireEchoEnv.closed) == 1


@pytest.mark.parametrize(
    ("offered", "selected"),
    [
        (["chat", "openenv.v1.json"], "openenv.v1.json"),
        (["openenv.v1.json", "openenv.v1.msgpack"], "openenv.v1.json"),
        (["openenv.v1.msgpack", "openenv.v1.json"], "openenv.v1.msgpack"),
        (["chat"], None),
    ],
)
async def test_subprotocol_selection(offered: list[str], selected: str | None) -> None:
    with anyio.fail_after(LIMIT):
        async with ws_server() as (_, url), RawWebSocket.connect(url, subprotocols=offered) as ws:
            assert ws.subprotocol == selected
            if selected == "openenv.v1.msgpack":
                await ws.send_bytes(msgspec.msgpack.encode({"type": "reset", "id": 7, "data": {"episode_id": "e"}}))
                reply = msgspec.msgpack.decode(await ws.receive_bytes())
                assert reply == {
                    "type": "observation",
                    "id": 7,
                    "data": {"observation": {"echoed_message": "", "metadata": {}}, "reward": 0.0, "done": False},
                }
                await ws.send_bytes(msgspec.msgpack.encode({"type": "state", "id": 8}))
                assert msgspec.msgpack.decode(await ws.receive_bytes())["id"] == 8
            elif selected == "openenv.v1.json":
                reply = await ws.request('{"type":"step","id":41,"data":{"message":"hi"}}')
                assert reply["id"] == 41
                assert reply["data"]["observation"] == {"echoed_message": "hi", "metadata": {}}
                reply = await ws.request('{"type":"bogus","id":42}')
                assert (reply["id"], reply["data"]["code"]) == (42, "UNKNOWN_TYPE")
            else:
                reply = await ws.request('{"type":"state"}')
                assert "id" not in reply
            await ws.close()


async def test_per_message_errors_keep_the_session() -> None:
    with anyio.fail_after(LIMIT):
        async with ws_server() as (_, url), RawWebSocket.connect(url) as ws:
            await ws.request('{"type":"reset","data":{"episode_id":"ep"}}')
            reply = await ws.request("not json")
            assert reply["type"] == "error"
            assert reply["data"]["code"] == "INVALID_JSON"
            assert reply["data"]["message"].startswith("Invalid JSON")
            reply = await ws.request('{"type": "bogus"}')
            assert reply == {
                "type": "error",
                "data": {"message": "Unknown message type: bogus", "code": "UNKNOWN_TYPE"},
            }
            reply = await ws.request('{"type": "step", "data": {"messag": "typo"}}')
            assert reply["data"]["code"] == "VALIDATION_ERROR"
            assert reply["data"]["message"] == "Invalid message"
            assert reply["data"]["errors"]
            reply = await ws.request('{"type": "step", "data": {"message": "raise"}}')
            assert reply["data"]["code"] == "EXECUTION_ERROR"
            assert "step raised on request" in reply["data"]["message"]
            # Still the same session: the episode id survived every error.
            reply = await ws.request('{"type": "state"}')
            assert reply == {"type": "state", "data": {"episode_id": "ep", "step_count": 0}}
            await ws.close()


async def test_a_frame_of_the_wrong_kind_gets_invalid_json() -> None:
    with anyio.fail_after(LIMIT):
        async with ws_server() as (_, url):
            async with RawWebSocket.connect(url) as ws:
                await ws.send_bytes(b'{"type": "state"}')
                reply = await ws.receive_json()
                assert reply["data"]["code"] == "INVALID_JSON"
                assert "binary" in reply["data"]["message"]
                assert (await ws.request('{"type": "state"}'))["type"] == "state"
                await ws.close()
            async with RawWebSocket.connect(url, subprotocols=["openenv.v1.json"]) as ws:
                await ws.send_bytes(b'{"type": "state", "id": 3}')
                reply = await ws.receive_json()
                assert (reply["id"], reply["data"]["code"]) == (3, "INVALID_JSON")
                await ws.close()
            async with RawWebSocket.connect(url, subprotocols=["openenv.v1.msgpack"]) as ws:
                await ws.send_text('{"type": "state", "id": 4}')
                reply = msgspec.msgpack.decode(await ws.receive_bytes())
                assert (reply["id"], reply["data"]["code"]) == (4, "INVALID_JSON")
                await ws.send_bytes(msgspec.msgpack.encode({"type": "state", "id": 5}))
                assert msgspec.msgpack.decode(await ws.receive_bytes())["type"] == "state"
                await ws.close()


async def test_capacity_reached_then_released() -> None:
    with anyio.fail_after(LIMIT):
        async with ws_server(max_sessions=1) as (server, url):
            async with RawWebSocket.connect(url) as first:
                await first.request('{"type":"reset"}')
                assert registry_of(server).active == 1
                async with RawWebSocket.connect(url) as second:
                    # Accepted, then told at once, without asking: as the reference does.
                    assert await second.receive_json() == {
                        "type": "error",
                        "data": {
                            "message": "Server at capacity: 1/1 sessions active. Cannot accept new connections.",
                            "code": "CAPACITY_REACHED",
                            "active_sessions": 1,
                            "max_sessions": 1,
                        },
                    }
                    assert (await second.expect_close()).code == 1000
                # The first session is unharmed.
                assert (await first.request('{"type":"state"}'))["type"] == "state"
            # The first client vanished without a close request: its slot comes back.
            await wait_until(lambda: registry_of(server).active == 0)
            async with RawWebSocket.connect(url) as third:
                assert (await third.request('{"type":"reset"}'))["type"] == "observation"
                await third.close()


@pytest.mark.parametrize("scheme", ["ws", "http+poll"])
async def test_a_session_ended_by_its_client_frees_its_slot_before_its_environment_closes(scheme: str) -> None:
    # The client may open its next session as soon as it has closed one, while
    # the server is still closing the old environment (a plain close, on the
    # session's thread, held here until the new session is in).
    with anyio.fail_after(LIMIT):
        async with ws_server(SlowCloseEnv, max_sessions=1) as (server, _):
            url = server.url.replace("http://", f"{scheme}://")
            try:
                async with openenv.EnvClient(url) as first:
                    await first.reset()
                await anyio.to_thread.run_sync(SlowCloseEnv.closing.wait, LIMIT)
                async with openenv.EnvClient(url) as second:
                    await second.reset()
                    SlowCloseEnv.may_close.set()
            finally:
                SlowCloseEnv.may_close.set()
            await registry_of(server).wait_empty()


async def test_factory_error_is_fatal_and_releases_the_slot() -> None:
    with anyio.fail_after(LIMIT):
        async with ws_server(broken_factory, max_sessions=1) as (server, url):
            async with RawWebSocket.connect(url) as ws:
                reply = await ws.receive_json()
                assert reply["data"]["code"] == "FACTORY_ERROR"
                assert reply["data"]["factory_name"].endswith("broken_factory")
                assert "no GPU left" in reply["data"]["message"]
                assert (await ws.expect_close()).code == 1000
            await wait_until(lambda: registry_of(server).active == 0)


@pytest.mark.parametrize("factory", [WireEchoEnv, SlowSyncEnv])
async def test_disconnect_mid_step_closes_the_env_and_frees_the_slot(factory: Any) -> None:
    closed: list[Any] = factory.closed
    with anyio.fail_after(LIMIT):
        async with ws_server(factory, max_sessions=1) as (server, url):
            async with RawWebSocket.connect(url) as ws:
                await ws.send_text('{"type":"step","data":{"message":"slow","delay":0.5}}')
                await wait_until(factory.stepping.is_set)
                assert registry_of(server).active == 1
            # The socket is gone mid-step, without a closing handshake.
            await wait_until(lambda: registry_of(server).active == 0 and len(closed) == 1)
            async with RawWebSocket.connect(url) as ws:
                assert (await ws.request('{"type":"state"}'))["type"] == "state"
                await ws.close()


async def test_a_connected_session_is_never_reaped_as_idle() -> None:
    """Its client is there (OpenEnv's reconnects without a word: it would get a fresh, never-reset session)."""
    clock = ManualClock()
    with anyio.fail_after(LIMIT):
        async with serve(create_app(WireEchoEnv, clock=clock)) as server, RawWebSocket.connect(server.ws_url) as ws:
            await ws.request('{"type":"reset","data":{"episode_id":"kept"}}')
            await clock.advance_when_blocked(3600.0)  # the reaper looks, and leaves a connected session be
            assert registry_of(server).active == 1
            assert (await ws.request('{"type":"state"}'))["data"]["episode_id"] == "kept"
            await ws.close()


async def test_a_session_the_server_ends_is_closed_with_its_reason() -> None:
    with anyio.fail_after(LIMIT):
        async with ws_server() as (server, url), RawWebSocket.connect(url) as ws:
            await ws.request('{"type":"reset"}')
            [lease] = registry_of(server).leases()
            lease.request_close(IDLE_TIMEOUT_REASON)
            closed = await ws.expect_close()
            assert (closed.code, closed.reason) == (1001, IDLE_TIMEOUT_REASON)
            await wait_until(lambda: registry_of(server).active == 0)
            assert len(WireEchoEnv.closed) == 1


async def test_a_long_step_is_not_idleness() -> None:
    clock = ManualClock()
    with anyio.fail_after(LIMIT):
        async with (
            serve(create_app(WireEchoEnv, clock=clock)) as server,
            RawWebSocket.connect(server.ws_url) as ws,
            anyio.create_task_group() as task_group,
        ):
            # An hour passes while the step runs: the reaper looks, and leaves a busy session be.
            task_group.start_soon(clock.advance_when_blocked, 3600.0)
            reply = await ws.request('{"type":"step","data":{"message":"slow","delay":0.6}}')
            assert reply["data"]["observation"] == {"echoed_message": "slow", "metadata": {}}
            assert registry_of(server).leases()[0].close_reason is None
            await ws.close()


async def test_many_sessions_at_once() -> None:
    async def session(url: str, index: int) -> None:
        async with RawWebSocket.connect(url, subprotocols=["openenv.v1.json"]) as ws:
            await ws.request(f'{{"type":"reset","id":1,"data":{{"episode_id":"ep-{index}"}}}}')
            for step in range(20):
                reply = await ws.request(f'{{"type":"step","id":{step + 2},"data":{{"message":"m{index}"}}}}')
                assert reply["id"] == step + 2
                assert reply["data"]["observation"]["echoed_message"] == f"m{index}"
            state = await ws.request('{"type":"state","id":99}')
            assert state["data"] == {"episode_id": f"ep-{index}", "step_count": 20}
            await ws.close()

    with anyio.fail_after(LIMIT):
        async with ws_server() as (server, url):
            async with anyio.create_task_group() as task_group:
                for index in range(8):
                    task_group.start_soon(session, url, index)
            await wait_until(lambda: registry_of(server).active == 0)
    assert len(WireEchoEnv.closed) == 8


async def test_pipelined_requests_are_answered_in_order() -> None:
    # Many requests in flight: the server stops reading while they queue, and resumes.
    count = 300
    with anyio.fail_after(LIMIT):
        async with ws_server() as (_, url), RawWebSocket.connect(url, subprotocols=["openenv.v1.json"]) as ws:
            for index in range(count):
                await ws.send_text(f'{{"type":"step","id":{index},"data":{{"message":"{"x" * 1000}"}}}}')
            for index in range(count):
                reply = await ws.receive_json()
                assert reply["id"] == index
                assert reply["data"]["observation"]["echoed_message"] == "x" * 1000
            await ws.close()


async def test_openenv_serve_is_the_runner() -> None:
    with anyio.fail_after(LIMIT):
        async with openenv.serve(EchoEnvironment, port=0) as server:
            assert server.url == f"http://127.0.0.1:{server.port}"
            async with RawWebSocket.connect(server.ws_url) as ws:
                reply = await ws.request('{"type":"step","data":{"tool_name":"echo_message","arguments":{}}}')
                assert reply["type"] == "observation"
                await ws.close()


@pytest.mark.anyio
async def test_serving_a_client_class_fails_before_anything_is_served() -> None:
    from openenv.examples.echo import CallToolAction, EchoEnv

    for not_an_environment, says in ((EchoEnv, "is a client class"), (CallToolAction, "is a message class")):
        with pytest.raises(TypeError, match=says):
            async with openenv.serve(not_an_environment):
                pass


@pytest.mark.parametrize("scheme", ["ws", "http+poll"])
async def test_an_app_is_served_again_once_a_server_that_ran_it_has_stopped(scheme: str) -> None:
    """As a notebook serves a module's ``app`` twice: the first server's stop does not close the second's doors."""
    app = create_app(EchoEnvironment)
    with anyio.fail_after(30):
        for _ in range(2):
            async with openenv.serve(app) as server, EchoEnv(f"{scheme}://{server.host}:{server.port}") as env:
                await env.reset()
                result = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "again"}))
                assert result.observation.echoed_message == "again"
