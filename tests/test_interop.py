"""Wire compatibility with the reference, openenv-core 0.3.0 from PyPI, in both directions.

The reference lives in its own throwaway virtual environment (its import name
clashes with ours), built on first use by ``tests/interop/reference_venv.py``,
and runs as a subprocess: (a) our typed client against its server; (b) its own
``GenericEnvClient`` against our server, running the same script.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

import openenv
from openenv import Dialect, EnvClient, State
from tests.envs import MessageAction, MessageEchoEnv, MessageObservation
from tests.interop.reference_venv import ReferenceServer, ensure_reference_python, run_reference_client
from transports.websocket import WebSocketTransport

pytestmark = [pytest.mark.interop, pytest.mark.anyio]

LIMIT = 60


class MessageEnv(EnvClient[MessageAction, MessageObservation, State]):
    pass


@pytest.fixture(scope="session")
def reference_python() -> Path:
    """The reference venv's python: built once (a few minutes), then reused."""
    return ensure_reference_python()


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
            assert (await env.step({"message": "ok"})).observation == {"echoed_message": "ok"}


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


def reference_script(url: str, *args: str, python: Path | None = None) -> list[dict[str, Any]]:
    """Run the reference client's script; its results, one per operation (its ``init`` line left out)."""
    return [result for result in run_reference_client(url, *args, python=python) if result["op"] != "init"]


def expected_script_results(results: list[dict[str, Any]]) -> None:
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
    assert reset["observation"] == {"echoed_message": ""}
    assert (reset["reward"], reset["done"]) == (0.0, False)
    assert hello["observation"] == {"echoed_message": "hello"}
    assert (hello["reward"], hello["done"]) == (5.0, False)
    assert state["state"] == {"episode_id": "ep-1", "step_count": 1}
    assert "VALIDATION_ERROR" in typo["error"]
    assert again["observation"] == {"echoed_message": "again"}
    assert state2["state"] == {"episode_id": "ep-1", "step_count": 2}


def test_the_script_against_the_reference_server_itself(reference_server: ReferenceServer) -> None:
    """The baseline the next test compares against: the reference client on its own server."""
    expected_script_results(reference_script(reference_server.base_url))


@pytest.mark.parametrize("mode", [[], ["--sync"]], ids=["async", "sync"])
async def test_reference_client_against_our_server(reference_python: Path, mode: list[str]) -> None:
    with anyio.fail_after(LIMIT * 2):
        async with openenv.serve(MessageEchoEnv, port=0) as server:
            results = await anyio.to_thread.run_sync(
                lambda: reference_script(server.url, *mode, python=reference_python)
            )
    expected_script_results(results)


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
    assert results[2]["observation"] == {"echoed_message": "after"}


async def test_reference_client_sends_pydantic_actions_to_our_server(reference_python: Path) -> None:
    """A typed OpenEnv client sends its Action whole, ``metadata`` included: our Action has it too."""
    ops = '[{"op": "reset"}, {"op": "step", "action": {"message": "typed"}, "model": true}, {"op": "close"}]'
    with anyio.fail_after(LIMIT * 2):
        async with openenv.serve(MessageEchoEnv, port=0) as server:
            results = await anyio.to_thread.run_sync(
                lambda: reference_script(server.url, "--ops", ops, python=reference_python)
            )
    assert [r["ok"] for r in results] == [True, True, True], results
    assert results[1]["observation"] == {"echoed_message": "typed"}


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
