"""Measure an environment server: concurrent sessions stepping in a loop, each step timed.

Each session is an `openenv.EnvClient` of its own, untyped (replies stay dicts,
so any server will do). It connects, resets, takes its warm-up steps, then waits
for the others: the measurement starts when every session is ready, so the
connection set-up and warm-up never count. A step's latency is the wall time of
its ``await client.step(action)`` (`time.perf_counter`); only steps that succeed
are timed. A ``done`` step is followed by a reset, counted apart and not timed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import anyio
import msgspec

from openenv import (
    CapacityReachedError,
    ClientStateError,
    EnvClient,
    OpenEnvError,
    ServerError,
    StepResult,
    TransportError,
)
from openenv._registry import takes_option
from transports.bench._schema_action import SchemaActionError, minimal_action
from transports.bench._schema_fetch import SchemaUnavailable, fetch_action_schema
from transports.bench._stats import LatencySummary, summarize_latencies
from transports.shared._network_client import describe

__all__ = ["DEFAULT_STEPS", "BenchResult", "BenchmarkError", "ProgressCallback", "resolve_action", "run_benchmark"]

DEFAULT_STEPS = 1000

# Distinct error messages kept per measurement, as examples.
_MAX_ERROR_EXAMPLES = 5

ProgressCallback = Callable[[int, float], None]
"""Called now and then during a measurement with the steps taken (successful or not) and the seconds elapsed."""


class BenchmarkError(Exception):
    """A measurement could not start: no connection, no action, no capacity. The message is one line."""


class BenchResult(msgspec.Struct, kw_only=True):
    """What one measurement of one environment URL found.

    Attributes:
        url: The environment URL.
        transport: The URL's scheme, which picked the transport (``"ws"``, ``"http+poll"``, ...).
        sessions: The concurrent sessions.
        steps: The steps that succeeded (warm-up steps not counted).
        errors: The steps (and resets after ``done``) that raised an `openenv.OpenEnvError`.
        resets: The resets after a step said ``done``.
        seconds: The measurement's wall time: from the moment every session was
            ready to the end of the last step.
        steps_per_second: ``steps / seconds``, over all sessions.
        latency_ms: The successful steps' latencies, in milliseconds.
        error_examples: A few distinct error messages (``"ExecutionError: ..."``).
    """

    url: str
    transport: str
    sessions: int
    steps: int
    errors: int
    resets: int
    seconds: float
    steps_per_second: float
    latency_ms: LatencySummary
    error_examples: list[str]


def _ends_session(exc: OpenEnvError) -> bool:
    """Whether the session can go on after this error (a fatal server error or a dead channel cannot)."""
    return isinstance(exc, (TransportError, ClientStateError)) or (isinstance(exc, ServerError) and exc.fatal)


def _one_line(exc: BaseException) -> str:
    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, CapacityReachedError):
        message += " (the server's session limit: try fewer sessions)"
    return message


class _Measurement:
    """What the sessions of one measurement share: the step budget, the start line, the tallies."""

    def __init__(self, sessions: int, steps: int | None, seconds: float | None) -> None:
        self.sessions = sessions
        self.remaining = steps  # None when measuring for a time instead
        self.seconds = seconds
        self.ready = 0
        self.started = anyio.Event()
        self.start_time = 0.0
        self.end_time = 0.0
        self.deadline = math.inf
        self.attempted = 0
        self.resets = 0
        self.errors = 0
        self.latencies: list[float] = []
        self.error_examples: list[str] = []
        self.failure: str | None = None

    def elapsed(self) -> float:
        if not self.start_time:  # not started (or never will: a session failed)
            return 0.0
        return (self.end_time or time.perf_counter()) - self.start_time

    async def start_together(self) -> bool:
        """Wait until every session is ready; the last one to arrive starts the clock.

        Returns ``False`` if a session failed instead: there is nothing to measure.
        """
        self.ready += 1
        if self.ready == self.sessions and self.failure is None:
            self.start_time = time.perf_counter()
            if self.seconds is not None:
                self.deadline = self.start_time + self.seconds
            self.started.set()
        await self.started.wait()
        return self.failure is None

    def fail(self, reason: str) -> None:
        """Give up before the start: the first reason is kept, and the sessions waiting at the start leave."""
        if self.failure is None:
            self.failure = reason
        # Not cancelled: sessions still connecting finish (bounded by the timeout) and close cleanly.
        self.started.set()

    def take_step(self) -> bool:
        """Claim one step of the budget; ``False`` once it is spent (or the time is up)."""
        if self.remaining is None:
            return time.perf_counter() < self.deadline
        if self.remaining <= 0:
            return False
        self.remaining -= 1
        return True

    def record_error(self, exc: OpenEnvError) -> None:
        self.errors += 1
        message = describe(exc)
        if len(self.error_examples) < _MAX_ERROR_EXAMPLES and message not in self.error_examples:
            self.error_examples.append(message)

    def session_done(self) -> None:
        self.end_time = max(self.end_time, time.perf_counter())


async def _measure(client: EnvClient[Any, Any, Any], action: Any, measurement: _Measurement) -> None:
    """Step until the budget is spent, the time is up, or the session cannot go on.

    A new episode starts (unmeasured) after an episode ends, and after a step
    fails: an action legal once per episode (a board game's first move) fails
    the second time, and succeeds again after a reset.
    """
    latencies = measurement.latencies
    perf_counter = time.perf_counter
    while measurement.take_step():
        started = perf_counter()
        try:
            result: StepResult[Any] = await client.step(action)
        except OpenEnvError as exc:
            measurement.attempted += 1
            measurement.record_error(exc)
            if _ends_session(exc) or not await _new_episode(client, measurement):
                break
            continue
        latencies.append(perf_counter() - started)
        measurement.attempted += 1
        if result.done and not await _new_episode(client, measurement):
            break
    measurement.session_done()


async def _new_episode(client: EnvClient[Any, Any, Any], measurement: _Measurement) -> bool:
    """Reset, counting it; returns ``False`` if the session cannot go on."""
    try:
        await client.reset()
    except OpenEnvError as exc:
        measurement.record_error(exc)
        return not _ends_session(exc)
    measurement.resets += 1
    return True


async def _warm_up(client: EnvClient[Any, Any, Any], action: Any, steps: int) -> None:
    """Take steps that are not measured, resetting as `_measure` does; errors a session survives are ignored."""
    for _ in range(steps):
        try:
            result = await client.step(action)
        except ServerError as exc:
            if exc.fatal:
                raise
            await client.reset()
            continue
        if result.done:
            await client.reset()


async def _session(
    url: str,
    action: Any,
    measurement: _Measurement,
    *,
    warmup: int,
    timeout: float | None,
    auth_token: str | None,
) -> None:
    """One session: connect, reset, warm up, wait for the others, then measure."""
    try:
        options: dict[str, Any] = {"auth_token": auth_token} if auth_token is not None else {}
        client: EnvClient[Any, Any, Any] = EnvClient(url, timeout=timeout, **options)
        # The connection is bounded by `timeout` as well; every request by the client's own timeout.
        with anyio.CancelScope() as connecting:
            if timeout is not None:
                connecting.deadline = anyio.current_time() + timeout
            async with client:
                connecting.deadline = math.inf
                await client.reset()
                await _warm_up(client, action, warmup)
                if await measurement.start_together():
                    await _measure(client, action, measurement)
        if connecting.cancelled_caught:
            measurement.fail(f"{url}: no connection within {timeout} s")
    except (OpenEnvError, ValueError) as exc:
        measurement.fail(f"{url}: {_one_line(exc)}")


async def _report_progress(measurement: _Measurement, on_progress: ProgressCallback, interval: float) -> None:
    while True:
        on_progress(measurement.attempted, measurement.elapsed())
        await anyio.sleep(interval)


async def resolve_action(
    url: str, action: Mapping[str, Any] | None, *, timeout: float | None, auth_token: str | None = None
) -> dict[str, Any]:
    """The action to step with: the one given, or the smallest that fits the environment's action schema.

    Args:
        url: The environment URL.
        action: The action's fields, or ``None`` to build them from the schema.
        timeout: Seconds to wait for the server's schema.
        auth_token: The server's bearer token (``None``: ``OPENENV_AUTH_TOKEN``, if set).

    Returns:
        The action's fields.

    Raises:
        BenchmarkError: No schema can be had, or no instance built from it.
    """
    if action is not None:
        return dict(action)
    try:
        return minimal_action(await fetch_action_schema(url, timeout=timeout, auth_token=auth_token))
    except (SchemaUnavailable, SchemaActionError) as exc:
        raise BenchmarkError(
            f"{url}: cannot build an action from the environment's schema ({_one_line(exc)}); give one explicitly"
        ) from exc
    except OpenEnvError as exc:
        raise BenchmarkError(f"{url}: {_one_line(exc)}") from exc


async def run_benchmark(
    url: str,
    *,
    action: Mapping[str, Any] | None = None,
    sessions: int = 1,
    steps: int | None = None,
    seconds: float | None = None,
    warmup: int = 5,
    timeout: float | None = 30.0,
    auth_token: str | None = None,
    on_progress: ProgressCallback | None = None,
    progress_interval: float = 0.1,
) -> BenchResult:
    """Measure one environment URL: ``sessions`` concurrent sessions stepping in a loop.

    Runs under asyncio or trio (whichever anyio runs on). From a script:
    ``anyio.run(functools.partial(run_benchmark, "ws://127.0.0.1:8000", steps=500))``.

    Args:
        url: The environment URL; its scheme picks the transport.
        action: The action's fields, sent with every step; ``None`` builds the
            smallest action the environment's schema allows (see `minimal_action`).
        sessions: Concurrent sessions, each its own client.
        steps: Steps to take in all, over all sessions (errors included); the
            default when neither ``steps`` nor ``seconds`` is given is 1000.
        seconds: Measure for this long instead (steps in flight then complete).
        warmup: Steps each session takes before the measurement, not counted.
        timeout: Seconds to wait for the connection and for each reply; ``None``
            for no limit. A step that times out counts as an error.
        auth_token: The server's bearer token, for the schema and every
            session; ``None`` takes it from ``OPENENV_AUTH_TOKEN``, if set.
            Given for a transport that takes none (``inproc://``), it is ignored.
        on_progress: Called every ``progress_interval`` seconds, and once at the
            end, with the steps taken so far and the seconds elapsed.
        progress_interval: See ``on_progress``.

    Returns:
        The result.

    Raises:
        BenchmarkError: The measurement could not start: no schema or action, a
            session could not connect or reset (unknown scheme, no server, the
            server's session limit), or the connection timed out.
        ValueError: Bad arguments (both ``steps`` and ``seconds``, no sessions, ...).
    """
    if steps is not None and seconds is not None:
        raise ValueError("give steps or seconds, not both")
    if steps is None and seconds is None:
        steps = DEFAULT_STEPS
    if sessions < 1 or warmup < 0 or (steps is not None and steps < 1) or (seconds is not None and seconds <= 0):
        raise ValueError("sessions and steps must be at least 1, seconds positive, warmup not negative")
    if auth_token is not None and not takes_option(url, "auth_token"):
        auth_token = None  # in-process, say: nothing to authenticate to
    fields = await resolve_action(url, action, timeout=timeout, auth_token=auth_token)
    measurement = _Measurement(sessions, steps, seconds)
    async with anyio.create_task_group() as reporting:
        if on_progress is not None:
            reporting.start_soon(_report_progress, measurement, on_progress, progress_interval)
        async with anyio.create_task_group() as session_group:
            for _ in range(sessions):
                session = partial(_session, warmup=warmup, timeout=timeout, auth_token=auth_token)
                session_group.start_soon(session, url, fields, measurement)
        reporting.cancel_scope.cancel()
    if measurement.failure is not None:
        raise BenchmarkError(measurement.failure)
    if on_progress is not None:
        on_progress(measurement.attempted, measurement.elapsed())
    elapsed = measurement.elapsed()
    succeeded = len(measurement.latencies)
    return BenchResult(
        url=url,
        transport=url.partition("://")[0].lower(),
        sessions=sessions,
        steps=succeeded,
        errors=measurement.errors,
        resets=measurement.resets,
        seconds=elapsed,
        steps_per_second=succeeded / elapsed if elapsed > 0 else 0.0,
        latency_ms=summarize_latencies(measurement.latencies),
        error_examples=measurement.error_examples,
    )
