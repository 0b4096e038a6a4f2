"""The I/O-free server session: a request frame in, a reply frame out."""

from __future__ import annotations

import json
import threading
from typing import Any

import anyio
import pytest

import openenv
from openenv import ConnectionClosed, Dialect
from openenv._inline import finish
from openenv._session import _dropped_noted
from openenv.server import RequestError, ServerSession, host_session
from tests.envs import AsyncCounterEnv, DictEnv, SyncCounterEnv, failing_factory

pytestmark = pytest.mark.anyio


async def ask(session: ServerSession, message: Any) -> Any:
    frame = message if isinstance(message, bytes) else json.dumps(message).encode()
    with anyio.fail_after(5):
        reply = await session.handle(frame)
    return None if reply is None else json.loads(reply)


@pytest.mark.parametrize("env_class", [AsyncCounterEnv, SyncCounterEnv])
async def test_reset_step_state_close(env_class: type[Any]) -> None:
    session = ServerSession(env_class())
    reply = await ask(session, {"type": "reset", "data": {"episode_id": "ep-1", "start": 2}})
    assert reply["type"] == "observation"
    assert reply["data"]["observation"]["count"] == 2
    reply = await ask(session, {"type": "step", "data": {"by": 3}})
    assert reply["data"] == {"observation": {"count": 5, "note": "", "metadata": {}}, "reward": 3.0, "done": False}
    reply = await ask(session, {"type": "state"})
    assert reply == {"type": "state", "data": {"episode_id": "ep-1", "step_count": 1, "count": 5}}
    assert await ask(session, {"type": "close"}) is None
    assert session.closed


async def test_reset_gets_only_the_keywords_it_accepts(caplog: pytest.LogCaptureFixture) -> None:
    session = ServerSession(AsyncCounterEnv())
    _dropped_noted.clear()
    with caplog.at_level("WARNING", logger="openenv.server"):
        reply = await ask(session, {"type": "reset", "data": {"episode_id": "e", "seed": 1, "junk": True}})
        await ask(session, {"type": "reset", "data": {"sed": 3, "junk": True}})
        await ask(session, {"type": "reset", "data": {"sed": 3}})
    assert reply["type"] == "observation"
    # What was dropped is logged once per keyword (a client's typo would go unseen), with what it takes.
    assert [record.getMessage() for record in caplog.records] == [
        "reset() of tests.envs:AsyncCounterEnv takes no keyword seed=, junk=: dropped, as OpenEnv's server drops it"
        " (it takes episode_id=, start=)",
        "reset() of tests.envs:AsyncCounterEnv takes no keyword sed=: dropped, as OpenEnv's server drops it"
        " (it takes episode_id=, start=)",
    ]
    # An environment that takes **kwargs gets them all.
    session = ServerSession(SyncCounterEnv())
    reply = await ask(session, {"type": "reset", "data": {"seed": 1, "junk": True}})
    assert reply["data"]["observation"]["note"] == "junk,seed"


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (b"not json", "INVALID_JSON"),
        ({"type": "bogus"}, "UNKNOWN_TYPE"),
        ({"type": "step", "data": {"by": "x"}}, "VALIDATION_ERROR"),
        ({"type": "step", "data": {"fail": True}}, "EXECUTION_ERROR"),
    ],
)
@pytest.mark.parametrize("env_class", [AsyncCounterEnv, SyncCounterEnv])
async def test_errors_leave_the_session_alive(env_class: type[Any], message: Any, code: str) -> None:
    session = ServerSession(env_class())
    await ask(session, {"type": "reset"})
    reply = await ask(session, message)
    assert reply["type"] == "error"
    assert reply["data"]["code"] == code
    assert reply["data"]["message"]
    reply = await ask(session, {"type": "step", "data": {"by": 1}})
    assert reply["data"]["observation"]["count"] == 1


async def test_error_replies_carry_the_request_id() -> None:
    session = ServerSession(AsyncCounterEnv(), dialect=Dialect(request_ids=True))
    reply = await ask(session, {"type": "step", "id": 5, "data": {"fail": True}})
    assert reply["id"] == 5
    reply = await ask(session, {"type": "bogus", "id": 6})
    assert reply["id"] == 6


async def test_unencodable_observation_is_an_execution_error() -> None:
    class Weird(DictEnv):
        async def step(self, action: Any) -> dict[str, Any]:
            return {"value": object()}

    session = ServerSession(Weird())
    reply = await ask(session, {"type": "step", "data": {}})
    assert reply["data"]["code"] == "EXECUTION_ERROR"


async def test_sync_environment_runs_off_the_event_loop() -> None:
    session = ServerSession(SyncCounterEnv())
    await ask(session, {"type": "step", "data": {"by": 1}})
    assert SyncCounterEnv.threads
    assert threading.get_ident() not in SyncCounterEnv.threads


async def test_host_session_reports_a_failing_factory() -> None:
    sent: list[bytes] = []

    async def receive() -> bytes:
        raise AssertionError("nothing should be read")

    async def send(frame: bytes) -> None:
        sent.append(frame)

    with anyio.fail_after(5):
        await host_session(failing_factory, receive, send)
    [frame] = sent
    data = json.loads(frame)["data"]
    assert data["code"] == "FACTORY_ERROR"
    assert "no GPU left" in data["message"]
    assert data["factory_name"].endswith("failing_factory")


async def test_host_session_closes_the_env_when_the_client_goes() -> None:
    frames = [json.dumps({"type": "step", "data": {"by": 1}}).encode()]
    sent: list[bytes] = []

    async def receive() -> bytes:
        if frames:
            return frames.pop()
        raise ConnectionClosed("gone")

    async def send(frame: bytes) -> None:
        sent.append(frame)

    with anyio.fail_after(5):
        await host_session(AsyncCounterEnv, receive, send)
    assert len(sent) == 1
    assert len(AsyncCounterEnv.closed) == 1


def test_sessions_of_one_kind_share_a_codec_and_others_get_their_own() -> None:
    """A codec holds nothing of a session, and takes more memory than the rest of one: one per kind."""
    one, two = ServerSession(AsyncCounterEnv()), ServerSession(AsyncCounterEnv())
    assert one.codec is two.codec
    assert ServerSession(AsyncCounterEnv(), dialect=Dialect(request_ids=True)).codec is not one.codec
    assert ServerSession(AsyncCounterEnv(), strict=True).codec is not one.codec
    assert ServerSession(DictEnv()).codec is not one.codec


class _Refusing(openenv.Environment):
    """Refuses every step with a code of its own, the way openenv.core refuses a pydantic action that fails."""

    def reset(self, **kwargs: Any) -> dict[str, Any]:
        return {}

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        raise RequestError("VALIDATION_ERROR", "Invalid message", extra={"errors": [{"loc": ["x"]}]})

    @property
    def state(self) -> dict[str, Any]:
        return {}


class _AsyncRefusing(_Refusing):
    async def step(self, action: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        return super().step(action)


@pytest.mark.parametrize("env_class", [_Refusing, _AsyncRefusing])
async def test_an_environment_refuses_a_request_with_a_code_of_its_own(env_class: type[Any]) -> None:
    session = ServerSession(env_class(), dialect=Dialect(request_ids=True))
    expected = {"code": "VALIDATION_ERROR", "message": "Invalid message", "errors": [{"loc": ["x"]}]}
    step = {"type": "step", "data": {"x": 1}, "id": 7}
    # The general path, the one a step answered at once takes, and the session thread's. A call
    # start_handle left waiting is finished in the scopes it started in: one bound around both.
    with anyio.fail_after(5):
        assert await ask(session, step) == {"type": "error", "data": expected, "id": 7}
        started = session.start_handle(json.dumps(step).encode())
        if not isinstance(started, bytes):
            started = await finish(started)  # type: ignore[arg-type]
        assert json.loads(started) == {"type": "error", "data": expected, "id": 7}
        if session.handles_on_thread:
            answered = await session.run_on_thread(
                lambda: session.handle_on_thread(json.dumps(step).encode()), lambda: None
            )
            assert json.loads(answered) == {"type": "error", "data": expected, "id": 7}
        assert (await ask(session, {"type": "reset", "data": {}, "id": 8}))["type"] == "observation"
