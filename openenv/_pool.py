"""`EnvPool`: many environment sessions as one object, over any transport, stepped as a batch.

A pool step costs little more than its steps. It runs no task per session: for
each session it encodes and sends the request (frames to one server then leave
together, as one message on a shared connection), then collects the replies in
order; replies that came together are taken without waiting. Sessions whose
transports share a host that can step them together (in-process sessions of
one factory: `openenv._batch`) are stepped as one message each way instead.
One deadline bounds the whole call. The sessions' clients have no owner of their own: the
pool is their owner, and runs their transports' idle work (`openenv.Transport.keep`)
in its task group.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from operator import attrgetter, itemgetter
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, NoReturn, TypeVar

import anyio
import anyio.lowlevel
import msgspec
from anyio.abc import TaskGroup

from ._batch import BatchedReply, LinkStepBatcher, StepBatcher
from ._client import USE_CLIENT_DEFAULT, EnvClient, _UseClientDefault
from ._clock import EVENT_LOOP_CLOCK, Clock
from ._codec import ClientCodec
from ._exceptions import (
    CapacityReachedError,
    ClientStateError,
    ConnectError,
    ConnectionClosed,
    EncodingError,
    EnvPoolError,
    InvalidJSONError,
    OpenEnvError,
    ProtocolError,
    ReplyValidationError,
    TimeoutError,
    UnknownTypeError,
    UnsupportedSchemeError,
    ValidationError,
    server_error_from_frame,
)
from ._limits import DEFAULT_PLACEMENT_TIMEOUT
from ._messages import StateReply
from ._request_lock import RequestLock
from ._transport import Transport
from ._types import ActT, ObsT, StateT, StepResult

if TYPE_CHECKING:
    from typing import Self

    from ._sync_pool import SyncEnvPool

__all__ = ["AutoResetMode", "EnvPool", "FinalStepResult", "ReplacedStepResult"]

logger = logging.getLogger("openenv.client")

_R = TypeVar("_R")

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


class _Session(Generic[ActT, ObsT, StateT]):
    """One slot's live session: its client, its server, where its episode stands."""

    __slots__ = ("client", "done", "fresh", "keeper", "pending", "url")

    def __init__(self, url: str, client: EnvClient[ActT, ObsT, StateT]) -> None:
        self.url = url
        self.client = client
        self.keeper = anyio.CancelScope()  # the transport's idle work, run by the pool
        self.fresh = True  # no request has succeeded yet (a CAPACITY_REACHED refusal is still possible)
        self.done = False  # the last result ended an episode
        self.pending: _Pending | None = None  # a request sent by `EnvPool.send`, its reply not yet taken


class _Pending:
    """A request sent and not yet answered: how to read its reply, and what to make of it."""

    __slots__ = ("codec", "kind", "request_id", "reset_arguments", "transport")

    def __init__(
        self,
        kind: Literal["reset", "step", "state"],
        codec: ClientCodec[Any, Any, Any],
        transport: Transport,
        request_id: int,
        reset_arguments: dict[str, Any],
    ) -> None:
        self.kind = kind
        self.codec = codec
        self.transport = transport
        self.request_id = request_id
        self.reset_arguments = reset_arguments


# What a request of a batch is: its kind and the reset's arguments (what `EnvPool._settle` reads of
# it), its encoder, and what the encoder takes besides the codec and the request id (the step's
# action, stepped with others of its host as one message: `openenv._batch`; the reset's arguments).
# Module functions, not closures: a pool of thousands makes one request per session per step.
_Request = tuple[
    Literal["reset", "step", "state"],
    dict[str, Any],
    Callable[[ClientCodec[Any, Any, Any], Any, int], bytes],
    Any,
]


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
        self._sessions: list[_Session[ActT, ObsT, StateT]] = []
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
        opened: list[_Session[ActT, ObsT, StateT] | None] = [None] * self.size
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
            self._sessions = [session for session in opened if session is not None]
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
    async def _close_session(session: _Session[ActT, ObsT, StateT]) -> None:
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
        from ._sync_pool import SyncEnvPool

        return SyncEnvPool(self, backend=backend)

    # -- placement ---------------------------------------------------------------

    def _placement_deadline(self) -> float:
        return math.inf if self._placement_timeout is None else self._clock.now() + self._placement_timeout

    async def _open_session(self, deadline: float | None = None) -> _Session[ActT, ObsT, StateT]:
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
                session = _Session(url, self._client_factory(url, **self._client_options))
                try:
                    await session.client.connect()
                except ConnectError as exc:
                    self._live[url] -= 1
                    self._skip(url, exc)
                    continue
                except BaseException:
                    self._live[url] -= 1
                    raise
                self._keep(session)
                return session

    def _keep(self, session: _Session[ActT, ObsT, StateT]) -> None:
        """Run the session's transport's idle work in the pool's task group until the session closes."""
        owners, transport = self._owners, session.client.transport
        assert owners is not None
        assert transport is not None

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
        self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT, **kwargs: Any
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
        requests: dict[int, _Request] = {index: _reset(per_session[index]) for index in range(self.size)}
        return await self._run(requests, timeout)

    async def step(
        self, actions: Sequence[ActT], *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT
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
        else:  # every request a step: made without a call per session
            requests = dict(enumerate(zip(repeat("step"), repeat(_NO_ARGUMENTS), repeat(_encode_step), actions)))
        return await self._run(requests, timeout)

    async def state(self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT) -> list[StateT]:
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
        requests: dict[int, _Request] = dict.fromkeys(range(self.size), _STATE)
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
                await self._send(index, self._step_request(index, action))
            except OpenEnvError as exc:
                errors[index] = exc
        if errors:
            raise EnvPoolError(errors) from errors[min(errors)]

    async def recv(
        self,
        min_results: int | None = None,
        *,
        timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT,
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
        outcome = _Outcome()
        await self._sweep(list(pending), outcome)
        if len(outcome) < wanted:
            await self._wait_for_some(list(pending), wanted, outcome, self._deadline(timeout))
        if len(outcome) < wanted:
            missing = [index for index in pending if index not in outcome]
            for index in missing:
                outcome.errors[index] = TimeoutError(f"no result within {self._timeout_of(timeout)} s")
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

    def _step_request(self, index: int, action: ActT) -> _Request:
        if self.autoreset_mode == "next_step" and self._sessions[index].done:
            return _reset({})
        return ("step", _NO_ARGUMENTS, _encode_step, action)

    def _timeout_of(self, timeout: float | _UseClientDefault | None) -> float | None:
        if timeout is USE_CLIENT_DEFAULT:
            return self._sessions[0].client.timeout if self._sessions else None
        return timeout

    def _deadline(self, timeout: float | _UseClientDefault | None) -> float:
        seconds = self._timeout_of(timeout)
        return math.inf if seconds is None else self._clock.now() + seconds

    async def _run(self, requests: dict[int, _Request], timeout: float | _UseClientDefault | None) -> list[Any]:
        """Send every request, take every reply, apply the policies; one result per session, in order."""
        outcome = await self._exchange(requests, timeout)
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
            moved: dict[int, _Request] = {}
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
            outcome.update(await self._exchange(moved, timeout))
        results = await self._settle(requests, outcome, timeout)
        if len(results) == self.size:
            return list(map(results.__getitem__, range(self.size)))
        return [results[index] for index in range(self.size) if index in results]

    async def _exchange(self, requests: dict[int, _Request], timeout: float | _UseClientDefault | None) -> _Outcome:
        """Send every request, then take the replies in order; one deadline for them all.

        A session whose transport's `send` may wait on the server
        (`openenv.Transport.send_waits`) makes its request in a task of its own.
        """
        outcome = _Outcome()
        deadline = self._deadline(timeout)
        with self._clock.cancel_scope(deadline=deadline):
            alone = await self._step_together(requests, outcome)
            waiting = [index for index in alone if self._send_waits(index)]
            if waiting:
                async with anyio.create_task_group() as apart:
                    for index in waiting:
                        apart.start_soon(self._exchange_one, index, alone[index], outcome)
                    await self._exchange_together(alone, outcome, set(waiting))
            else:
                await self._exchange_together(alone, outcome, set())
        if len(outcome) < len(requests):
            # Time ran out: the replies that came meanwhile still count; the others are late.
            sent = [index for index in requests if index not in outcome]
            await self._sweep(sent, outcome)
            for index in sent:
                if index not in outcome:
                    outcome.errors[index] = TimeoutError(f"no reply within {self._timeout_of(timeout)} s")
                    self._abandon(index)
        return outcome

    async def _step_together(self, requests: dict[int, _Request], outcome: _Outcome) -> dict[int, _Request]:
        """Step the sessions that share a host as one message per host; the requests left to go on their own.

        A session joins its host's batch only while its client is free (the
        caller may use a pool's client directly): the pool takes the clients
        as it groups them, and holds them until every host's batch is over, as
        a request of their own would hold them.
        """
        hosts: dict[tuple[StepBatcher | LinkStepBatcher, ClientCodec[Any, Any, Any]], _Batch] = {}
        sessions = self._sessions
        batch = _Batch()  # the batch of the session before (mostly this one's): a first, empty one
        last_batcher: object = None
        last_codec: object = None
        try:
            for index, request in requests.items():
                if request[0] != "step":
                    continue
                client = sessions[index].client
                lock = client._lock
                # Not connected (a client has its transport and codec once it has its lock); or in use: the
                # caller uses the client directly right now.
                if lock is None or lock.held:
                    continue
                batcher = client._transport._step_batcher()  # type: ignore[union-attr]  # connected
                if batcher is None:
                    continue
                lock.held = True  # `RequestLock.acquire_nowait`, without its call: one per session
                codec: ClientCodec[Any, Any, Any] = client._codec  # type: ignore[assignment]  # connected
                if batcher is not last_batcher or codec is not last_codec:
                    found = hosts.get((batcher, codec))
                    batch = hosts[batcher, codec] = _Batch() if found is None else found
                    last_batcher, last_codec = batcher, codec
                batch.indices.append(index)
                batch.clients.append(client)
            alone = requests
            for (batcher, codec), batch in hosts.items():
                if len(batch.indices) > 1:
                    if isinstance(batcher, LinkStepBatcher):
                        answered = await self._step_linked(batcher, codec, batch, requests, outcome)
                    else:
                        answered = await self._step_batch(batcher, codec, batch, requests, outcome)
                    if len(answered) == len(alone):  # no session is in two batches: these were all that were left
                        alone = {}
                    elif answered:
                        if alone is requests:
                            alone = dict(requests)
                        for index in answered:
                            del alone[index]
            return alone
        finally:
            for held in hosts.values():
                RequestLock.release_all(map(_LOCK, held.clients))  # taken above

    async def _step_batch(
        self,
        batcher: StepBatcher,
        codec: ClientCodec[Any, Any, Any],
        batch: _Batch,
        requests: dict[int, _Request],
        outcome: _Outcome,
    ) -> list[int]:
        """Step one host's sessions as one message; the sessions answered."""
        indices, clients = batch.indices, batch.clients
        try:
            message = codec.step_batch(list(map(_PAYLOAD, map(requests.__getitem__, indices))))
        except (TypeError, msgspec.EncodeError):
            return []  # each request, on its own, says whose action cannot be encoded
        reply = await batcher.step(list(map(_TRANSPORT, clients)), message)
        if reply is None:
            return []
        try:
            replies, invalid = codec.decode_step_batch(reply)
        except ProtocolError as exc:
            for index in indices:
                outcome.errors[index] = exc
            return indices
        ready, errors, observations = outcome.ready, replies.errors, replies.observations
        if not errors and not invalid and len(observations) == len(indices):
            results = clients[0]._batch_results(observations)  # the clients of a batch share their types
            if results is not None:
                ready.update(zip(indices, results, strict=True))
                return indices
        answered: list[int] = []
        for position, observation in enumerate(observations[: len(indices)]):
            index = indices[position]
            if observation is not None:
                ready[index] = clients[position]._batch_result(observation)
            elif position in errors:
                outcome.errors[index] = server_error_from_frame(errors[position])
            elif position in invalid:
                outcome.errors[index] = invalid[position]
            else:
                continue  # not stepped: its request goes on its own
            answered.append(index)
        return answered

    async def _step_linked(
        self,
        batcher: LinkStepBatcher,
        codec: ClientCodec[Any, Any, Any],
        batch: _Batch,
        requests: dict[int, _Request],
        outcome: _Outcome,
    ) -> list[int]:
        """Step one link's sessions with one entry each way; the sessions answered.

        Each step is numbered as its session's own request would be: a reply
        that comes as a frame of its own (the server stepped it apart, or sent
        it again after a resumption) is taken as such, and a late one (of a
        call given up on) is dropped by its request id.
        """
        indices, clients = batch.indices, batch.clients
        request_ids = []
        for client in clients:
            client._next_id += 1
            request_ids.append(client._next_id)
        transports: list[Transport] = list(map(_TRANSPORT, clients))
        sent = 0
        # In parts, each leaving at once: the server steps the first while the pool encodes the next.
        while sent < len(indices):
            part = slice(sent, sent + LINK_BATCH)
            try:
                message = codec.step_batch(list(map(_PAYLOAD, map(requests.__getitem__, indices[part]))))
            except (TypeError, msgspec.EncodeError):
                break  # each request, on its own, says whose action cannot be encoded
            if not batcher.post(transports[part], message, request_ids[part]):
                break
            for client, request_id in zip(clients[part], request_ids[part], strict=True):
                client._unanswered.append(request_id)
            sent += len(request_ids[part])
        answered = indices[:sent]  # the rest go on their own
        # The replies that came batched, by the message they came in: each message is decoded once.
        batched: dict[int, tuple[bytes | msgspec.Raw, list[_Place]]] = {}
        last_message: object = None  # the message of the reply before, mostly this one's too
        places: list[_Place] = []  # its places
        ready, errors = outcome.ready, outcome.errors
        try:
            # Shortest first: the steps posted (``answered``) are the first of the others.
            for index, client, request_id, transport in zip(answered, clients, request_ids, transports, strict=False):
                try:
                    while True:
                        try:
                            reply = batcher.receive_nowait(transport)
                        except anyio.WouldBlock:
                            reply = await batcher.receive(transport)
                        if type(reply) is BatchedReply:
                            reply_id, unanswered = reply.request_id, client._unanswered
                            if unanswered and unanswered[0] == reply_id == request_id:
                                unanswered.popleft()  # `_owner_of`'s usual case, without its call: one per session
                            elif client._owner_of(reply_id) != request_id:
                                continue  # the reply of a batch given up on
                            if reply.message is not last_message:
                                last_message = reply.message
                                places = batched.setdefault(id(last_message), (last_message, []))[1]
                            places.append((reply.position, index, client))
                            break
                        answer = client._reply_in(codec, reply, request_id)  # type: ignore[arg-type]
                        if answer is not None:
                            ready[index] = client._step_result(answer)
                            break
                except OpenEnvError as exc:
                    errors[index] = exc
        finally:  # even when time ran out: the replies taken already count
            for message, places in batched.values():
                self._take_batched(codec, message, places, outcome)
        return answered

    def _take_batched(
        self,
        codec: ClientCodec[Any, Any, Any],
        message: bytes | msgspec.Raw,
        places: list[_Place],
        outcome: _Outcome,
    ) -> None:
        """Turn the replies of one batch's message into the results of the sessions at ``places``."""
        try:
            replies, invalid = codec.decode_step_batch(message)
        except ProtocolError as exc:
            for _, index, _ in places:
                outcome.errors[index] = exc
            return
        observations, errors = replies.observations, replies.errors
        if not errors and not invalid:
            try:
                taken = list(map(observations.__getitem__, map(_POSITION, places)))
            except IndexError:
                pass  # a place the message lacks: said below
            else:
                results = places[0][2]._batch_results(taken)  # the clients of a batch share their types
                if results is not None:
                    outcome.ready.update(zip(map(_INDEX, places), results, strict=True))
                    return
        for position, index, client in places:
            observation = observations[position] if position < len(observations) else None
            if observation is not None:
                outcome.ready[index] = client._batch_result(observation)
            elif position in errors:
                outcome.errors[index] = server_error_from_frame(errors[position])
            elif position in invalid:
                outcome.errors[index] = invalid[position]
            else:
                outcome.errors[index] = ProtocolError("the server sent no reply in its place of a batch")

    def _send_waits(self, index: int) -> bool:
        transport = self._sessions[index].client.transport
        return transport is None or transport.send_waits

    async def _exchange_together(self, requests: dict[int, _Request], outcome: _Outcome, apart: set[int]) -> None:
        """Send the requests of the sessions not in ``apart`` one after the other, then take their replies."""
        for index, request in requests.items():
            if index in apart:
                continue
            try:
                await self._send(index, request)
            except OpenEnvError as exc:
                outcome.errors[index] = exc
        errors = outcome.errors  # nothing is ready yet: the replies are taken here, in order
        for index in requests:
            if index not in apart and index not in errors:
                self._take(index, await self._reply(index), outcome)

    async def _exchange_one(self, index: int, request: _Request, outcome: _Outcome) -> None:
        """One session's request and reply, in a task of its own."""
        try:
            await self._send(index, request)
        except OpenEnvError as exc:
            outcome.errors[index] = exc
            return
        self._take(index, await self._reply(index), outcome)

    async def _send(self, index: int, request: _Request) -> None:
        """Send one session's request (it leaves with the others to its server); note it as pending."""
        kind, reset_arguments, encode, payload = request
        client = self._sessions[index].client
        lock = client._lock
        if lock is None:
            raise ClientStateError("the client is not connected")
        try:
            lock.acquire_nowait()  # free, unless the caller uses the client directly right now
        except anyio.WouldBlock:
            await lock.acquire()
        try:
            codec, transport, frame, request_id = client._prepare(encode, payload=payload)
            try:
                transport.send_nowait(frame)  # queued: it leaves with the others' frames
            except anyio.WouldBlock:
                await client._send_request(codec, transport, frame, request_id)
            except ConnectionClosed as exc:  # the server said why first, perhaps (CAPACITY_REACHED)
                await client._raise_parting_error(codec, transport, exc)
            else:
                client._unanswered.append(request_id)
        except BaseException:
            lock.release()
            raise
        self._sessions[index].pending = _Pending(kind, codec, transport, request_id, reset_arguments)

    async def _reply(self, index: int) -> Any:
        """Wait for one session's reply (taken at once if it came already); its error as a value."""
        session = self._sessions[index]
        pending = session.pending
        assert pending is not None
        client, transport = session.client, pending.transport
        try:
            while True:
                try:
                    frame = transport.receive_nowait()
                except anyio.WouldBlock:
                    frame = await transport.receive()
                reply = client._reply_in(pending.codec, frame, pending.request_id)
                if reply is not None:
                    return reply
        except OpenEnvError as exc:
            return exc

    def _take(self, index: int, reply: Any, outcome: _Outcome) -> None:
        """Turn a session's reply into its result (or error), and let its client go."""
        session = self._sessions[index]
        pending = session.pending
        if pending is None:
            return
        self._abandon(index)
        if isinstance(reply, Exception):
            outcome.errors[index] = reply
            return
        try:
            if pending.kind == "state":
                if not isinstance(reply, StateReply):
                    raise ProtocolError(f"expected a state reply, got {type(reply).__name__}")
                outcome.ready[index] = reply.data
            else:
                outcome.ready[index] = session.client._step_result(reply)
        except OpenEnvError as exc:
            outcome.errors[index] = exc

    async def _sweep(self, indices: Sequence[int], outcome: _Outcome) -> None:
        """Take the replies already there, without waiting for any."""
        with anyio.CancelScope() as nothing_more:
            nothing_more.cancel()  # a transport without receive_nowait is asked once, and waits for nothing
            for index in indices:
                session = self._sessions[index]
                pending = session.pending
                if index in outcome or pending is None:
                    continue
                try:
                    reply = await self._reply(index)
                except anyio.get_cancelled_exc_class():
                    continue
                self._take(index, reply, outcome)

    def _abandon(self, index: int) -> None:
        """Stop waiting for a session's reply (a late one is dropped when it comes); let its client go."""
        session = self._sessions[index]
        if session.pending is not None:
            session.pending = None
            lock = session.client._lock
            assert lock is not None
            lock.release()

    async def _wait_for_some(self, indices: Sequence[int], wanted: int, outcome: _Outcome, deadline: float) -> None:
        """Wait until ``wanted`` of the sessions have answered (a task per session still thinking)."""
        enough = anyio.Event()
        with self._clock.cancel_scope(deadline=deadline):
            async with anyio.create_task_group() as waiting:

                async def wait_one(index: int) -> None:
                    reply = await self._reply(index)
                    self._take(index, reply, outcome)
                    if len(outcome) >= wanted:
                        enough.set()

                for index in indices:
                    if index not in outcome:
                        waiting.start_soon(wait_one, index)
                await enough.wait()
                waiting.cancel_scope.cancel()

    async def _settle(
        self,
        kinds: Mapping[int, _Request | tuple[str, dict[str, Any]]],
        outcome: _Outcome,
        timeout: float | _UseClientDefault | None,
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
            resets = await self._exchange({index: _reset({}) for index in same_step}, timeout)
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
            replaced = await self._exchange({index: _reset(reset_arguments)}, timeout)
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


class _Batch:
    """The sessions of one host whose steps go together: their indices in the pool, and their clients (held)."""

    __slots__ = ("clients", "indices")

    def __init__(self) -> None:
        self.indices: list[int] = []
        self.clients: list[EnvClient[Any, Any, Any]] = []


class _Outcome:
    """What came of a batch: each session's result, or its error."""

    __slots__ = ("errors", "ready")

    def __init__(self) -> None:
        self.ready: dict[int, Any] = {}
        self.errors: dict[int, Exception] = {}

    def __len__(self) -> int:
        return len(self.ready) + len(self.errors)

    def __contains__(self, index: object) -> bool:
        return index in self.ready or index in self.errors

    def update(self, other: _Outcome) -> None:
        self.ready.update(other.ready)
        self.errors.update(other.errors)


LINK_BATCH = 128
"""The most steps a pool sends in one entry on a link; a bigger batch leaves in parts, one after the other."""

_Place = tuple[int, int, EnvClient[Any, Any, Any]]
"""Where a session's reply sits in a batch's message: its position there, the session's index, its client."""
_POSITION, _INDEX = itemgetter(0), itemgetter(1)
_PAYLOAD = itemgetter(3)  # a request's action (or reset arguments)
_TRANSPORT = attrgetter("_transport")  # a client's
_LOCK = attrgetter("_lock")  # a client's

_NO_ARGUMENTS: dict[str, Any] = {}  # a step's reset arguments: shared, so never changed


def _encode_step(codec: ClientCodec[Any, Any, Any], action: Any, request_id: int) -> bytes:
    return codec.step(action, request_id)


def _encode_reset(codec: ClientCodec[Any, Any, Any], arguments: dict[str, Any], request_id: int) -> bytes:
    return codec.reset(arguments, request_id)


def _encode_state(codec: ClientCodec[Any, Any, Any], _: None, request_id: int) -> bytes:
    return codec.state(request_id)


def _reset(arguments: dict[str, Any]) -> _Request:
    return ("reset", arguments, _encode_reset, arguments)


_STATE: _Request = ("state", _NO_ARGUMENTS, _encode_state, None)
