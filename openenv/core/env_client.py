"""Upstream OpenEnv's ``openenv.core.env_client``: the `EnvClient` an environment package's client subclasses.

A subclass writes three hooks, as for upstream: `EnvClient._step_payload` (an action to
the step's data), `EnvClient._parse_result` (a reply's data to a `StepResult`) and
`EnvClient._parse_state`. Underneath, every call goes through openenv's own client
(`openenv.EnvClient`, untyped): a ``http://`` or ``ws://`` URL rides openenv's WebSocket
transport, sharing one connection with the process's other sessions to the same
server where the server offers it, and any other URL scheme of openenv's works too
(``http+poll://``, ``inproc://``).

As upstream 0.10's, each call returns an awaitable inside a running event loop and a
result in plain code, and a client keeps to the way it was first used: sync or async.
In plain code, the session lives on an event loop in a daemon thread
(`openenv.SyncEnvClient`'s): Ctrl-C interrupts a call, and a client left open never
keeps the process alive.
"""

from __future__ import annotations

import inspect
import os
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import openenv
from openenv._blocking import Holder, call, in_event_loop
from openenv._client import requests_of
from openenv._lane import BLOCKING_CALLERS, LaneCalls
from openenv._limits import USE_CLIENT_DEFAULT
from openenv._messages import StateReply
from openenv._requests import Encoder, encode_reset, encode_state, encode_step
from openenv.core.client_types import StepResult

__all__ = ["EnvClient", "SyncEnvClient"]

ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")
StateT = TypeVar("StateT")
T = TypeVar("T")

CLIENT_MODE_ENV = "OPENENV_CLIENT_MODE"
"""The environment variable upstream's clients read their mode from (``simulation`` or ``production``)."""

_MODES = ("simulation", "production")
_BACKEND = "asyncio"  # the loop a client used from plain code runs on, as upstream's


def _mode_of(mode: str | None) -> str:
    chosen = (mode if mode is not None else os.environ.get(CLIENT_MODE_ENV, "simulation")).lower()
    if chosen not in _MODES:
        raise ValueError(f"Invalid mode: {chosen!r}. Must be one of: {list(_MODES)}")
    return chosen


def _payload(result: openenv.StepResult[Any]) -> dict[str, Any]:
    """A reply's data, as upstream's client hands it to ``_parse_result``: metadata only when the server sent some."""
    payload: dict[str, Any] = {"observation": result.observation, "reward": result.reward, "done": result.done}
    if result.metadata:
        payload["metadata"] = result.metadata
    return payload


_ENCODERS: dict[str, Encoder] = {"reset": encode_reset, "step": encode_step, "state": encode_state}

# What a request from plain code goes through; replaced (by a subclass, or a test faking the server), the
# request takes that way, on the loop thread, rather than the lane.
_EXCHANGE = ("_send_and_receive", "_reset_async", "_step_async", "_state_async")


def _exchanges_as_upstream(client: EnvClient[Any, Any, Any]) -> bool:
    """Whether ``client``'s requests go as this module sends them (nothing replaced on its class or itself)."""
    own = vars(client)
    return all(name not in own and getattr(type(client), name) is getattr(EnvClient, name) for name in _EXCHANGE)


def _as_upstream_error(exc: openenv.ServerError) -> RuntimeError:
    """An error reply as upstream's client raises it: a `RuntimeError` (the typed error is its cause)."""
    return RuntimeError(f"Server error: {exc.message} (code: {exc.code})")


class EnvClient(ABC, Generic[ActT, ObsT, StateT]):
    """The base class of an environment's client, as upstream OpenEnv 0.10 defines it.

    Examples:
        An environment package's client, unchanged:

        ```python
        from openenv.core.client_types import StepResult
        from openenv.core.env_client import EnvClient

        class GridClient(EnvClient[GridAction, GridObservation, GridState]):
            def _step_payload(self, action):
                return action.model_dump()

            def _parse_result(self, payload):
                observation = GridObservation(**payload["observation"])
                return StepResult(observation=observation, reward=payload.get("reward"), done=payload["done"])

            def _parse_state(self, payload):
                return GridState(**payload)

        with GridClient(base_url="http://127.0.0.1:8000").sync() as env:
            env.reset()
            env.step(GridAction(direction="up"))
        ```

    Args:
        base_url: The server's URL: ``http(s)://`` or ``ws(s)://`` as upstream's,
            or any URL scheme of openenv's.
        connect_timeout_s: Seconds allowed to connect.
        message_timeout_s: Seconds to wait for each reply.
        max_message_size_mb: The largest reply taken, in MiB.
        websocket_ping_interval_s: Seconds between keepalive pings (``None``: none).
        websocket_ping_timeout_s: Seconds to wait for a ping's answer (``None``: forever).
        provider: Upstream's container or runtime provider: not offered yet (start
            the container and pass its URL).
        mode: ``"simulation"`` (the default, or ``OPENENV_CLIENT_MODE``) or ``"production"``.
        headers: More HTTP headers for the connection (``Authorization``, say).

    Raises:
        ValueError: Neither ``base_url`` nor ``provider``, or an unknown mode.
        TypeError: A ``provider``.
    """

    _mode: str  # set once, in __init__

    def __init__(
        self,
        base_url: str | None = None,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
        max_message_size_mb: float = 100.0,
        websocket_ping_interval_s: float | None = 20.0,
        websocket_ping_timeout_s: float | None = 20.0,
        provider: Any = None,
        mode: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if base_url is None and provider is None:
            raise ValueError("EnvClient requires either base_url or provider.")
        if provider is not None:
            raise TypeError(
                "openenv-anyio's EnvClient takes no provider yet: start the container or runtime yourself "
                "and pass its URL as base_url"
            )
        object.__setattr__(self, "_mode", _mode_of(mode))
        self._base_url: str | None = None if base_url is None else base_url.rstrip("/")
        self._connect_timeout = connect_timeout_s
        self._message_timeout = message_timeout_s
        self._max_message_size = int(max_message_size_mb * 1024 * 1024)
        self._websocket_ping_interval_s = websocket_ping_interval_s
        self._websocket_ping_timeout_s = websocket_ping_timeout_s
        self._headers = headers
        self._execution_mode: str | None = None
        self._connection = _Connection()
        self._holder: Holder | None = None  # the session's loop thread, in plain code
        self._lane_calls = LaneCalls()  # plain code's requests made in the calling thread, where they can be
        self._sync_client: SyncEnvClient[ActT, ObsT, StateT] | None = None
        self._child_clients: list[EnvClient[Any, Any, Any]] = []

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_mode" and hasattr(self, "_mode"):
            raise AttributeError("Cannot modify mode after initialization")
        super().__setattr__(name, value)

    @property
    def base_url(self) -> str | None:
        """The server's URL, without a trailing slash."""
        return self._base_url

    # -- the hooks a subclass writes --------------------------------------------------

    @abstractmethod
    def _step_payload(self, action: ActT) -> dict[str, Any]:
        """The data of a step request, for an action."""

    @abstractmethod
    def _parse_result(self, payload: dict[str, Any]) -> StepResult[ObsT]:
        """The result of a reset or step, from its reply's data (``observation``, ``reward``, ``done``)."""

    @abstractmethod
    def _parse_state(self, payload: dict[str, Any]) -> StateT:
        """The state, from its reply's data."""

    # -- sync or async ----------------------------------------------------------------

    def _claim_execution_mode(self, mode: str) -> None:
        """Keep the client to the way it was first used."""
        if self._execution_mode is None:
            self._execution_mode = mode
        elif self._execution_mode != mode:
            raise RuntimeError(
                f"EnvClient is already being used in {self._execution_mode} mode. "
                "Create a separate client instance when mixing sync and async code."
            )

    def _run_sync(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run one of the client's coroutines to its end from plain code, on the session's loop thread."""
        self._claim_execution_mode("sync")
        if self._holder is None:
            self._holder = Holder(type(self).__name__, "connected")
            self._holder.open(self, self._connection, _BACKEND)
        calls = self._lane_calls

        async def blocking_caller() -> T:
            BLOCKING_CALLERS.set(True)  # this task's context: a connection it opens may be lent to plain code
            return await work()

        return call(self._holder.portal("call"), lambda: calls.through_the_loop(blocking_caller))

    def _on_lane(self, kind: str, data: Any) -> dict[str, Any] | None:
        """``reset``, ``step`` or ``state`` from plain code, in the calling thread (see `openenv._lane`).

        Returns:
            The reply as `_send_and_receive` returns it; ``None`` when the call
            must go through the loop thread: not connected yet, a connection
            with no lane, or a class (or a test) that replaces how requests go.
        """
        native, calls, holder = self._connection.native, self._lane_calls, self._holder
        if native is None or calls.lane is None or holder is None or not _exchanges_as_upstream(self):
            return None
        requests = requests_of(native)
        if requests is None:
            return None
        self._claim_execution_mode("sync")
        encode: Encoder = _ENCODERS[kind]
        payload = None if kind == "state" else data
        portal = holder.portal(kind)
        try:
            reply = calls.make(
                lambda work: call(portal, work), requests, encode, payload, USE_CLIENT_DEFAULT, native.timeout
            )
        except openenv.ServerError as exc:
            raise _as_upstream_error(exc) from exc
        if kind == "state":
            if not isinstance(reply, StateReply):
                raise openenv.ProtocolError(f"expected a state reply, got {type(reply).__name__}")
            return {"type": "state", "data": reply.data}
        return {"type": "observation", "data": _payload(requests.results.of_reply(reply))}

    def _dispatch(self, work: Callable[[], Awaitable[T]]) -> Any:
        """An awaitable in async code, the result in plain code."""
        if not in_event_loop():
            return self._run_sync(work)
        self._claim_execution_mode("async")
        return work()

    # -- the calls ----------------------------------------------------------------------

    def connect(self) -> Any:
        """Connect to the server (an awaitable in async code); the client itself."""
        return self._dispatch(self._connect_async)

    def disconnect(self) -> Any:
        """Close the connection (an awaitable in async code)."""
        return self._dispatch(self._close_async)

    def reset(self, **kwargs: Any) -> Any:
        """Start an episode; its `StepResult` (an awaitable of it in async code).

        Args:
            **kwargs: The environment's ``reset`` keywords (``seed``, ``episode_id``, ...).
        """
        if not in_event_loop():
            response = self._on_lane("reset", kwargs)
            if response is not None:
                return self._parse_result(response.get("data", {}))
        return self._dispatch(lambda: self._reset_async(**kwargs))

    def step(self, action: ActT, **kwargs: Any) -> Any:
        """Take one action; its `StepResult` (an awaitable of it in async code).

        Args:
            action: The action, made into the step's data by `_step_payload`.
            **kwargs: Ignored, as upstream's client ignores them.
        """
        if not in_event_loop():
            response = self._on_lane("step", self._step_payload(action))
            if response is not None:
                return self._parse_result(response.get("data", {}))
        return self._dispatch(lambda: self._step_async(action, **kwargs))

    def state(self) -> Any:
        """The environment's state (an awaitable of it in async code)."""
        if not in_event_loop():
            response = self._on_lane("state", None)
            if response is not None:
                return self._parse_state(response.get("data", {}))
        return self._dispatch(self._state_async)

    def close(self) -> Any:
        """Close the client and the sessions `new_session` made (an awaitable in async code)."""
        if in_event_loop() or self._holder is None:
            return self._dispatch(self._close_async)
        holder, self._holder = self._holder, None
        try:
            for child in self._child_clients:
                child.close()
            self._child_clients.clear()
        finally:
            holder.close()  # closes the native client on its loop thread
        return None

    def sync(self) -> SyncEnvClient[ActT, ObsT, StateT]:
        """A blocking view of this client (upstream's ``SyncEnvClient``)."""
        if self._sync_client is None:
            self._sync_client = SyncEnvClient(self)
        return self._sync_client

    async def new_session(self) -> EnvClient[Any, Any, Any]:
        """Another session on the same server, with this client's options; closed with this client.

        Returns:
            The new client, connected.
        """
        client = self._session_client()
        await client.connect()
        self._child_clients.append(client)
        return client

    def _session_client(self) -> EnvClient[Any, Any, Any]:
        """A new client of this class with this one's options, as its constructor takes them."""
        parameters = inspect.signature(type(self)).parameters
        takes_any = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values())
        options: dict[str, Any] = {
            "base_url": self._base_url,
            "connect_timeout_s": self._connect_timeout,
            "message_timeout_s": self._message_timeout,
            "max_message_size_mb": self._max_message_size / (1024 * 1024),
            "websocket_ping_interval_s": self._websocket_ping_interval_s,
            "websocket_ping_timeout_s": self._websocket_ping_timeout_s,
            "mode": self._mode,
            "headers": self._headers,
        }
        return type(self)(**{name: value for name, value in options.items() if takes_any or name in parameters})

    # -- the coroutines behind the calls ------------------------------------------------

    def _native_client(self) -> openenv.EnvClient[Any, Any, Any]:
        assert self._base_url is not None
        options: dict[str, Any] = {"timeout": self._message_timeout, "mode": self._mode}
        scheme = self._base_url.split(":", 1)[0]
        if scheme in ("http", "https", "ws", "wss"):  # upstream's URLs: its options, on openenv's WebSocket
            options.update(
                connect_timeout=self._connect_timeout,
                max_message_size=self._max_message_size,
                ping_interval=self._websocket_ping_interval_s,
                ping_timeout=self._websocket_ping_timeout_s,
                headers=self._headers,
            )
        elif scheme in ("http+poll", "https+poll"):
            options.update(connect_timeout=self._connect_timeout, headers=self._headers)
        return openenv.EnvClient(self._base_url, **options)

    async def _connect_async(self) -> Self:
        if self._connection.native is None:
            native = self._native_client()
            try:
                await native.connect()
            except openenv.ConnectError as exc:
                # Upstream's client raises the builtin ConnectionError; code written for it catches that.
                raise ConnectionError(f"Failed to connect to {self._base_url}: {exc}") from exc
            self._connection.native = native
            if BLOCKING_CALLERS.get():  # opened from plain code: its reset, step and state may skip the loop thread
                self._lane_calls.attach(native.transport)
        return self

    async def _connected(self) -> openenv.EnvClient[Any, Any, Any]:
        if self._connection.native is None:
            await self._connect_async()
        assert self._connection.native is not None
        return self._connection.native

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        """One request and its reply, as upstream's client exchanges them (its tests patch this to fake a server).

        Args:
            message: ``{"type": "reset" | "step" | "state", "data": ...}``.

        Returns:
            The reply: ``{"type": "observation" | "state", "data": ...}``.

        Raises:
            RuntimeError: An error reply (``Server error: ... (code: ...)``), as upstream's client raises it.
            ValueError: Another type of message.
        """
        native = await self._connected()
        kind, data = message.get("type"), message.get("data", {})
        try:
            if kind == "reset":
                return {"type": "observation", "data": _payload(await native.reset(**data))}
            if kind == "step":
                return {"type": "observation", "data": _payload(await native.step(data))}
            if kind == "state":
                return {"type": "state", "data": await native.state()}
        except openenv.ServerError as exc:
            raise _as_upstream_error(exc) from exc
        raise ValueError(f"unknown message type {kind!r}: reset, step or state")

    async def _reset_async(self, **kwargs: Any) -> StepResult[ObsT]:
        response = await self._send_and_receive({"type": "reset", "data": kwargs})
        return self._parse_result(response.get("data", {}))

    async def _step_async(self, action: ActT, **kwargs: Any) -> StepResult[ObsT]:
        response = await self._send_and_receive({"type": "step", "data": self._step_payload(action)})
        return self._parse_result(response.get("data", {}))

    async def _state_async(self) -> StateT:
        response = await self._send_and_receive({"type": "state"})
        return self._parse_state(response.get("data", {}))

    async def _close_async(self) -> None:
        children, self._child_clients = self._child_clients, []
        for child in children:
            await child._close_async()
        await self._connection.close()

    # -- context managers ---------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Connect; the end of the ``async with`` block closes."""
        self._claim_execution_mode("async")
        await self._connect_async()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self._close_async()

    def __enter__(self) -> Self:
        """Connect from plain code; the end of the ``with`` block closes."""
        self._run_sync(self._connect_async)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


class _Connection:
    """A client's native connection, kept apart from the client.

    From plain code the connection is opened on the session's loop thread, and closed
    there should the client be dropped unclosed: the finalizer that does so holds this,
    and holding the client would keep the client alive until the interpreter exits.
    """

    def __init__(self) -> None:
        self.native: openenv.EnvClient[Any, Any, Any] | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the native client, if one was opened; idempotent."""
        native, self.native = self.native, None
        if native is not None:
            await native.close()


class SyncEnvClient(Generic[ActT, ObsT, StateT]):
    """An `EnvClient` called from plain code: each call blocks until its reply.

    The session lives on an event loop in a daemon thread; Ctrl-C interrupts a
    call, and a client left open never keeps the process alive. Any other
    coroutine method of the client's class (a package's own ``async def``) is
    offered here as a blocking one, as upstream's wrapper offers it.

    Args:
        async_client: The client to drive.
    """

    def __init__(self, async_client: EnvClient[ActT, ObsT, StateT]) -> None:
        self._async = async_client
        self._child_clients: list[SyncEnvClient[Any, Any, Any]] = []

    @property
    def async_client(self) -> EnvClient[ActT, ObsT, StateT]:
        """The client this view drives."""
        return self._async

    def connect(self) -> Self:
        """Connect to the server."""
        self._async._run_sync(self._async._connect_async)
        return self

    def disconnect(self) -> None:
        """Close the connection."""
        self.close()

    def reset(self, **kwargs: Any) -> StepResult[ObsT]:
        """Start an episode; its result.

        Args:
            **kwargs: The environment's ``reset`` keywords.
        """
        client = self._async
        response = client._on_lane("reset", kwargs)
        if response is not None:
            return client._parse_result(response.get("data", {}))
        return client._run_sync(lambda: client._reset_async(**kwargs))

    def step(self, action: ActT, **kwargs: Any) -> StepResult[ObsT]:
        """Take one action; its result.

        Args:
            action: The action.
            **kwargs: Ignored, as upstream's client ignores them.
        """
        client = self._async
        response = client._on_lane("step", client._step_payload(action))
        if response is not None:
            return client._parse_result(response.get("data", {}))
        return client._run_sync(lambda: client._step_async(action, **kwargs))

    def state(self) -> StateT:
        """The environment's state."""
        client = self._async
        response = client._on_lane("state", None)
        if response is not None:
            return client._parse_state(response.get("data", {}))
        return client._run_sync(client._state_async)

    def close(self) -> None:
        """Close the session and those `new_session` made."""
        children, self._child_clients = self._child_clients, []
        try:
            for child in children:
                child.close()
        finally:
            self._async.close()

    def new_session(self) -> SyncEnvClient[Any, Any, Any]:
        """Another session on the same server, connected; closed with this one."""
        client = SyncEnvClient(self._async._session_client())
        client.connect()
        self._child_clients.append(client)
        return client

    def __enter__(self) -> Self:
        """Connect; the end of the ``with`` block closes."""
        return self.connect()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        """The client's attribute; one of its coroutine methods made blocking."""
        found = getattr(self._async, name)
        if not inspect.iscoroutinefunction(found):
            return found

        def blocking(*args: Any, **kwargs: Any) -> Any:
            return self._async._run_sync(lambda: getattr(self._async, name)(*args, **kwargs))

        return blocking

    def _step_payload(self, action: ActT) -> dict[str, Any]:
        return self._async._step_payload(action)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[ObsT]:
        return self._async._parse_result(payload)

    def _parse_state(self, payload: dict[str, Any]) -> StateT:
        return self._async._parse_state(payload)
