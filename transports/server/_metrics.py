"""What a server counts for its operators: ``GET /metrics``, in Prometheus' text format.

`ServerMetrics` is the one object the counting goes through. The session
registry counts sessions as it admits and refuses them (every transport passes
through it); `openenv.server.ServerSession` tells it of each request
(`ServerMetrics.step_done`, `ServerMetrics.reset_done`, `ServerMetrics.error`,
`ServerMetrics.transferred`), whichever transport carried it, on the event
loop or on the session's thread. Anything else that steps environments (a
batch of sessions at once, say) calls the same methods.

The step path pays a few integer additions per request (no lock, no
prometheus_client object): each method adds to plain counters, which
prometheus_client reads only when the endpoint is scraped (a custom collector,
`ServerMetrics.collect`), so the exposition is the library's own. The
additions are not locked: in CPython with its GIL, one ``+=`` on an attribute
is not interleaved with another thread's; a free-threaded build may lose an
increment now and then.

The metrics, each labelled by ``env`` (the environment factory's name):

| metric | type | what |
|---|---|---|
| ``openenv_sessions_open`` | gauge | sessions holding a slot |
| ``openenv_sessions_queued`` | gauge | sessions waiting for a slot (``--queue-timeout``) |
| ``openenv_sessions_opened_total`` | counter | sessions admitted, by ``transport`` |
| ``openenv_sessions_refused_total`` | counter | sessions turned away (``CAPACITY_REACHED``), by ``transport`` |
| ``openenv_steps_total`` | counter | steps the environment took (one that raised too) |
| ``openenv_resets_total`` | counter | resets the environment took |
| ``openenv_step_duration_seconds`` | histogram | a step's time on the server: decode, the environment, encode |
| ``openenv_reset_duration_seconds`` | histogram | the same for a reset |
| ``openenv_errors_total`` | counter | error replies, by ``code`` |
| ``openenv_received_bytes_total`` | counter | request frames' bytes |
| ``openenv_sent_bytes_total`` | counter | reply frames' bytes |

A request refused before the environment saw it (invalid JSON, an invalid
action) counts only in ``openenv_errors_total`` and the bytes.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from typing import Final

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import Response

from transports.admission._sessions import SessionRegistry

__all__ = ["DEFAULT_BUCKETS", "METRICS_PATH", "ServerMetrics"]

METRICS_PATH: Final = "/metrics"
"""Where a server with metrics serves them."""

DEFAULT_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""The upper bounds (seconds) of the step and reset histograms: 100 µs (a step on loopback) to a minute."""


class _Timings:
    """A histogram's counts, kept as plain numbers: one bucket per bound, then the rest (``+Inf``)."""

    __slots__ = ("bounds", "buckets", "count", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        """Count one duration."""
        self.buckets[bisect.bisect_left(self.bounds, seconds)] += 1
        self.count += 1
        self.sum += seconds


class _Tally:
    """What one environment's sessions did: the counters behind its metrics."""

    __slots__ = ("errors", "received", "resets", "sent", "steps")

    def __init__(self, bounds: list[float]) -> None:
        self.steps = _Timings(bounds)
        self.resets = _Timings(bounds)
        self.errors: dict[str, int] = {}
        self.received = 0
        self.sent = 0


class ServerMetrics:
    """Counts what a server's sessions do, per environment, and serves it to Prometheus.

    Examples:
        A server made with ``create_app(..., metrics=True)`` has one
        (``app.state.metrics``) and serves ``GET /metrics``:

        ```python
        import httpx

        import openenv
        from openenv.examples.echo import EchoEnv, EchoEnvironment
        from transports.server.app import create_app

        app = create_app(EchoEnvironment, metrics=True)
        async with openenv.serve(app) as server:
            async with EchoEnv(server.url) as env:
                await env.reset()
            async with httpx.AsyncClient() as http:
                text = (await http.get(f"{server.url}/metrics")).text
        print([line for line in text.splitlines() if line.startswith("openenv_resets_total")])
        # ['openenv_resets_total{env="openenv.examples.echo:EchoEnvironment"} 1.0']
        ```

    Args:
        buckets: The histograms' upper bounds, in seconds, increasing.

    Raises:
        ValueError: ``buckets`` is empty or not increasing.
    """

    def __init__(self, *, buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        bounds = [float(bound) for bound in buckets]
        if not bounds or any(low >= high for low, high in itertools.pairwise(bounds)):
            raise ValueError(f"buckets must be increasing upper bounds, not {list(buckets)}")
        self._bounds = bounds
        self._tallies: dict[str, _Tally] = {}
        self._sessions: list[tuple[str, SessionRegistry]] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def watch(self, env: str, sessions: SessionRegistry) -> None:
        """Report a session registry's sessions (open, queued, opened, refused) under ``env``.

        Args:
            env: The environment's name.
            sessions: The registry of the server that serves it.
        """
        self._sessions.append((env, sessions))
        self._tally(env)

    def _tally(self, env: str) -> _Tally:
        tally = self._tallies.get(env)
        if tally is None:
            tally = self._tallies[env] = _Tally(self._bounds)
        return tally

    # -- the counting: called on every request -------------------------------------

    def step_done(self, env: str, seconds: float) -> None:
        """Count a step answered after ``seconds`` on the server.

        Args:
            env: The environment's name.
            seconds: From the request frame in to the reply frame out.
        """
        (self._tallies.get(env) or self._tally(env)).steps.observe(seconds)

    def reset_done(self, env: str, seconds: float) -> None:
        """Count a reset answered after ``seconds`` on the server.

        Args:
            env: The environment's name.
            seconds: From the request frame in to the reply frame out.
        """
        (self._tallies.get(env) or self._tally(env)).resets.observe(seconds)

    def error(self, env: str, code: str) -> None:
        """Count an error reply.

        Args:
            env: The environment's name.
            code: Its code (``VALIDATION_ERROR``, ``EXECUTION_ERROR``, ...).
        """
        errors = (self._tallies.get(env) or self._tally(env)).errors
        errors[code] = errors.get(code, 0) + 1

    def transferred(self, env: str, received: int, sent: int) -> None:
        """Count a request's bytes: its frame and its reply's.

        Args:
            env: The environment's name.
            received: The request frame's size.
            sent: The reply frame's size (0 for none).
        """
        tally = self._tallies.get(env) or self._tally(env)
        tally.received += received
        tally.sent += sent

    # -- the reading: called on a scrape -------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """The metrics now, as prometheus_client's collectors yield them.

        Yields:
            One metric family per metric, with a sample per environment (and transport, or code).
        """
        open_ = GaugeMetricFamily("openenv_sessions_open", "Sessions holding a slot.", labels=["env"])
        queued = GaugeMetricFamily("openenv_sessions_queued", "Sessions waiting for a slot.", labels=["env"])
        opened = CounterMetricFamily("openenv_sessions_opened", "Sessions admitted.", labels=["env", "transport"])
        refused = CounterMetricFamily(
            "openenv_sessions_refused", "Sessions turned away (CAPACITY_REACHED).", labels=["env", "transport"]
        )
        for env, sessions in self._sessions:
            open_.add_metric([env], sessions.active)
            queued.add_metric([env], sessions.queued)
            for transport, count in sorted(sessions.opened.items()):
                opened.add_metric([env, transport], count)
            for transport, count in sorted(sessions.refused.items()):
                refused.add_metric([env, transport], count)
        yield from (open_, queued, opened, refused)

        steps = CounterMetricFamily("openenv_steps", "Steps answered.", labels=["env"])
        resets = CounterMetricFamily("openenv_resets", "Resets answered.", labels=["env"])
        step_seconds = HistogramMetricFamily(
            "openenv_step_duration_seconds", "A step's time on the server.", labels=["env"]
        )
        reset_seconds = HistogramMetricFamily(
            "openenv_reset_duration_seconds", "A reset's time on the server.", labels=["env"]
        )
        errors = CounterMetricFamily("openenv_errors", "Error replies.", labels=["env", "code"])
        received = CounterMetricFamily("openenv_received_bytes", "Request frames' bytes.", labels=["env"])
        sent = CounterMetricFamily("openenv_sent_bytes", "Reply frames' bytes.", labels=["env"])
        for env, tally in list(self._tallies.items()):
            steps.add_metric([env], tally.steps.count)
            resets.add_metric([env], tally.resets.count)
            step_seconds.add_metric([env], self._buckets(tally.steps), tally.steps.sum)
            reset_seconds.add_metric([env], self._buckets(tally.resets), tally.resets.sum)
            for code, count in sorted(tally.errors.items()):
                errors.add_metric([env, code], count)
            received.add_metric([env], tally.received)
            sent.add_metric([env], tally.sent)
        yield from (steps, resets, step_seconds, reset_seconds, errors, received, sent)

    def _buckets(self, timings: _Timings) -> list[tuple[str, float]]:
        """Cumulative bucket counts, as Prometheus wants them (``le`` labels, ``+Inf`` last)."""
        counts = list(timings.buckets)  # one read of a list another thread may be adding to
        cumulative = 0
        buckets = []
        for bound, count in zip([*self._bounds, float("inf")], counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(cumulative)))
        return buckets

    async def endpoint(self, request: Request) -> Response:
        """``GET /metrics``: the text format Prometheus asks for (OpenMetrics or its own).

        Args:
            request: The scrape.

        Returns:
            The metrics, encoded as the ``Accept`` header prefers.
        """
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(self.registry), media_type=content_type)
