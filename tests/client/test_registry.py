"""Choosing the transport by URL scheme, through the entry-point group."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import anyio
import pytest

import openenv
from openenv import EnvClient, create_transport, register_transport, registered_schemes
from tests.envs import AsyncCounterEnv
from tests.helpers import ManualClock
from transports.inprocess import InProcessTransport


def test_builtin_transports_join_the_entry_point_group() -> None:
    names = {ep.name for ep in entry_points(group=openenv.ENTRY_POINT_GROUP)}
    assert "inproc" in names
    assert "inproc" in registered_schemes()


def test_scheme_picks_the_transport() -> None:
    transport = create_transport("inproc://tests.envs:AsyncCounterEnv")
    assert isinstance(transport, InProcessTransport)
    assert isinstance(create_transport("INPROC://tests.envs:AsyncCounterEnv"), InProcessTransport)


@pytest.mark.parametrize("url", ["gopher://host", "nourl", "://x"])
def test_unknown_scheme_names_the_registered_ones(url: str) -> None:
    with pytest.raises(openenv.UnsupportedSchemeError, match="inproc") as info:
        create_transport(url)
    assert isinstance(info.value, ValueError)


@pytest.mark.anyio
async def test_unknown_scheme_fails_on_connect() -> None:
    with pytest.raises(openenv.UnsupportedSchemeError, match="gopher"):
        async with EnvClient("gopher://host"):
            pass


@pytest.mark.anyio
async def test_registered_at_run_time() -> None:
    made: list[str] = []

    def factory(url: str, **options: Any) -> InProcessTransport:
        made.append(url)
        return InProcessTransport(factory=AsyncCounterEnv, **options)

    register_transport("test-mem", factory)
    assert "test-mem" in registered_schemes()
    with anyio.fail_after(5):
        async with EnvClient("test-mem://anything", close_timeout=1.0) as env:
            result = await env.step({"by": 4})
    assert result.observation["count"] == 4
    assert made == ["test-mem://anything"]


class ClockedTransport(InProcessTransport):
    """An in-process transport that takes a clock, as the network transports do."""

    def __init__(self, url: str, *, clock: openenv.Clock = openenv.EVENT_LOOP_CLOCK) -> None:
        super().__init__(factory=AsyncCounterEnv)
        self.clock = clock


@pytest.mark.anyio
async def test_the_clients_clock_goes_to_a_transport_that_takes_one() -> None:
    register_transport("test-clocked", ClockedTransport)
    clock = ManualClock()
    with anyio.fail_after(5):
        async with EnvClient("test-clocked://x", clock=clock) as env:
            assert isinstance(env.transport, ClockedTransport)
            assert env.transport.clock is clock
        async with EnvClient("test-clocked://x") as env:
            assert isinstance(env.transport, ClockedTransport)
            assert env.transport.clock is openenv.EVENT_LOOP_CLOCK
        async with EnvClient("inproc://tests.envs:AsyncCounterEnv", clock=clock) as env:
            assert (await env.step({"by": 1})).observation["count"] == 1  # takes none: none given
