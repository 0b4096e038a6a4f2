"""`EnvPool`: many environment sessions as one object: their placement, lifetime and policies; `SyncEnvPool`.

A pool's calls are batches: how one batch's requests and replies are
exchanged is `openenv._pool_steps`. Here: opening the sessions, spread over
the servers (a full one skipped for a while), closing them, and the
policies applied to each batch's outcome (replacing a failed session,
resetting a finished episode). The sessions' clients have no owner of their
own: the pool is their owner, and runs their transports' idle work
(`openenv.Transport.keep`) in its task group. `SyncEnvPool` is its blocking
facade (`openenv._blocking`).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, Literal, NoReturn, Self

import anyio
import msgspec
from anyio.abc import TaskGroup

from ._blocking import BlockingFacade, Holder, call
from ._client import EnvClient, requests_of
from ._clock import EVENT_LOOP_CLOCK, Clock
from ._exceptions import (
    CapacityReachedError,
    ClientStateError,
    ConnectError,
    EncodingError,
    EnvPoolError,
    InvalidJSONError,
    OpenEnvError,
    ReplyValidationError,
    TimeoutError,
    UnknownTypeError,
    UnsupportedSchemeError,
    ValidationError,
)
from ._limits import DEFAULT_PLACEMENT_TIMEOUT, USE_CLIENT_DEFAULT, UseClientDefault
from ._pool_steps import (
    STATE,
    BatchExchange,
    Outcome,
    PooledSession,
    Request,
    reset_request,
    step_request,
    step_requests,
)
from ._types import ActT, ObsT, StateT, StepResult

__all__ = ["AutoResetMode", "EnvPool", "FinalStepResult", "ReplacedStepResult", "SyncEnvPool"]

logger = logging.getLogger("openenv.client")

OnError = Literal["raise", "replace"]

AutoResetMode = Literal["next_step", "same_step", "disabled"]
"""When an `EnvPool` resets a session whose episode ended (Gymnasium's autoreset modes)."""

# Errors a new session would only repeat: the caller's action, arguments or types are wrong.
_CALLER_MISTAKES = (
    ValidationError,
    EncodingError,
    ClientStateError,
    ReplyValidationError,
    InvalidJSONError,
    UnknownTypeError,
    UnsupportedSchemeError,
)


class ReplacedStepResult(StepResult[ObsT], frozen=True, kw_only=True):
    """The result at an index whose session failed and was replaced (``on_error="replace"``).

    The failed session is closed and a new one, opened in its place (on any of the
    pool's URLs), is reset: ``observation`` and ``reward`` are the new session's
    first. ``done`` is true when the failure cut an episode short (during a step);
    auto-reset does not reset such a session again.

    Attributes:
        error: Why the old session failed (`ConnectionClosed`, `TimeoutError`,
            `ExecutionError`, ...).
    """

    error: OpenEnvError


class FinalStepResult(StepResult[ObsT], frozen=True, kw_only=True):
    """The result of a step that ended an episode, in ``autoreset_mode="same_step"``.

    The session was reset at once: ``observation`` is the new episode's first,
    while ``reward`` and ``done`` (true) are the step's, as Gymnasium's
    same-step autoreset returns them.

    Attributes:
        final_observation: The last observation of the episode that ended.
    """

    final_observation: Any


class EnvPool(Generic[ActT, ObsT, StateT]):
    """Many sessions of one environment as one object: reset and step them all at once.

    Every call sends each session's request at once and returns one result per
    session, in the pool's order. It is a batch, not a task per session: the
    requests to one server leave together (one message, on a shared
    connection), and the replies that come together are taken together.
    Sessions are spread evenly over the URLs given; a server that refuses a
    session (``CAPACITY_REACHED``, or refusing the connection) is skipped for
    ``retry_interval`` seconds and the session is opened on another, or on the
    same one once it has room again. The pool works over every transport
    (``ws://``, ``http+poll://``, ``inproc://``, ``ray://``, ...) and under
    asyncio and trio.

    Enter and leave it in one task (``async with``), as any anyio task group; its
    methods may be called from any task, one call at a time. `sync` gives a
    blocking facade.

    For environments whose steps take uneven times, `send` and `recv` are
    envpool's asynchronous pair: send actions to some sessions, then take the
    results of whichever are ready, each tagged with its session's index, while
    the slow ones go on thinking.

    When a session fails:

    - ``on_error="raise"`` (the default): the call waits for every session's
      request, then raises `EnvPoolError`, whose ``errors`` maps each failed index
      to its exception. Sessions whose error is not fatal go on.
    - ``on_error="replace"``: the failed session is closed, a new one is opened
      and reset in its place, and the result at that index is a
      `ReplacedStepResult` carrying the ``error``. A caller's mistake (an invalid
      action: `ValidationError`, `EncodingError`, ...) and a replacement that
      fails too are raised as with ``"raise"``.

    Episodes (``autoreset_mode``, Gymnasium's modes):

    - ``"disabled"`` (the default): a session whose episode is done is stepped
      on like any other (the environment decides what that means); call `reset`
      when you want. The default because an OpenEnv environment may go on after
      ``done`` (a tool session, an episode of many tasks), and a reset the caller
      did not ask for would end what it still wanted.
    - ``"next_step"``: the first `step` after an episode ended resets the
      session instead of stepping it, and returns that reset's result at its
      index (the action given for it is ignored), as Gymnasium's vector
      environments do by default.
    - ``"same_step"``: the step that ends an episode resets the session at
      once; its result is a `FinalStepResult`: the new episode's first
      observation, the step's reward and ``done``, and the episode's last
      observation as ``final_observation``.

    The resets take no arguments.

    Examples:
        ```python
        from openenv import EnvPool
        from openenv.examples.echo import CallToolAction, EchoEnv

        async with EnvPool("ws://127.0.0.1:8000", size=4, client=EchoEnv) as pool:
            results = await pool.reset(episode_id=["a", "b", "c", "d"])  # a list: one value per session
            actions = [CallToolAction(tool_name="echo_message", arguments={"message": f"hi {i}"}) for i in range(4)]
            results = await pool.step(actions)
            print([result.observation.echoed_message for result in results])  # ['hi 0', 'hi 1', 'hi 2', 'hi 3']
            states = await pool.state()
            print([state.episode_id for state in states])  # ['a', 'b', 'c', 'd']
        ```

    Args:
        urls: The server URL, or several: sessions are spread evenly over them.
        size: How many sessions the pool holds (at least 1).
        client: The client class (or any callable ``client(url, **client_options)``
            returning an unconnected `EnvClient`); `EnvClient` (untyped) by default.
        on_error: ``"raise"`` or ``"replace"``: what a failed session does (above).
        autoreset_mode: ``"disabled"``, ``"next_step"`` or ``"same_step"`` (above).
        auto_reset: The older switch: ``True`` is ``autoreset_mode="next_step"``.
        max_connecting: The most sessions being opened at once.
        retry_interval: Seconds a server that refused a session is skipped for
            before it is tried again.
        placement_timeout: Seconds to keep trying to open one session while every
            server refuses (``None``: no limit).
        clock: Where the pool measures its waits (a batch's timeout, the
            retries of a full server, ``placement_timeout``); the event loop's
            time by default. One given here is every client's clock too.
        **client_options: Passed to every client (``timeout``, transport options).

    Attributes:
        urls: The servers' URLs.
        size: The number of sessions.
        on_error: The failure policy.
        autoreset_mode: When sessions are reset after their episode ends.

    Raises:
        ValueError: No URL, a ``size`` below 1, an unknown ``on_error`` or
            ``autoreset_mode``, or both ``auto_reset`` and ``autoreset_mode``.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        size: int,
        client: Callable[..., EnvClient[ActT, ObsT, StateT]] = EnvClient,
        on_error: OnError = "raise",
        autoreset_mode: AutoResetMode | None = None,
        auto_reset: bool = False,
        max_connecting: int = 64,
        retry_interval: float = 1.0,
        placement_timeout: float | None = DEFAULT_PLACEMENT_TIMEOUT,
        clock: Clock = EVENT_LOOP_CLOCK,
        **client_options: Any,
    ) -> None:
        self.urls: tuple[str, ...] = (urls,) if isinstance(urls, str) else tuple(urls)
        if not self.urls:
            raise ValueError("EnvPool needs at least one URL")
        if size < 1:
            raise ValueError(f"an EnvPool holds at least one session, not size={size}")
        if on_error not in ("raise", "replace"):
            raise ValueError(f"on_error must be 'raise' or 'replace', not {on_error!r}")
        if autoreset_mode is not None and auto_reset:
            raise ValueError("give autoreset_mode or auto_reset, not both (auto_reset=True is 'next_step')")
        mode: AutoResetMode = autoreset_mode or ("next_step" if auto_reset else "disabled")
        if mode not in ("next_step", "same_step", "disabled"):
            raise ValueError(f"autoreset_mode must be 'next_step', 'same_step' or 'disabled', not {mode!r}")
        if max_connecting < 1:
            raise ValueError(f"max_connecting must be at least 1, not {max_connecting}")
        self.size = size
        self.on_error: OnError = on_error
        self.autoreset_mode: AutoResetMode = mode
        self._client_factory = client
        self._clock = clock
        # Handed on only when given, so that a client factory that takes no clock still works by default.
        self._client_options = client_options if clock is EVENT_LOOP_CLOCK else {**client_options, "clock": clock}
        self._max_connecting = max_connecting
        self._retry_interval = retry_interval
        self._placement_timeout = placement_timeout
        self._sessions: list[PooledSession[ActT, ObsT, StateT]] = []
        self._steps = BatchExchange(self._sessions, clock)
        self._live: dict[str, int] = dict.fromkeys(self.urls, 0)
        self._avoid_until: dict[str, float] = dict.fromkeys(self.urls, -math.inf)
        self._refusal: dict[str, OpenEnvError] = {}
        self._owners: TaskGroup | None = None
        self._connecting: anyio.CapacityLimiter | None = None
        self._closed = False

    @property
    def auto_reset(self) -> bool:
        """Whether a finished episode is reset at the next step (``autoreset_mode == "next_step"``)."""
        return self.autoreset_mode == "next_step"

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._owners else "unopened"
        return f"<EnvPool of {self.size} over {', '.join(self.urls)} {state}>"

    def __len__(self) -> int:
        return self.size

    @property
    def clients(self) -> tuple[EnvClient[ActT, ObsT, StateT], ...]:
        """The session clients, in the pool's order (to call one directly); empty until entered.

        A replaced session's index gets a new client, so look them up again after a
        call that returned a `ReplacedStepResult`.
        """
        return tuple(session.client for session in self._sessions)

    # -- lifecycle -------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Open every session, concurrently (at most ``max_connecting`` at a time).

        Returns:
            The pool itself.

        Raises:
            ConnectError: A session could not connect to any of the servers (the
                error of the first such session); the others are closed again.
            CapacityReachedError: Every server stayed at capacity for ``placement_timeout``.
            ClientStateError: The pool was entered before.
            UnsupportedSchemeError: No transport handles a URL's scheme.
            ValueError: A transport rejected a URL or an option.
            TypeError: A client or transport does not take an option given.
        """
        if self._owners is not None or self._closed:
            raise ClientStateError("an EnvPool can be entered only once; create a new one")
        self._connecting = anyio.CapacityLimiter(self._max_connecting)
        owners = anyio.create_task_group()
        await owners.__aenter__()
        self._owners = owners
        opened: list[PooledSession[ActT, ObsT, StateT] | None] = [None] * self.size
        errors: dict[int, Exception] = {}

        async def open_one(index: int) -> None:
            try:
                opened[index] = await self._open_session()
            except Exception as exc:
                errors[index] = exc

        try:
            async with anyio.create_task_group() as opening:
                for index in range(self.size):
                    opening.start_soon(open_one, index)
        finally:
            self._sessions[:] = [session for session in opened if session is not None]
            if errors or len(self._sessions) != self.size:
                await self._close_all(None, None, None)
        if errors:
            raise errors[min(errors)]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close every session (each client's `EnvClient.close`), concurrently."""
        await self._close_all(exc_type, exc_value, traceback)

    async def _close_all(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        owners, self._owners = self._owners, None
        self._closed = True
        if owners is None:
            return
        try:
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as closing:
                    for session in self._sessions:
                        closing.start_soon(self._close_session, session)
        finally:
            # The idle work was cancelled with each session: the group ends at once. The
            # block's own exception (if any) goes on as itself, not wrapped in an exception group.
            await owners.__aexit__(None, None, None)

    @staticmethod
    async def _close_session(session: PooledSession[ActT, ObsT, StateT]) -> None:
        session.keeper.cancel()
        # A close that fails must not take the pool's other sessions down with it.
        with contextlib.suppress(Exception):
            await session.client.close()

    def sync(self, *, backend: str = "asyncio") -> SyncEnvPool[ActT, ObsT, StateT]:
        """Return a blocking facade of this pool, for code without an event loop.

        Nothing opens yet: the facade opens the pool when it is entered.

        Args:
            backend: The event loop to run the pool on, in a background thread:
                ``"asyncio"`` (the default) or ``"trio"``.

        Returns:
            A `openenv.SyncEnvPool` with the same methods, blocking.

        Examples:
            ```python
            from openenv import EnvPool
            from openenv.examples.echo import CallToolAction, EchoEnv

            with EnvPool("ws://127.0.0.1:8000", size=2, client=EchoEnv).sync() as pool:
                pool.reset()
                results = pool.step([CallToolAction(tool_name="echo_message", arguments={"message": "hi"})] * 2)
                print([result.observation.echoed_message for result in results])  # ['hi', 'hi']
            ```
        """
        return SyncEnvPool(self, backend=backend)

    # -- placement ---------------------------------------------------------------

    def _placement_deadline(self) -> float:
        return math.inf if self._placement_timeout is None else self._clock.now() + self._placement_timeout

    async def _open_session(self, deadline: float | None = None) -> PooledSession[ActT, ObsT, StateT]:
        """Open one session on the least-loaded server that is not being skipped, until ``deadline``."""
        assert self._connecting is not None
        if deadline is None:
            deadline = self._placement_deadline()
        async with self._connecting:
            while True:
                now = self._clock.now()
                candidates = [url for url in self.urls if self._avoid_until[url] <= now]
                if not candidates:
                    await self._wait_for_a_server(now, deadline)
                    continue
                url = min(candidates, key=self._live.__getitem__)
                self._live[url] += 1
                client = self._client_factory(url, **self._client_options)
                try:
                    await client.connect()
                except ConnectError as exc:
                    self._live[url] -= 1
                    self._skip(url, exc)
                    continue
                except BaseException:
                    self._live[url] -= 1
                    raise
                requests = requests_of(client)
                assert requests is not None  # connected
                session = PooledSession(url, client, requests)
                self._keep(session)
                return session

    def _keep(self, session: PooledSession[ActT, ObsT, StateT]) -> None:
        """Run the session's transport's idle work in the pool's task group until the session closes."""
        owners, transport = self._owners, session.requests.transport
        assert owners is not None

        async def keep() -> None:
            with session.keeper:
                try:
                    await transport.keep()
                except Exception:  # the session's next request reports what broke
                    logger.exception("the idle work of %r failed", session.client)

        owners.start_soon(keep)

    def _skip(self, url: str, refusal: OpenEnvError) -> None:
        self._avoid_until[url] = self._clock.now() + self._retry_interval
        self._refusal[url] = refusal

    async def _wait_for_a_server(self, now: float, deadline: float) -> None:
        # A server that refused the connection itself is not waited for: say so now.
        if all(isinstance(self._refusal.get(url), ConnectError) for url in self.urls):
            raise self._refusal[self.urls[0]]
        retry_at = min(self._avoid_until.values())
        if retry_at > deadline:
            self._raise_full()
        await self._clock.sleep(retry_at - now)

    def _raise_full(self) -> NoReturn:
        raise self._full_error()

    def _full_error(self) -> CapacityReachedError:
        refusal = next(error for error in self._refusal.values() if isinstance(error, CapacityReachedError))
        error = CapacityReachedError(
            f"every server stayed at capacity for {self._placement_timeout} s ({refusal.message})",
            data=refusal.data,
        )
        error.__cause__ = refusal
        return error

    async def _replace(self, index: int, deadline: float | None = None) -> None:
        old = self._sessions[index]
        await self._close_session(old)
        self._live[old.url] -= 1
        self._sessions[index] = await self._open_session(deadline)

    # -- requests ------------------------------------------------------------------

    async def reset(
        self, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT, **kwargs: Any
    ) -> list[StepResult[ObsT]]:
        """Start a new episode in every session, at once.

        Args:
            timeout: Seconds the call waits for the replies, instead of the
                clients' timeout (``None``: no limit).
            **kwargs: Passed to every environment's ``reset``. A value that is a
                ``list`` gives one value per session (it must hold `size` of
                them): ``seed=[0, 1, 2, 3]``. To give every session the same
                list, pass a tuple.

        Returns:
            One result per session, in order (a `ReplacedStepResult` where a
            session was replaced).

        Raises:
            EnvPoolError: Sessions failed (see the failure policy); its ``errors``
                holds each one's exception.
            ValueError: A list argument does not hold one value per session.
            ClientStateError: The pool is not open.
        """
        self._check_open()
        per_session = self._split_arguments(kwargs)
        requests = {index: reset_request(per_session[index]) for index in range(self.size)}
        return await self._run(requests, timeout)

    async def step(
        self, actions: Sequence[ActT], *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT
    ) -> list[StepResult[ObsT]]:
        """Take one step in every session, at once: ``actions[i]`` in session ``i``.

        Args:
            actions: One action per session, in the pool's order.
            timeout: Seconds the call waits for the replies, instead of the
                clients' timeout (``None``: no limit).

        Returns:
            One result per session, in order. Where the autoreset mode reset a
            session, that reset's result (see the class); where a session was
            replaced, a `ReplacedStepResult`.

        Raises:
            EnvPoolError: Sessions failed (see the failure policy); its ``errors``
                holds each one's exception.
            ValueError: Not one action per session.
            TypeError: One action instead of a list of them.
            ClientStateError: The pool is not open.
        """
        self._check_open()
        self._check_actions(actions, self.size)
        if self.autoreset_mode == "next_step":
            requests = {index: self._step_request(index, action) for index, action in enumerate(actions)}
        else:
            requests = step_requests(actions)
        return await self._run(requests, timeout)

    async def state(self, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT) -> list[StateT]:
        """Ask every session for its environment's state, at once.

        A failure is raised, never replaced: a state is no episode to restart.

        Args:
            timeout: Seconds the call waits for the replies (``None``: no limit).

        Returns:
            One state per session, in order.

        Raises:
            EnvPoolError: Sessions failed; its ``errors`` holds each one's exception.
            ClientStateError: The pool is not open.
        """
        self._check_open()
        requests = dict.fromkeys(range(self.size), STATE)
        return await self._run(requests, timeout)

    async def send(
        self,
        actions: Sequence[ActT],
        indices: Sequence[int] | None = None,
    ) -> None:
        """Send actions to some sessions without waiting for their results (envpool's ``send``).

        Take the results with `recv`. A session whose result has not been taken
        yet cannot be sent another action. The autoreset mode applies: a session
        whose episode ended is reset instead (``"next_step"``).

        Args:
            actions: One action per session sent to.
            indices: The sessions' indices, one per action; all of them, in
                order, by default.

        Raises:
            EnvPoolError: Sessions could not be sent to (a broken connection, an
                action that cannot be encoded); the others were.
            ValueError: Not one action per index, an index out of range, or a
                session still waiting for its result.
            TypeError: ``actions`` is not a sequence of actions.
            ClientStateError: The pool is not open.
        """
        self._check_open()
        if indices is None:
            indices = range(self.size)
        self._check_actions(actions, len(indices))
        for index in indices:
            if not 0 <= index < self.size:
                raise ValueError(f"no session {index} in a pool of {self.size}")
            if self._sessions[index].pending is not None:
                raise ValueError(f"session {index} still waits for its result: recv() it before sending again")
        if len(set(indices)) != len(indices):
            raise ValueError("an index appears twice: one action per session")
        errors: dict[int, OpenEnvError] = {}
        for index, action in zip(indices, actions, strict=True):
            try:
                await self._steps.send(index, self._step_request(index, action))
            except OpenEnvError as exc:
                errors[index] = exc
        if errors:
            raise EnvPoolError(errors) from errors[min(errors)]

    async def recv(
        self,
        min_results: int | None = None,
        *,
        timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
    ) -> dict[int, StepResult[ObsT]]:
        """Take the results of the sessions that are ready (envpool's ``recv``), at least ``min_results`` of them.

        Waits until at least ``min_results`` sessions sent to with `send` have
        answered, then returns every result ready, by session index, in the
        order of the indices: each the result `step` would have given (a
        `FinalStepResult`, a `ReplacedStepResult` where those apply). Sessions
        still thinking go on; take their results with a later call.

        Args:
            min_results: The fewest results to wait for; all the sessions sent
                to, by default (capped at that number).
            timeout: Seconds to wait for ``min_results`` of them, instead of the
                clients' timeout (``None``: no limit).

        Returns:
            The results ready, by session index.

        Raises:
            EnvPoolError: Sessions failed (see the failure policy; ``"replace"``
                replaces them and returns their `ReplacedStepResult`), or
                fewer than ``min_results`` answered within the timeout (those
                missing map to `TimeoutError`; they stay sent, and a later call
                may still take their results).
            ClientStateError: The pool is not open.
        """
        self._check_open()
        pending = {
            index: (session.pending.kind, session.pending.reset_arguments)
            for index, session in enumerate(self._sessions)
            if session.pending is not None
        }
        wanted = len(pending) if min_results is None else min(min_results, len(pending))
        outcome, steps = Outcome(), self._steps
        await steps.sweep(list(pending), outcome)
        if len(outcome) < wanted:
            await steps.wait_for_some(list(pending), wanted, outcome, steps.deadline(timeout))
        if len(outcome) < wanted:
            missing = [index for index in pending if index not in outcome]
            for index in missing:
                outcome.errors[index] = TimeoutError(f"no result within {steps.timeout_of(timeout)} s")
        taken = {index: kind for index, kind in pending.items() if index in outcome}
        results = await self._settle(taken, outcome, timeout)
        return dict(sorted(results.items()))

    # -- the batch -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._owners is None:
            raise ClientStateError(
                "the EnvPool is closed" if self._closed else "the EnvPool is not open: use `async with EnvPool(...)`"
            )

    @staticmethod
    def _check_actions(actions: Sequence[Any], expected: int) -> None:
        if isinstance(actions, (Mapping, str, bytes, msgspec.Struct)) or not hasattr(actions, "__len__"):
            raise TypeError(
                f"step takes a list of actions, one per session ({expected}), not one {type(actions).__name__}: "
                f"for the same action in every session, step([action] * pool.size)"
            )
        if len(actions) != expected:
            raise ValueError(f"step needs one action per session: {expected}, not {len(actions)}")

    def _split_arguments(self, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        for name, value in kwargs.items():
            if isinstance(value, list) and len(value) != self.size:
                raise ValueError(
                    f"{name}= is a list, so it needs one value per session: {self.size}, not {len(value)} "
                    "(pass a tuple to give every session the same sequence)"
                )
        return [
            {name: value[index] if isinstance(value, list) else value for name, value in kwargs.items()}
            for index in range(self.size)
        ]

    def _step_request(self, index: int, action: ActT) -> Request:
        if self.autoreset_mode == "next_step" and self._sessions[index].done:
            return reset_request({})
        return step_request(action)

    async def _run(self, requests: dict[int, Request], timeout: float | UseClientDefault | None) -> list[Any]:
        """Send every request, take every reply, apply the policies; one result per session, in order."""
        outcome = await self._steps.exchange(requests, timeout)
        # Servers report being full at a session's first request: a new session refused so
        # is moved to another server (or the same one, once it has room) and asked again.
        deadline: float | None = None
        while True:
            refused = {
                index: error
                for index, error in outcome.errors.items()
                if isinstance(error, CapacityReachedError) and self._sessions[index].fresh
            }
            if not refused:
                break
            if deadline is None:
                deadline = self._placement_deadline()
            elif self._clock.now() >= deadline:
                for index in refused:
                    outcome.errors[index] = self._full_error()
                break
            moved: dict[int, Request] = {}
            for index, error in refused.items():
                self._skip(self._sessions[index].url, error)
                try:
                    await self._replace(index, deadline)
                except OpenEnvError as exc:
                    outcome.errors[index] = exc
                    continue
                del outcome.errors[index]
                moved[index] = requests[index]
            if not moved:
                break
            outcome.update(await self._steps.exchange(moved, timeout))
        results = await self._settle(requests, outcome, timeout)
        if len(results) == self.size:
            return list(map(results.__getitem__, range(self.size)))
        return [results[index] for index in range(self.size) if index in results]

    async def _settle(
        self,
        kinds: Mapping[int, Request | tuple[str, dict[str, Any]]],
        outcome: Outcome,
        timeout: float | UseClientDefault | None,
    ) -> dict[int, Any]:
        """Apply the episode and failure policies to a batch's outcome; raise `EnvPoolError` if any failed."""
        results: dict[int, Any] = dict(outcome.ready)
        same_step: list[int] = []
        sessions, resets_now = self._sessions, self.autoreset_mode == "same_step"
        for index, result in results.items():
            if not isinstance(result, StepResult):
                continue  # a state
            session = sessions[index]
            session.fresh = False
            session.done = done = result.done
            if done and resets_now and kinds[index][0] == "step":
                same_step.append(index)
        errors = dict(outcome.errors)
        if same_step:
            resets = await self._steps.exchange({index: reset_request({}) for index in same_step}, timeout)
            errors.update(resets.errors)
            for index, reset in resets.ready.items():
                final = results[index]
                results[index] = FinalStepResult(
                    reset.observation, final.reward, True, final.metadata, final_observation=final.observation
                )
                self._sessions[index].done = False
        failed: dict[int, Exception] = {}
        for index, error in sorted(errors.items()):
            kind, reset_arguments = kinds.get(index, ("reset", {}))[:2]
            if (
                self.on_error == "raise"
                or kind == "state"
                or isinstance(error, _CALLER_MISTAKES)
                or not isinstance(error, OpenEnvError)
            ):
                failed[index] = error
                continue
            # Replaced: a new session in its place, reset; a failure of the replacement is raised.
            try:
                await self._replace(index)
            except OpenEnvError as exc:
                failed[index] = exc
                continue
            replaced = await self._steps.exchange({index: reset_request(reset_arguments)}, timeout)
            if index in replaced.errors:
                failed[index] = replaced.errors[index]
                continue
            first = replaced.ready[index]
            self._sessions[index].fresh = False
            self._sessions[index].done = False
            results[index] = ReplacedStepResult(
                first.observation, first.reward, kind == "step" or first.done, first.metadata, error=error
            )
        if failed:
            first_error = failed[min(failed)]
            if not all(isinstance(error, OpenEnvError) for error in failed.values()):
                raise first_error  # a bug, not a session's failure: as it is
            raise EnvPoolError(failed) from first_error  # type: ignore[arg-type]
        return results


class SyncEnvPool(BlockingFacade, Generic[ActT, ObsT, StateT]):
    """The same pool, blocking: for training loops without async.

    Get one from `EnvPool.sync`. It runs the pool on an event loop in a
    background thread (the one `openenv.SyncEnvClient` shares), so it behaves
    exactly as the async pool does and raises the same exceptions. As with
    `openenv.SyncEnvClient`, Ctrl-C interrupts any call at once, and a pool never
    closed is closed when it is collected or at exit, with a `ResourceWarning`.
    Every method raises `ClientStateError` when called inside a running event
    loop: there, await the `EnvPool` itself.

    Examples:
        ```python
        from openenv import EnvPool
        from openenv.examples.echo import EchoEnv

        pool = EnvPool("ws://127.0.0.1:8000", size=3, client=EchoEnv).sync(backend="trio").connect()
        try:
            results = pool.reset()
            print(len(results), pool.size)  # 3 3
        finally:
            pool.close()
        ```

    Args:
        pool: The async pool to drive; it must not be open yet.
        backend: The event loop to run it on: ``"asyncio"`` (the default) or ``"trio"``.

    Attributes:
        pool: The async pool this facade drives.
        backend: The event loop it runs on.
    """

    def __init__(self, pool: EnvPool[ActT, ObsT, StateT], *, backend: str = "asyncio") -> None:
        self.pool = pool
        self.backend = backend
        self._holder = Holder("SyncEnvPool", "open")

    def __repr__(self) -> str:
        return f"<SyncEnvPool of {self.pool!r}>"

    @property
    def size(self) -> int:
        """The number of sessions."""
        return self.pool.size

    def connect(self) -> Self:
        """Open every session of the pool (see `EnvPool`); pair with `close` (or use ``with``).

        Returns:
            This facade.

        Raises:
            ConnectError: A session could not connect to any server.
            CapacityReachedError: Every server stayed at capacity.
            ClientStateError: Already open or closed, or called inside an event loop.
        """
        # Held open by one task of the loop thread, entered and left there, as the pool's task group needs.
        self._holder.open(self, self.pool, self.backend)
        return self

    def close(self) -> None:
        """Close every session and release the event-loop thread. Idempotent.

        Raises:
            ClientStateError: Called inside an event loop.
        """
        self._holder.close()

    def reset(
        self, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT, **kwargs: Any
    ) -> list[StepResult[ObsT]]:
        """Reset every session, blocking; see `EnvPool.reset`.

        Args:
            timeout: Seconds each session waits for its reply (``None``: no limit).
            **kwargs: Passed to every environment's ``reset``; a list gives one value per session.

        Returns:
            One result per session, in order.

        Raises:
            EnvPoolError: Sessions failed; its ``errors`` holds each one's exception.
            ValueError: A list argument does not hold one value per session.
            ClientStateError: Not open, or called inside an event loop.
        """
        portal = self._holder.portal("reset")
        return call(portal, lambda: self.pool.reset(timeout=timeout, **kwargs))

    def step(
        self, actions: Sequence[ActT], *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT
    ) -> list[StepResult[ObsT]]:
        """Step every session, blocking; see `EnvPool.step`.

        Args:
            actions: One action per session, in the pool's order.
            timeout: Seconds each session waits for its reply (``None``: no limit).

        Returns:
            One result per session, in order.

        Raises:
            EnvPoolError: Sessions failed; its ``errors`` holds each one's exception.
            TypeError: One action instead of a list of them.
            ValueError: Not one action per session.
            ClientStateError: Not open, or called inside an event loop.
        """
        portal = self._holder.portal("step")
        return call(portal, lambda: self.pool.step(actions, timeout=timeout))

    def state(self, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT) -> list[StateT]:
        """Ask every session for its state, blocking; see `EnvPool.state`.

        Args:
            timeout: Seconds each session waits for its reply (``None``: no limit).

        Returns:
            One state per session, in order.

        Raises:
            EnvPoolError: Sessions failed; its ``errors`` holds each one's exception.
            ClientStateError: Not open, or called inside an event loop.
        """
        portal = self._holder.portal("state")
        return call(portal, lambda: self.pool.state(timeout=timeout))
