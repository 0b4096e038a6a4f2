"""``GET /metrics``: what a server counts, scraped for real from uvicorn and from the trio server."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import openenv
from openenv.server import ServerSession
from tests.envs import AsyncMessageEchoEnv, MessageAction, MessageEchoEnv, MessageObservation
from transports.admission._sessions import SessionRegistry
from transports.server._metrics import ServerMetrics
from transports.server.app import create_app
from transports.server.runner import serve

pytestmark = pytest.mark.anyio

LIMIT = 60  # seconds: the bound of every test's waits


class MessageEnv(openenv.EnvClient[MessageAction, MessageObservation, openenv.State]):
    pass


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and labels (``env`` left out: one environment per server here)."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((key, value) for key, value in sample.labels.items() if key != "env"))
            samples[(sample.name, labels)] = sample.value
    return samples


async def _scrape(url: str, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.get(f"{url}/metrics", headers=headers)


@pytest.mark.parametrize("factory", [AsyncMessageEchoEnv, MessageEchoEnv], ids=["async-env", "sync-env"])
async def test_a_scrape_counts_every_transport(factory: Any) -> None:
    """uvicorn on asyncio, hypercorn+websockets on trio; plain envs' steps are answered on their threads."""
    app = create_app(factory, metrics=True, max_sessions=2)
    with anyio.fail_after(LIMIT):
        async with serve(app) as server:
            async with MessageEnv(server.url) as ws, MessageEnv(server.url.replace("http", "http+poll", 1)) as poll:
                for client in (ws, poll):
                    await client.reset()
                    await client.step(MessageAction(message="hello"))
                    await client.step(MessageAction(message="again"))
                    with pytest.raises(openenv.ValidationError):
                        await client.step({"message": 1})
                # Both slots taken: a third session is refused, and counted.
                with pytest.raises(openenv.CapacityReachedError):
                    async with MessageEnv(server.url) as third:
                        await third.reset()
                during = _samples((await _scrape(server.url)).text)
            async with httpx.AsyncClient() as http:  # OpenEnv's stateless route counts as a session's request
                assert (await http.post(f"{server.url}/step", json={"action": {"message": "hi"}})).status_code == 200
            response = await _scrape(server.url)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    after = _samples(response.text)
    assert during[("openenv_sessions_open", ())] == 2
    assert after[("openenv_sessions_open", ())] == 0
    assert after[("openenv_sessions_queued", ())] == 0
    assert after[("openenv_sessions_opened_total", (("transport", "websocket"),))] == 1
    assert after[("openenv_sessions_opened_total", (("transport", "http"),))] == 1
    assert after[("openenv_sessions_opened_total", (("transport", "http-stateless"),))] == 1
    assert after[("openenv_sessions_refused_total", (("transport", "websocket"),))] == 1
    assert after[("openenv_steps_total", ())] == 5  # 2 per session and the stateless one; invalid ones are errors
    assert after[("openenv_resets_total", ())] == 2
    assert after[("openenv_step_duration_seconds_count", ())] == 5
    assert after[("openenv_step_duration_seconds_bucket", (("le", "+Inf"),))] == 5
    assert 0 < after[("openenv_step_duration_seconds_sum", ())] < LIMIT
    assert after[("openenv_reset_duration_seconds_count", ())] == 2
    assert after[("openenv_errors_total", (("code", "VALIDATION_ERROR"),))] == 2
    assert after[("openenv_received_bytes_total", ())] > 0
    assert after[("openenv_sent_bytes_total", ())] > after[("openenv_received_bytes_total", ())]


async def test_metrics_are_behind_the_token_and_off_by_default() -> None:
    with anyio.fail_after(LIMIT):
        async with serve(create_app(MessageEchoEnv, metrics=True, auth_token="s3cret")) as server:
            assert (await _scrape(server.url)).status_code == 401
            scraped = await _scrape(server.url, Authorization="Bearer s3cret")
            assert scraped.status_code == 200
            assert "openenv_steps_total" in scraped.text
        async with serve(MessageEchoEnv) as server:
            assert (await _scrape(server.url)).status_code == 404


async def test_openmetrics_is_served_to_who_asks_for_it() -> None:
    with anyio.fail_after(LIMIT):
        async with serve(create_app(MessageEchoEnv, metrics=True)) as server:
            response = await _scrape(server.url, Accept="application/openmetrics-text; version=1.0.0")
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")


async def test_errors_are_counted_by_code_and_bytes_per_frame() -> None:
    metrics = ServerMetrics()
    session = ServerSession(AsyncMessageEchoEnv(), metrics=metrics, name="echo")
    frames = [b"not json", b'{"type": "bogus"}', b'{"type": "step", "data": {"message": "x"}}']
    replies = [await session.handle(frame) for frame in frames]
    await session.aclose()
    samples = _samples(generate_latest(metrics.registry).decode())
    assert samples[("openenv_errors_total", (("code", "INVALID_JSON"),))] == 1
    assert samples[("openenv_errors_total", (("code", "UNKNOWN_TYPE"),))] == 1
    assert samples[("openenv_steps_total", ())] == 1
    assert samples[("openenv_received_bytes_total", ())] == sum(map(len, frames))
    assert samples[("openenv_sent_bytes_total", ())] == sum(len(reply or b"") for reply in replies)


def test_the_histogram_puts_each_time_in_its_bucket() -> None:
    metrics = ServerMetrics(buckets=[0.001, 0.01])
    for seconds in (0.0005, 0.001, 0.005, 0.5):  # a bound is inclusive, as Prometheus' le
        metrics.step_done("env", seconds)
    samples = _samples(generate_latest(metrics.registry).decode())
    buckets = {
        dict(labels)["le"]: value
        for (name, labels), value in samples.items()
        if name == "openenv_step_duration_seconds_bucket"
    }
    assert {le: buckets[le] for le in ("0.001", "0.01", "+Inf")} == {"0.001": 2, "0.01": 3, "+Inf": 4}
    assert samples[("openenv_step_duration_seconds_sum", ())] == pytest.approx(0.5065)
    with pytest.raises(ValueError, match="increasing"):
        ServerMetrics(buckets=[0.1, 0.01])


def test_a_registry_counts_what_it_admits_and_refuses() -> None:
    registry = SessionRegistry(max_sessions=1)
    lease = registry.open(transport="websocket")
    assert lease is not None
    assert registry.open(transport="http") is None
    lease.release()
    assert (registry.opened, registry.refused) == ({"websocket": 1}, {"http": 1})
