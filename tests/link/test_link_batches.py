"""A pool's steps over a link as one entry each way (``steps`` and ``stepped``), against real servers.

Each test runs an `EnvPool` whose sessions share one link to a real server
(uvicorn on asyncio, hypercorn+websockets on trio) and checks that the batch
keeps every promise a session's own frames keep: each step runs once, in
order with the session's other requests; one session's bad action or failing
environment reaches no other; a step cut by a timeout has its late reply
dropped; a dropped connection loses no step and runs none twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, ClassVar

import anyio
import msgspec
import pytest

import openenv
from openenv import EnvPool
from openenv.examples.echo import CallToolAction, EchoEnv
from tests.envs import AsyncCounterEnv, CountAction, CountObservation, SyncCounterEnv
from tests.helpers import CounterClient, ManualClock, proxied, wait_until
from tests.server.test_server_app import RawWebSocket
from transports.link import _host as _link_host
from transports.link._envelope import EnvelopeCodec, Open, Resume, Steps
from transports.link._state import ServerLinkState
from transports.server.app import create_app
from transports.server.runner import RunningServer, ServerName, current_backend, serve

pytestmark = pytest.mark.anyio

LIMIT = 30  # seconds: the bound of every test's waits


@pytest.fixture(params=[("asyncio", "uvicorn"), ("trio", "hypercorn+websockets")], ids=["asyncio-uvicorn", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param[0]
    return backend


@pytest.fixture(autouse=True)
def no_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host trusts async steps not to wait from the first: batches run at once from the first step."""
    monkeypatch.setattr(_link_host, "TRIAL_CALLS", 0)


@asynccontextmanager
async def serving(factory: Any = AsyncCounterEnv, **options: Any) -> AsyncIterator[RunningServer]:
    name: ServerName = "uvicorn" if current_backend() == "asyncio" else "hypercorn+websockets"
    async with serve(factory, server=name, **options) as server:
        yield server


class Batches:
    """What the server answered in ``stepped`` entries: one list of channels per entry."""

    def __init__(self) -> None:
        self.stepped: list[list[int]] = []

    @property
    def steps(self) -> int:
        return sum(len(channels) for channels in self.stepped)


@contextmanager
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Batches]:
    batches = Batches()
    post = ServerLinkState.post_stepped

    def post_stepped(self: ServerLinkState, items: list[Any], replies: msgspec.Raw) -> None:
        batches.stepped.append([item[0] for item in items])
        post(self, items, replies)

    monkeypatch.setattr(ServerLinkState, "post_stepped", post_stepped)
    yield batches


class GatedEnv(AsyncCounterEnv):
    """A counter that counts the steps it runs; a step asked to (``delay``) waits at a gate shared by all."""

    gate: ClassVar[anyio.Event | None] = None
    entered: ClassVar[anyio.Event | None] = None
    built: ClassVar[list[GatedEnv]] = []

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0
        GatedEnv.built.append(self)

    async def step(self, action: CountAction) -> CountObservation:
        self.steps += 1
        if action.delay:
            entered, gate = gates()
            entered.set()
            with anyio.fail_after(LIMIT):
                await gate.wait()
        return await super().step(CountAction(by=action.by, fail=action.fail))


def gates() -> tuple[anyio.Event, anyio.Event]:
    """The events of `GatedEnv`'s gate: set when a step waits there, and set to let it through."""
    entered, gate = GatedEnv.entered, GatedEnv.gate
    assert entered is not None
    assert gate is not None
    return entered, gate


@pytest.fixture
def gated() -> Iterator[type[GatedEnv]]:
    GatedEnv.gate, GatedEnv.entered, GatedEnv.built = anyio.Event(), anyio.Event(), []
    yield GatedEnv
    GatedEnv.gate.set()


async def test_a_pools_steps_go_as_one_entry_and_come_back_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    with anyio.fail_after(LIMIT), counted(monkeypatch) as batches:
        async with serving() as server, EnvPool(server.url, size=5, client=CounterClient) as pool:
            await pool.reset(start=[0, 10, 20, 30, 40])
            for step in range(1, 4):
                results = await pool.step([CountAction(by=n + 1) for n in range(5)])
                assert [result.observation.count for result in results] == [10 * n + step * (n + 1) for n in range(5)]
                assert [result.reward for result in results] == [float(n + 1) for n in range(5)]
            assert [sorted(channels) for channels in batches.stepped] == [[1, 2, 3, 4, 5]] * 3
            # Each session's own requests go on, numbered after the batch's steps.
            assert [(await client.state()).count for client in pool.clients] == [3, 16, 29, 42, 55]


async def test_a_batch_larger_than_a_part_leaves_in_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openenv._pool_steps, "LINK_BATCH", 2)
    with anyio.fail_after(LIMIT), counted(monkeypatch) as batches:
        async with serving() as server, EnvPool(server.url, size=5, client=CounterClient) as pool:
            await pool.reset()
            results = await pool.step([CountAction(by=n) for n in range(5)])
            assert [result.observation.count for result in results] == [0, 1, 2, 3, 4]
            assert batches.steps == 5
            assert all(len(channels) <= 2 for channels in batches.stepped)


async def test_a_failing_environment_and_a_bad_action_reach_no_other_session(monkeypatch: pytest.MonkeyPatch) -> None:
    with anyio.fail_after(LIMIT), counted(monkeypatch) as batches:
        async with serving() as server, EnvPool(server.url, size=3, client=CounterClient) as pool:
            await pool.reset()
            with pytest.raises(openenv.EnvPoolError) as info:
                await pool.step([CountAction(by=1), CountAction(fail=True), CountAction(by=3)])
            assert batches.steps == 3  # the failure is answered in the batch
            assert list(info.value.errors) == [1]
            assert isinstance(info.value.errors[1], openenv.ExecutionError)
            assert [(await client.state()).count for client in pool.clients] == [1, 0, 3]
            # An action that fits only once converted ("2" for an int) sends the batch's steps on their own.
            actions: list[Any] = [{"by": "2"}, CountAction(by=1), CountAction(by=1)]
            results = await pool.step(actions)
            assert [result.observation.count for result in results] == [3, 1, 4]
            assert batches.steps == 3
            results = await pool.step([CountAction(by=1)] * 3)
            assert [result.observation.count for result in results] == [4, 2, 5]
            assert batches.steps == 6


async def test_a_plain_environments_batch_runs_on_its_sessions_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    with anyio.fail_after(LIMIT), counted(monkeypatch) as batches:
        async with serving(SyncCounterEnv) as server, EnvPool(server.url, size=3, client=CounterClient) as pool:
            await pool.reset()
            for step in range(1, 3):
                results = await pool.step([CountAction(by=1)] * 3)
                assert [result.observation.count for result in results] == [step] * 3
            assert batches.steps == 0  # each step went as the frame it stands for


async def test_a_step_that_waits_after_all_finishes_and_the_batch_is_answered(
    monkeypatch: pytest.MonkeyPatch, gated: type[GatedEnv]
) -> None:
    with anyio.fail_after(LIMIT), counted(monkeypatch) as batches:
        async with serving(gated) as server, EnvPool(server.url, size=4, client=CounterClient) as pool:
            await pool.reset()
            entered, gate = gates()
            async with anyio.create_task_group() as task_group:

                async def open_the_gate() -> None:
                    await entered.wait()
                    gate.set()

                task_group.start_soon(open_the_gate)
                results = await pool.step(
                    [CountAction(by=1), CountAction(by=2, delay=1), CountAction(by=3), CountAction()]
                )
            assert [result.observation.count for result in results] == [1, 2, 3, 1]
            assert len(batches.stepped[0]) == 1  # answered before the step that waited was finished
            results = await pool.step([CountAction(by=1)] * 4)  # the host runs every step in a task now
            assert [result.observation.count for result in results] == [2, 3, 4, 2]
            assert [env.steps for env in gated.built] == [2, 2, 2, 2]


async def test_a_step_given_up_in_a_batch_ends_only_its_session(gated: type[GatedEnv]) -> None:
    clock = ManualClock()  # the server's: only the step the test lets run long passes the step timeout
    app = create_app(gated, step_timeout=30.0, clock=clock)
    with anyio.fail_after(LIMIT):
        async with serving(app) as server, EnvPool(server.url, size=3, client=CounterClient) as pool:
            await pool.reset()

            async def run_past_the_step_timeout() -> None:
                await gates()[0].wait()
                await clock.advance_when_blocked(31.0)

            async with anyio.create_task_group() as task_group:
                task_group.start_soon(run_past_the_step_timeout)
                with pytest.raises(openenv.EnvPoolError) as info:
                    await pool.step([CountAction(by=1), CountAction(by=1, delay=1), CountAction(by=2)])
            assert list(info.value.errors) == [1]
            assert "step timeout" in str(info.value.errors[1])
            assert (await pool.clients[0].step(CountAction(by=1))).observation.count == 2
            assert (await pool.clients[2].step(CountAction(by=1))).observation.count == 3


async def test_a_late_reply_of_a_batch_cut_by_its_timeout_is_dropped(gated: type[GatedEnv]) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(gated) as server, EnvPool(server.url, size=3, client=CounterClient) as pool:
            await pool.reset()
            entered, gate = gates()
            with pytest.raises(openenv.EnvPoolError) as info:
                await pool.step([CountAction(by=1, delay=1), CountAction(by=1), CountAction(by=1)], timeout=0)
            assert all(isinstance(error, TimeoutError) for error in info.value.errors.values())
            await entered.wait()
            gate.set()
            results = await pool.step([CountAction(by=10)] * 3)
            # The late replies (1, 1, 1) are dropped: each session's own reply is its second step's.
            assert [result.observation.count for result in results] == [11, 11, 11]
            assert [env.steps for env in gated.built] == [2, 2, 2]


@pytest.mark.parametrize("replies_while_away", [True, False], ids=["replayed", "after-resuming"])
async def test_a_batch_in_flight_when_the_connection_drops_runs_once_and_is_answered(
    gated: type[GatedEnv], replies_while_away: bool
) -> None:
    async def holds_replies() -> bool:
        (link,) = server.app.state.websocket._links.values()
        return any(channel.unacked for channel in link._host.state.channels.values())

    with anyio.fail_after(LIMIT):
        async with serving(gated) as server, proxied(server) as proxy:
            server.app.state.websocket.resume_timeout = LIMIT
            url = f"ws://127.0.0.1:{proxy.port}"
            async with EnvPool(url, size=3, client=CounterClient) as pool:
                await pool.reset()
                entered, gate = gates()
                results: list[Any] = []

                async def step() -> None:
                    results.extend(await pool.step([CountAction(by=1, delay=1), CountAction(by=2), CountAction(by=3)]))

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(step)
                    await entered.wait()  # the server runs the batch
                    if replies_while_away:
                        proxy.hold()
                    proxy.cut()
                    gate.set()
                    if replies_while_away:
                        await wait_until(holds_replies, "the batch's replies are kept")
                        proxy.release()
                assert [result.observation.count for result in results] == [1, 2, 3]
                assert [env.steps for env in gated.built] == [1, 1, 1]
                results = await pool.step([CountAction(by=1)] * 3)
                assert [result.observation.count for result in results] == [2, 3, 4]
                assert pool.clients[0].transport.resumes == 1  # type: ignore[union-attr]


async def test_a_batch_lost_with_the_connection_is_sent_again_as_frames(gated: type[GatedEnv]) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(gated) as server, proxied(server) as proxy:
            server.app.state.websocket.resume_timeout = LIMIT
            async with EnvPool(f"ws://127.0.0.1:{proxy.port}", size=3, client=CounterClient) as pool:
                await pool.reset()
                proxy.silence()  # the batch goes into the void

                async def cut_once_lost() -> None:
                    await proxy.dropped.wait()
                    proxy.cut()

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(cut_once_lost)
                    results = await pool.step([CountAction(by=n) for n in (1, 2, 3)])
                assert [result.observation.count for result in results] == [1, 2, 3]
                assert [env.steps for env in gated.built] == [1, 1, 1]


async def test_a_batch_too_large_for_either_side_goes_as_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    with anyio.fail_after(LIMIT), counted(monkeypatch) as batches:
        async with serving(max_message_size=400) as server:  # a step's frame fits; three steps' entry does not
            async with EnvPool(server.url, size=3, client=CounterClient) as pool:
                await pool.reset()
                results = await pool.step([CountAction(by=1)] * 3)
                assert [result.observation.count for result in results] == [1, 1, 1]
            assert batches.steps == 0
            async with EnvPool(server.url, size=3, client=CounterClient, max_message_size=300) as pool:
                await pool.reset()
                steps = [CountAction(by=1)] * 3
                for count in (1, 2):  # the client takes no message of three replies: each comes as a frame of its own
                    assert [result.observation.count for result in await pool.step(steps)] == [count] * 3
            assert batches.steps == 0


def _steps(channels: list[tuple[int, int, int, int]], actions: bytes) -> str:
    codec = EnvelopeCodec("json")
    return codec.encode([(0, 0, 0, codec.control(Steps(channels=channels, actions=msgspec.Raw(actions))))]).decode()


async def test_a_steps_entry_that_breaks_the_protocol_ends_only_its_link() -> None:
    codec = EnvelopeCodec("json")
    opening = codec.encode([(n, 0, 0, codec.control(Open())) for n in (1, 2)]).decode()
    bad = [
        _steps([(1, 1, 0, 1), (2, 1, 0, 1)], b'[{"by": 1}]'),  # two steps, one action
        _steps([(1, 1, 0, 1)], b'{"by": 1}'),  # no array
        _steps([(1, 0, 0, 1)], b'[{"by": 1}]'),  # numbered 0
        _steps([(1, 2, 0, 1)], b'[{"by": 1}]'),  # a number skipped
        _steps([(3, 1, 0, 1)], b'[{"by": 1}]'),  # a channel never opened
    ]
    with anyio.fail_after(LIMIT):
        async with serving() as server, CounterClient(server.url) as bystander:
            await bystander.reset()
            for message in bad:
                async with RawWebSocket.connect(server.ws_url, ["openenv.v2.json"]) as ws:
                    hello = codec.decode_control(codec.decode(await received(ws))[0][3])
                    assert getattr(hello, "batches", False)
                    await ws.send_text(opening)
                    await ws.send_text(message)
                    assert (await ws.expect_close()).code == 1002
            assert (await bystander.step(CountAction())).observation.count == 1


async def received(ws: RawWebSocket) -> bytes:
    message = await ws.receive()
    assert isinstance(message, str)
    return message.encode()


async def test_a_raw_steps_entry_is_answered_as_documented() -> None:
    codec = EnvelopeCodec("json")
    reset = msgspec.Raw(b'{"type":"reset","id":1,"data":{}}')
    with anyio.fail_after(LIMIT):
        async with serving() as server, RawWebSocket.connect(server.ws_url, ["openenv.v2.json"]) as ws:
            await ws.receive()  # the Hello
            opening = [entry for n in (1, 2) for entry in ((n, 0, 0, codec.control(Open())), (n, 1, 0, reset))]
            await ws.send_text(codec.encode(opening).decode())
            replies = 0
            while replies < 2:  # both sessions admitted and reset
                replies += len(codec.decode(await received(ws)))
            await ws.send_text(_steps([(1, 2, 1, 7), (2, 2, 1, 9)], b'[{"by": 2}, {"by": 5}]'))
            (entry,) = codec.decode(await received(ws))
            assert entry[:3] == (0, 0, 0)
            stepped = msgspec.json.decode(entry[3])
            assert stepped["type"] == "stepped"
            assert stepped["channels"] == [[1, 2, 2, 7], [2, 2, 2, 9]]
            observations = stepped["replies"]["observations"]
            assert [(o["count"], o["reward"], o["done"]) for o in observations] == [(2, 2.0, False), (5, 5.0, False)]


def test_a_reply_that_went_in_a_batch_is_sent_again_as_its_own_frame() -> None:
    """After a resumption, each side sends what the other lacks of a batch as the frames it stands for."""
    codec = EnvelopeCodec("json")
    server = ServerLinkState(codec)
    server.take([(1, 0, 0, codec.control(Open())), (2, 0, 0, codec.control(Open()))])
    (event,) = server.take(codec.decode(_steps([(1, 1, 0, 7), (2, 1, 0, 9)], b'[{"by": 2}, {"by": 5}]').encode()))
    assert [(position, channel, request_id) for position, channel, request_id in event[1].taken] == [  # type: ignore[union-attr]
        (0, 1, 7),
        (1, 2, 9),
    ]

    class Reply:
        def __init__(self, text: bytes) -> None:
            self.text = text

        def frame(self) -> msgspec.Raw:
            return msgspec.Raw(self.text)

    for number in (1, 2):
        server.post_held(server.channels[number], Reply(b'{"type":"observation","id":%d}' % number), number)
    server.outgoing()
    server.resumed(Resume(received=[(1, 1)]))  # the client holds channel 1's reply only
    resent = [(number, seq, bytes(frame)) for number, seq, _, frame in server.outgoing()[1:]]
    assert resent == [(2, 1, b'{"type":"observation","id":2}')]


async def test_a_union_of_action_types_is_batched_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenEnv's tool environments take `CallToolAction | ListToolsAction`: each action is decoded into its member."""
    with anyio.fail_after(LIMIT), counted(monkeypatch) as batches:
        async with (
            serving("openenv.examples.echo:EchoEnvironment") as server,
            EnvPool(server.url, size=3, client=EchoEnv) as pool,
        ):
            await pool.reset()
            words = ["one", "three", "seven"]
            results = await pool.step(
                [CallToolAction(tool_name="echo_message", arguments={"message": w}) for w in words]
            )
            assert [result.observation.echoed_message for result in results] == words  # type: ignore[union-attr]
            assert [result.reward for result in results] == pytest.approx([0.3, 0.5, 0.5])
            assert batches.steps == 3


async def test_an_action_nested_too_deeply_is_refused_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    deep: Any = 1
    for _ in range(200):
        deep = [deep]
    with anyio.fail_after(LIMIT), counted(monkeypatch) as batches:
        async with serving() as server, EnvPool(server.url, size=3, client=CounterClient) as pool:
            await pool.reset()
            with pytest.raises(openenv.EnvPoolError) as info:
                await pool.step([CountAction(by=1), {"by": deep}, CountAction(by=2)])  # type: ignore[list-item]
            assert list(info.value.errors) == [1]
            assert isinstance(info.value.errors[1], openenv.InvalidJSONError)
            assert batches.steps == 0  # the batch went as frames: each got its own answer
            assert [(await client.state()).count for client in pool.clients] == [1, 0, 2]
