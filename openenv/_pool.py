"""`EnvPool`: many environment sessions as one object, over any transport.

Each session is an `EnvClient` owned by a task of the pool's own task group: that
task enters the client and, when the session ends, exits it. A transport may run
background tasks in a task group it opens on entry, and anyio requires such a
group to be left by the task that entered it; so no client is ever entered by
one task and closed by another, whatever the transport. Requests are made from
any task (a client serialises them itself): one call of the pool runs every
session's request concurrently in a short-lived task group.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, NoReturn, TypeVar

import anyio
import msgspec
from anyio.abc import TaskGroup, TaskStatus

from ._client import USE_CLIENT_DEFAULT, EnvClient, _UseClientDefault
from ._exceptions import (
    CapacityReachedError,
    ClientStateError,
    ConnectError,
    EncodingError,
    EnvPoolError,
    InvalidJSONError,
    OpenEnvError,
    ReplyValidationError,
    UnknownTypeError,
    UnsupportedSchemeError,
    ValidationError,
)
from ._limits import DEFAULT_PLACEMENT_TIMEOUT
from ._types import ActT, ObsT, StateT, StepResult

if TYPE_CHECKING:
    from typing import Self

    from ._sync_pool import SyncEnvPool

__all__ = ["EnvPool", "ReplacedStepResult"]

_R = TypeVar("_R")

OnError = Literal["raise", "replace"]

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


class _Session(Generic[ActT, ObsT, StateT]):
    """One slot's live session: its client, its server, and the events of its owner task."""

    __slots__ = ("client", "closed", "done", "fresh", "release", "url")

    def __init__(self, url: str, client: EnvClient[ActT, ObsT, StateT]) -> None:
        self.url = url
        self.client = client
        self.release = anyio.Event()  # set to make the owner task close the client
        self.closed = anyio.Event()  # set by the owner task once the client is closed
        self.fresh = True  # no request has succeeded yet (a CAPACITY_REACHED refusal is still possible)
        self.done = False  # the last result ended an episode


class EnvPool(Generic[ActT, ObsT, StateT]):
    """Many sessions of one environment as one object: reset and step them all at once.

    Every call runs each session's request concurrently and returns one result per
    session, in the pool's order. Sessions are spread evenly over the URLs given;
    a server that refuses a session (``CAPACITY_REACHED``, or refusing the
    connection) is skipped for ``retry_interval`` seconds and the session is
    opened on another, or on the same one once it has room again. The pool works
    over every transport (``ws://``, ``http+poll://``, ``inproc://``, ``ray://``,
    ...) and under asyncio and trio.

    Enter and leave it in one task (``async with``), as any anyio task group; its
    methods may be called from any task. `sync` gives a blocking facade.

    When a session fails:

    - ``on_error="raise"`` (the default): the call waits for every session's
      request, then raises `EnvPoolError`, whose ``errors`` maps each failed index
      to its exception. Sessions whose error is not fatal go on.
    - ``on_error="replace"``: the failed session is closed, a new one is opened
      and reset in its place, and the result at that index is a
      `ReplacedStepResult` carrying the ``error``. A caller's mistake (an invalid
      action: `ValidationError`, `EncodingError`, ...) and a replacement that
      fails too are raised as with ``"raise"``.

    Episodes: by default a session whose episode is done is stepped on like any
    other (the environment decides what that means); call `reset` when you want.
    With ``auto_reset=True``, the pool resets a session on the first `step` after
    its episode ended, instead of stepping it, and returns that reset's result at
    its index (the action given for it is ignored), as Gymnasium's vector
    environments do by default; the reset takes no arguments.

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
        auto_reset: Reset a session at the next `step` after its episode is done.
        max_connecting: The most sessions being opened at once.
        retry_interval: Seconds a server that refused a session is skipped for
            before it is tried again.
        placement_timeout: Seconds to keep trying to open one session while every
            server refuses (``None``: no limit).
        **client_options: Passed to every client (``timeout``, transport options).

    Attributes:
        urls: The servers' URLs.
        size: The number of sessions.
        on_error: The failure policy.
        auto_reset: Whether sessions are reset after their episode ends.

    Raises:
        ValueError: No URL, a ``size`` below 1, or an unknown ``on_error``.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        size: int,
        client: Callable[..., EnvClient[ActT, ObsT, StateT]] = EnvClient,
        on_error: OnError = "raise",
        auto_reset: bool = False,
        max_connecting: int = 64,
        retry_interval: float = 1.0,
        placement_timeout: float | None = DEFAULT_PLACEMENT_TIMEOUT,
        **client_options: Any,
    ) -> None:
        self.urls: tuple[str, ...] = (urls,) if isinstance(urls, str) else tuple(urls)
        if not self.urls:
            raise ValueError("EnvPool needs at least one URL")
        if size < 1:
            raise ValueError(f"an EnvPool holds at least one session, not size={size}")
        if on_error not in ("raise", "replace"):
            raise ValueError(f"on_error must be 'raise' or 'replace', not {on_error!r}")
        if max_connecting < 1:
            raise ValueError(f"max_connecting must be at least 1, not {max_connecting}")
        self.size = size
        self.on_error: OnError = on_error
        self.auto_reset = auto_reset
        self._client_factory = client
        self._client_options = client_options
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
        for session in self._sessions:
            session.release.set()
        # The owner tasks never raise: the block's own exception (if any) goes on as itself,
        # not wrapped in an exception group by the task group.
        await owners.__aexit__(None, None, None)

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
        return math.inf if self._placement_timeout is None else anyio.current_time() + self._placement_timeout

    async def _open_session(self, deadline: float | None = None) -> _Session[ActT, ObsT, StateT]:
        """Open one session on the least-loaded server that is not being skipped, until ``deadline``."""
        assert self._connecting is not None
        if deadline is None:
            deadline = self._placement_deadline()
        async with self._connecting:
            while True:
                now = anyio.current_time()
                candidates = [url for url in self.urls if self._avoid_until[url] <= now]
                if not candidates:
                    await self._wait_for_a_server(now, deadline)
                    continue
                url = min(candidates, key=self._live.__getitem__)
                self._live[url] += 1
                session = _Session(url, self._client_factory(url, **self._client_options))
                try:
                    await self._start_owner(session)
                except ConnectError as exc:
                    self._live[url] -= 1
                    self._skip(url, exc)
                    continue
                except BaseException:
                    self._live[url] -= 1
                    raise
                return session

    def _skip(self, url: str, refusal: OpenEnvError) -> None:
        self._avoid_until[url] = anyio.current_time() + self._retry_interval
        self._refusal[url] = refusal

    async def _wait_for_a_server(self, now: float, deadline: float) -> None:
        # A server that refused the connection itself is not waited for: say so now.
        if all(isinstance(self._refusal.get(url), ConnectError) for url in self.urls):
            raise self._refusal[self.urls[0]]
        retry_at = min(self._avoid_until.values())
        if retry_at > deadline:
            self._raise_full()
        await anyio.sleep(retry_at - now)

    def _raise_full(self) -> NoReturn:
        refusal = next(error for error in self._refusal.values() if isinstance(error, CapacityReachedError))
        raise CapacityReachedError(
            f"every server stayed at capacity for {self._placement_timeout} s ({refusal.message})",
            data=refusal.data,
        ) from refusal

    async def _start_owner(self, session: _Session[ActT, ObsT, StateT]) -> None:
        assert self._owners is not None
        await self._owners.start(self._own, session)

    @staticmethod
    async def _own(session: _Session[ActT, ObsT, StateT], *, task_status: TaskStatus[None]) -> None:
        """Enter the session's client, hold it until released, and close it: all in this one task."""
        try:
            await session.client.__aenter__()
            task_status.started()
            await session.release.wait()
            # A close that fails must not take the pool's other sessions down with it.
            with contextlib.suppress(Exception):
                await session.client.__aexit__(None, None, None)
        finally:
            session.closed.set()

    async def _replace(self, index: int, deadline: float | None = None) -> None:
        old = self._sessions[index]
        old.release.set()
        await old.closed.wait()
        self._live[old.url] -= 1
        self._sessions[index] = await self._open_session(deadline)

    # -- requests ------------------------------------------------------------------

    async def reset(
        self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT, **kwargs: Any
    ) -> list[StepResult[ObsT]]:
        """Start a new episode in every session, concurrently.

        Args:
            timeout: Seconds each session waits for its reply, instead of its
                client's timeout (``None``: no limit).
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

        def request(index: int) -> Callable[[], Awaitable[StepResult[ObsT]]]:
            arguments = per_session[index]
            return lambda: self._call(
                index, lambda client: client.reset(timeout=timeout, **arguments), timeout, arguments, cuts_episode=False
            )

        return await self._gather([request(index) for index in range(self.size)])

    async def step(
        self, actions: Sequence[ActT], *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT
    ) -> list[StepResult[ObsT]]:
        """Take one step in every session, concurrently: ``actions[i]`` in session ``i``.

        Args:
            actions: One action per session, in the pool's order.
            timeout: Seconds each session waits for its reply, instead of its
                client's timeout (``None``: no limit).

        Returns:
            One result per session, in order. With ``auto_reset``, a session whose
            episode had ended is reset instead, and its result is that reset's.
            Where a session was replaced, a `ReplacedStepResult`.

        Raises:
            EnvPoolError: Sessions failed (see the failure policy); its ``errors``
                holds each one's exception.
            TypeError: One action instead of a list of them.
            ValueError: Not one action per session.
            ClientStateError: The pool is not open.
        """
        self._check_open()
        if isinstance(actions, (Mapping, str, bytes, msgspec.Struct)) or not hasattr(actions, "__len__"):
            raise TypeError(
                f"step takes a list of actions, one per session ({self.size}), not one {type(actions).__name__}: "
                f"for the same action in every session, step([action] * pool.size)"
            )
        if len(actions) != self.size:
            raise ValueError(f"step needs one action per session: {self.size}, not {len(actions)}")

        def request(index: int, action: ActT) -> Callable[[], Awaitable[StepResult[ObsT]]]:
            if self.auto_reset and self._sessions[index].done:
                return lambda: self._call(
                    index, lambda client: client.reset(timeout=timeout), timeout, {}, cuts_episode=False
                )
            return lambda: self._call(
                index, lambda client: client.step(action, timeout=timeout), timeout, {}, cuts_episode=True
            )

        return await self._gather([request(index, action) for index, action in enumerate(actions)])

    async def state(self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT) -> list[StateT]:
        """Ask every session for its environment's state, concurrently.

        A failure is raised, never replaced: a state is no episode to restart.

        Args:
            timeout: Seconds each session waits for its reply (``None``: no limit).

        Returns:
            One state per session, in order.

        Raises:
            EnvPoolError: Sessions failed; its ``errors`` holds each one's exception.
            ClientStateError: The pool is not open.
        """
        self._check_open()

        def request(index: int) -> Callable[[], Awaitable[StateT]]:
            return lambda: self._request(index, lambda client: client.state(timeout=timeout))

        return await self._gather([request(index) for index in range(self.size)])

    def _check_open(self) -> None:
        if self._owners is None:
            raise ClientStateError(
                "the EnvPool is closed" if self._closed else "the EnvPool is not open: use `async with EnvPool(...)`"
            )

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

    async def _gather(self, requests: list[Callable[[], Awaitable[_R]]]) -> list[_R]:
        results: list[Any] = [None] * len(requests)
        errors: dict[int, Exception] = {}

        async def run(index: int) -> None:
            try:
                results[index] = await requests[index]()
            except Exception as exc:
                errors[index] = exc

        async with anyio.create_task_group() as group:
            for index in range(len(requests)):
                group.start_soon(run, index)
        if errors:
            first = errors[min(errors)]
            if not all(isinstance(error, OpenEnvError) for error in errors.values()):
                raise first  # a bug, not a session's failure: as it is
            raise EnvPoolError(errors) from first  # type: ignore[arg-type]
        return results

    async def _request(self, index: int, request: Callable[[EnvClient[ActT, ObsT, StateT]], Awaitable[_R]]) -> _R:
        """Make one session's request; a new session its server refused is moved to another server."""
        deadline: float | None = None
        while True:
            session = self._sessions[index]
            try:
                result = await request(session.client)
            except CapacityReachedError as exc:
                if not session.fresh:
                    raise
                # Servers report being full at a session's first request: try another one.
                self._skip(session.url, exc)
                if deadline is None:
                    deadline = self._placement_deadline()
                elif anyio.current_time() >= deadline:
                    self._raise_full()
                await self._replace(index, deadline)
                continue
            session.fresh = False
            return result

    async def _call(
        self,
        index: int,
        request: Callable[[EnvClient[ActT, ObsT, StateT]], Awaitable[StepResult[ObsT]]],
        timeout: float | _UseClientDefault | None,
        reset_arguments: dict[str, Any],
        *,
        cuts_episode: bool,
    ) -> StepResult[ObsT]:
        """Make one session's reset or step, and apply the failure policy."""
        try:
            result = await self._request(index, request)
        except OpenEnvError as exc:
            if self.on_error == "raise" or isinstance(exc, _CALLER_MISTAKES):
                raise
            await self._replace(index)
            # A replacement that fails too is raised: the failure is then not the session's.
            first = await self._request(index, lambda client: client.reset(timeout=timeout, **reset_arguments))
            self._sessions[index].done = False
            return ReplacedStepResult(first.observation, first.reward, cuts_episode or first.done, error=exc)
        self._sessions[index].done = result.done
        return result
