"""`EnvClient`: the typed async client of an environment server, over any transport."""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import math
from collections import deque
from collections.abc import Callable
from operator import attrgetter
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, NoReturn, get_origin

import anyio
import msgspec
from anyio.abc import TaskGroup

from ._clock import EVENT_LOOP_CLOCK, Clock
from ._codec import ClientCodec, client_codec, lift_observation_fields
from ._exceptions import (
    ClientStateError,
    ConnectError,
    ConnectionClosed,
    EncodingError,
    MCPError,
    OpenEnvError,
    ProtocolError,
    ReplyValidationError,
    TimeoutError,
    ToolCallError,
    ValidationError,
    server_error_from_frame,
)
from ._generics import bind_alias_type_attributes, bind_type_attributes
from ._limits import CLOSE_FRAME_TIMEOUT, DEFAULT_REPLY_TIMEOUT, PARTING_FRAME_WAIT, SEND_GRACE
from ._mcp_types import CallToolAction, CallToolObservation, ListToolsAction, ListToolsObservation, Tool
from ._messages import ErrorReply, MCPMessage, ObservationData, ObservationReply, StateReply
from ._registry import check_transport_options, create_transport, takes_option
from ._request_lock import RequestLock
from ._transport import Transport
from ._types import ActT, ObsT, StateT, StepResult
from ._watchdog import Watchdog

if TYPE_CHECKING:
    from typing import Self

    from ._sync import SyncEnvClient

__all__ = ["USE_CLIENT_DEFAULT", "EnvClient"]

logger = logging.getLogger("openenv.client")


# The client's own keyword options; every other keyword goes to the transport.
_CLIENT_OPTIONS = ("transport", "timeout", "action_type", "observation_type", "state_type", "clock", "mode")
_MODES = ("simulation", "production")


def _own_metadata(observation: Any) -> dict[str, Any]:
    """The ``metadata`` an observation carries itself (a Struct's field, a dict's key), or an empty dict."""
    metadata = observation.get("metadata") if isinstance(observation, dict) else getattr(observation, "metadata", None)
    return metadata if isinstance(metadata, dict) else {}


_REWARD, _DONE, _METADATA = attrgetter("reward"), attrgetter("done"), attrgetter("metadata")


@functools.lru_cache(maxsize=256)
def _results_at_once(observation_type: Any) -> bool:
    """Whether each observation of this type makes its result in C (`EnvClient._batch_results`).

    So it does for a Struct whose ``reward``, ``done`` and ``metadata`` are
    fields, ``metadata`` always a dict (as `openenv.Observation`'s): its result
    is then the one `EnvClient._batch_result` makes.
    """
    try:
        fields = {field.name: field.type for field in msgspec.structs.fields(observation_type)}
    except TypeError:  # not a Struct (a dict, a union)
        return False
    metadata = fields.get("metadata")
    return "reward" in fields and "done" in fields and (metadata is dict or get_origin(metadata) is dict)


def _tool_value(result: Any) -> Any:
    """A tool's value: an environment built on FastMCP (as OpenEnv's are) wraps it in a CallToolResult."""
    if isinstance(result, dict) and "data" in result and "content" in result:
        return result["data"]
    return result


def _tool_from_jsonrpc(entry: Any) -> Tool:
    """A tool as ``tools/list`` describes it (``inputSchema``, or OpenEnv's ``input_schema``)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise ReplyValidationError(f"expected a tool, got {entry!r:.80}")
    schema = entry.get("inputSchema", entry.get("input_schema")) or {}
    return Tool(name=entry["name"], description=entry.get("description") or "", input_schema=schema)


class _UseClientDefault(enum.Enum):
    USE_CLIENT_DEFAULT = enum.auto()

    def __repr__(self) -> str:
        return "USE_CLIENT_DEFAULT"


USE_CLIENT_DEFAULT = _UseClientDefault.USE_CLIENT_DEFAULT
"""The default of a per-call ``timeout``: use the client's own `EnvClient.timeout`.

Pass ``timeout=None`` to wait without a limit, or a number of seconds.
"""


class _ClientState(enum.Enum):
    UNOPENED = 1
    OPENED = 2
    CLOSED = 3


_NO_PAYLOAD: Final = object()  # `EnvClient._prepare` called with an encoder of the request id alone
_OPENED = _ClientState.OPENED  # read on every request: a name is a sixth of the cost of an enum member


class EnvClient(Generic[ActT, ObsT, StateT]):
    """A typed async client of one environment session.

    The type parameters drive decoding: a subclass that names concrete types needs
    no parsing code, and every reply is decoded and validated straight into them
    (``EnvClient[A, O, S](url)``, without a subclass, is typed the same way).
    A client without types gets plain dicts.

    One client is one session on the server: connect it with ``async with`` (or
    `connect` and `close`), then call `reset`, `step` and `state`. It runs under
    asyncio and trio alike; `sync` gives a blocking facade for code without an
    event loop.

    One session serves one request at a time: concurrent callers of one client
    are served in turn, never interleaved. A call that times out or is cancelled
    may still complete on the server; its late reply is recognised and dropped,
    never handed to the next call.

    Constructing a client does no I/O; the transport is built and connected when
    the client is entered.

    Examples:
        A typed client: name the action, observation and state types once, and
        every reply arrives decoded and validated into them.

        ```python
        from openenv import EnvClient
        from openenv.examples.echo import CallToolAction, EchoObservation, EchoState


        class EchoEnv(EnvClient[CallToolAction, EchoObservation, EchoState]):
            pass


        async with EchoEnv("ws://127.0.0.1:8000") as env:
            result = await env.reset()
            result = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "hi"}))
            print(result.observation.echoed_message, result.reward, result.done)
            state = await env.state()
            print(state.step_count)  # 1
        ```

        An untyped client sends and receives plain dicts; the URL's scheme picks
        the transport, and a call may set its own timeout.

        ```python
        from openenv import EnvClient

        async with EnvClient("http+poll://127.0.0.1:8000", timeout=30.0) as env:
            await env.reset(seed=42)
            action = {"tool_name": "echo_with_length", "arguments": {"message": "hi"}}
            result = await env.step(action, timeout=5.0)
            print(result.observation["result"])  # {'message': 'hi', 'length': 2}
        ```

    Args:
        base_url: The server's URL; its scheme picks the transport (``ws://``,
            ``wss://``, ``http://``, ``https://``, ``http+poll://``,
            ``https+poll://``, ``inproc://module:Factory``, or any registered one;
            see `openenv.create_transport`).
        transport: An unconnected transport to use instead of the one the URL
            would pick; the client enters and closes it.
        timeout: Seconds to wait for each reply, 60 by default (``None``: no
            limit). A call can override it with its own ``timeout=``.
        action_type: Overrides the action type given as a type parameter.
        observation_type: Overrides the observation type (``dict`` for untyped).
        state_type: Overrides the state type (``dict`` for untyped).
        mode: How `list_tools` and `call_tool` reach an MCP tool environment,
            as OpenEnv 0.10 names it: ``"simulation"`` (the default) sends
            steps (`ListToolsAction`, `CallToolAction`: counted, with a
            reward); ``"production"`` sends JSON-RPC ``tools/list`` and
            ``tools/call`` on the session's channel (`mcp`), bypassing
            ``step``, as OpenEnv's ``MCPToolClient`` does by default. With an
            ``http+mcp://`` URL the session itself is made over ``POST /mcp``
            too (see ``transports.mcp_session``).
        clock: Where the client measures its calls' timeouts; the event loop's
            time by default. The transport the URL picks gets it too, if it
            takes a ``clock`` option. For tests: a clock advanced by hand
            drives every timeout without waiting. Closing
            is bounded on the event loop's time, always: it may run shielded.
        **transport_options: Passed to the transport the URL picks (for example
            ``connect_timeout``, ``headers``); see each transport. Ignored when
            ``transport`` is given.

    Attributes:
        base_url: The URL the client was given, or ``None``.
        mode: ``"simulation"`` or ``"production"`` (see the argument).
        timeout: The default reply timeout of every call, in seconds (``None``:
            no limit); it may be changed between calls.
        action_type: The type of the actions `step` sends (``dict`` if untyped).
        observation_type: The type observations are decoded into (``dict`` if untyped).
        state_type: The type `state` decodes into (``dict`` if untyped).

    Raises:
        ValueError: Neither ``base_url`` nor ``transport`` was given.
        TypeError: The URL's transport takes no such option (OpenEnv's
            ``message_timeout_s`` is ``timeout`` here; the message names those
            it takes), or an option's value is not of the type the transport
            declares (``connect_timeout="10"``).
    """

    action_type: Any = dict
    observation_type: Any = dict
    state_type: Any = dict

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        bind_type_attributes(cls, EnvClient)
        # Keep the aliases zero-cost (the same function) and true to any override.
        if "reset" in cls.__dict__ and "reset_async" not in cls.__dict__:
            cls.reset_async = cls.reset
        if "step" in cls.__dict__ and "step_async" not in cls.__dict__:
            cls.step_async = cls.step

    def __init__(
        self,
        base_url: str | None = None,
        *,
        transport: Transport | None = None,
        timeout: float | None = DEFAULT_REPLY_TIMEOUT,
        action_type: Any = None,
        observation_type: Any = None,
        state_type: Any = None,
        clock: Clock = EVENT_LOOP_CLOCK,
        mode: Literal["simulation", "production"] = "simulation",
        **transport_options: Any,
    ) -> None:
        if base_url is None and transport is None:
            raise ValueError("EnvClient needs a base_url or a transport")
        if mode not in _MODES:
            raise ValueError(f"mode must be 'simulation' or 'production', not {mode!r}")
        self.mode = mode
        if transport is None and base_url is not None:
            check_transport_options(base_url, transport_options, also=_CLIENT_OPTIONS)
        self.base_url = base_url
        self.timeout = timeout
        self._clock = clock
        if action_type is not None:
            self.action_type = action_type
        if observation_type is not None:
            self.observation_type = observation_type
        if state_type is not None:
            self.state_type = state_type
        self._transport = transport
        self._transport_options = transport_options
        self._state = _ClientState.UNOPENED
        self._entered_by_connect = False
        self._codec: ClientCodec[ActT, ObsT, StateT] | None = None
        # One request at a time. Owned by no task (anyio's Lock is): an EnvPool takes it in the task
        # that sends a request and may give it back in another (the one that takes the reply).
        self._lock: RequestLock | None = None
        self._next_id = 0
        # Ids of requests sent whose replies have not been read yet, oldest first.
        # Replies come in order, so the oldest is always the next one to arrive.
        self._unanswered: deque[int] = deque()
        self._observation_is_struct = False
        self._observation_is_frozen = False
        self._results_at_once = False  # `_batch_results` makes them (the observation type allows it)
        # Decodes the replies of list_tools and call_tool, whatever the client's types; built on first use.
        self._tool_codec: ClientCodec[Any, Any, Any] | None = None
        self._jsonrpc_id = 0
        # Cancels a request at its deadline, while the client's owner runs it (see __aenter__).
        self._watchdog: Watchdog | None = None
        # The task group of the `async with` block that owns the client: its transport's
        # idle work and the watchdog run there. None for a client opened with connect().
        self._tasks: TaskGroup | None = None
        self._idle_work: list[anyio.CancelScope] = []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.base_url or type(self._transport).__name__} {self._state.name.lower()}>"

    @property
    def transport(self) -> Transport | None:
        """The transport in use: the one given, or the one the URL picked once connected; else ``None``."""
        return self._transport

    @property
    def is_connected(self) -> bool:
        """Whether the client is connected and not closed."""
        return self._state is _ClientState.OPENED

    # -- lifecycle -------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Connect (see `connect`); the end of the ``async with`` block closes the client.

        The block owns the client: the transport's idle work (answering a
        server's pings while you think, say) and the timer of its calls' timeouts
        run in a task group of the block's own.

        Returns:
            The client itself.

        Raises:
            ConnectError: The transport could not connect.
            ClientStateError: The client was already connected or closed.
            UnsupportedSchemeError: No transport handles the URL's scheme.
            ValueError: The transport rejected the URL or an option.
            TypeError: The transport does not take an option given, or msgspec
                cannot decode into the client's types.
        """
        await self._open()
        tasks = anyio.create_task_group()
        await tasks.__aenter__()
        self._tasks = tasks
        assert self._transport is not None
        self._watchdog = Watchdog(self._clock, launch=self._start_idle_work)
        self._start_idle_work(self._transport.keep)
        return self

    def _start_idle_work(self, work: Callable[[], Any]) -> None:
        """Run ``work`` in the owner's task group until the client closes; it never raises."""
        assert self._tasks is not None
        scope = anyio.CancelScope()
        self._idle_work.append(scope)

        async def run() -> None:
            with scope:
                try:
                    await work()
                except Exception:  # the next call reports what broke; the owner's block must go on
                    logger.exception("the idle work of %r failed", self)

        self._tasks.start_soon(run)

    async def _open(self) -> None:
        if self._state is not _ClientState.UNOPENED:
            raise ClientStateError(
                "an EnvClient can be connected only once"
                if self._state is _ClientState.OPENED
                else "this EnvClient was closed; create a new one"
            )
        if self._transport is None:
            assert self.base_url is not None
            options = self._transport_options
            if self._clock is not EVENT_LOOP_CLOCK and takes_option(self.base_url, "clock"):
                options = {**options, "clock": self._clock}
            self._transport = create_transport(self.base_url, **options)
        try:
            await self._transport.__aenter__()
        except OpenEnvError:
            raise
        except Exception as exc:
            # The contract forbids it, but a third-party transport may still leak one.
            raise ConnectError(f"could not connect to {self.base_url}: {exc}") from exc
        # `EnvClient[A, O, S](url)` is typed too: the alias is known only now.
        bind_alias_type_attributes(self)
        obs_config = getattr(self.observation_type, "__struct_config__", None)
        self._observation_is_struct = obs_config is not None
        self._observation_is_frozen = bool(obs_config and obs_config.frozen)
        try:
            self._codec = client_codec(self._transport.dialect, self.observation_type, self.state_type)
        except BaseException:
            # Types msgspec cannot decode into: leave nothing open behind the TypeError.
            await self._transport.__aexit__(None, None, None)
            raise
        self._results_at_once = _results_at_once(self.observation_type)  # a type msgspec takes: one it can hash
        self._lock = RequestLock()
        self._state = _ClientState.OPENED

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self._close()
            await self._exit_transport()
        finally:
            tasks, self._tasks = self._tasks, None
            if tasks is not None:
                await tasks.__aexit__(None, None, None)  # its tasks are cancelled: this returns at once

    def __enter__(self) -> NoReturn:
        """Refuse a plain ``with``, saying what to write instead.

        Raises:
            TypeError: Always: the client is async (``async with``); `sync` gives a blocking one.
        """
        name = type(self).__name__
        raise TypeError(
            f"{name} is async: use `async with {name}(...) as env:`, "
            f"or `with {name}(...).sync() as env:` for a blocking client"
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Never reached: `__enter__` refuses."""

    async def connect(self) -> Self:
        """Connect to the server without a ``with`` block; pair it with `close`.

        Prefer ``async with client:``. `close` may be called from another task
        than `connect` (clients connected at once in a task group, then used from
        the parent, say) and under any cancel scope. A client connects once;
        after `close`, create a new one.

        Returns:
            The client itself.

        Raises:
            ConnectError: The transport could not connect (refused, unreachable,
                handshake failed, ``connect_timeout`` elapsed).
            ClientStateError: The client was already connected or closed.
            UnsupportedSchemeError: No transport handles the URL's scheme.
            ValueError: The transport rejected the URL or an option.
            TypeError: The transport does not take an option given, or msgspec
                cannot decode into the client's types.

        Examples:
            ```python
            from openenv.examples.echo import EchoEnv

            env = await EchoEnv("ws://127.0.0.1:8000").connect()
            try:
                await env.reset()
            finally:
                await env.close()
            ```
        """
        await self._open()
        self._entered_by_connect = True
        return self

    async def close(self) -> None:
        """End the session: tell the server, then close the transport. Idempotent.

        The server is told with a ``close`` frame, best effort (given up after a
        second on a slow connection); then the transport closes, within its own
        bound (its ``close_timeout``). Never raises for a connection that is already broken;
        it is safe on a client never connected. Afterwards every request raises
        `ClientStateError`.
        """
        await self._close()
        if self._entered_by_connect:
            self._entered_by_connect = False
            await self._exit_transport()

    async def aclose(self) -> None:
        """The same as `close`, by the name anyio and httpx use."""
        await self.close()

    async def _close(self) -> None:
        was_open = self._state is _ClientState.OPENED
        self._state = _ClientState.CLOSED
        with anyio.CancelScope(shield=True):
            if was_open:
                assert self._transport is not None
                assert self._codec is not None
                # Best effort, bounded: the server may be gone already. Bounded on the event
                # loop's time, whatever the client's clock: shielded, a close must end by itself.
                with anyio.move_on_after(CLOSE_FRAME_TIMEOUT), contextlib.suppress(OpenEnvError):
                    await self._transport.send(self._codec.close())
                await self._transport.aclose()
            for scope in self._idle_work:
                scope.cancel()
            self._watchdog = None

    async def _exit_transport(self) -> None:
        if self._transport is not None and self._codec is not None:
            await self._transport.__aexit__(None, None, None)

    def sync(self, *, backend: str = "asyncio") -> SyncEnvClient[ActT, ObsT, StateT]:
        """Return a blocking facade of this client, for code without an event loop.

        Nothing connects yet: the facade connects the client when it is entered.

        Args:
            backend: The event loop to run the client on, in a background thread:
                ``"asyncio"`` (the default) or ``"trio"``.

        Returns:
            A `SyncEnvClient` with the same methods, blocking; use it as a context
            manager (``with EchoEnv(url).sync() as env: ...``).

        Examples:
            ```python
            from openenv.examples.echo import CallToolAction, EchoEnv

            with EchoEnv("ws://127.0.0.1:8000").sync() as env:
                env.reset()
                result = env.step(CallToolAction(tool_name="echo_message", arguments={"message": "hi"}))
                print(result.observation.echoed_message)  # hi
            ```
        """
        from ._sync import SyncEnvClient

        return SyncEnvClient(self, backend=backend)

    # -- requests --------------------------------------------------------------

    async def reset(
        self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT, **kwargs: Any
    ) -> StepResult[ObsT]:
        """Start a new episode.

        Args:
            timeout: Seconds to wait for the reply, instead of the client's
                `timeout` (``None``: no limit).
            **kwargs: Passed to the environment's ``reset`` (``seed``, ``episode_id``,
                ...); the server drops those the environment does not accept.

        Returns:
            The first observation, with its reward and done flag.

        Raises:
            ExecutionError: The environment raised in ``reset``; the session survives.
            CapacityReachedError: The server had no free session for this client
                (reported at the first request); the connection is closed.
            ServerError: Any other error frame (a subclass per code, see
                `openenv.ServerError`).
            TimeoutError: No reply within the timeout; the session survives.
            ConnectionClosed: The server closed the connection, or it broke.
            ProtocolError: The server sent something that is not a reply frame.
            ReplyValidationError: The reply does not fit the client's observation type.
            EncodingError: A keyword argument cannot be encoded.
            ClientStateError: The client is not connected, or is closed.

        Examples:
            ```python
            from openenv.examples.echo import EchoEnv

            async with EchoEnv("ws://127.0.0.1:8000") as env:
                result = await env.reset(seed=7, episode_id="episode-1")
                state = await env.state()
                print(state.episode_id, result.done)  # episode-1 False
            ```
        """
        codec = self._codec_or_raise()
        reply = await self._request(lambda request_id: codec.reset(kwargs, request_id), timeout)
        return self._step_result(reply)

    async def step(
        self, action: ActT, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT
    ) -> StepResult[ObsT]:
        """Take one step.

        Args:
            action: The action to apply: an instance of `action_type` (a Struct),
                or a dict of its fields for an untyped client.
            timeout: Seconds to wait for the reply, instead of the client's
                `timeout` (``None``: no limit).

        Returns:
            The observation that followed, with its reward and done flag (also
            set on the observation itself, when it is a Struct).

        Raises:
            ValidationError: The server rejected the action; the session survives.
            ExecutionError: The environment raised while stepping; the session survives.
            CapacityReachedError: The server had no free session for this client
                (reported at the first request); the connection is closed.
            ServerError: Any other error frame (a subclass per code, see
                `openenv.ServerError`).
            TimeoutError: No reply within the timeout; the session survives.
            ConnectionClosed: The server closed the connection, or it broke.
            ProtocolError: The server sent something that is not a reply frame.
            ReplyValidationError: The reply does not fit the client's observation type.
            EncodingError: The action cannot be encoded.
            ClientStateError: The client is not connected, or is closed.

        Examples:
            ```python
            import openenv
            from openenv.examples.echo import CallToolAction, EchoEnv

            async with EchoEnv("ws://127.0.0.1:8000") as env:
                await env.reset()
                result = await env.step(CallToolAction(tool_name="echo_with_length", arguments={"message": "abc"}))
                print(result.observation.result, result.reward)  # {'message': 'abc', 'length': 3} 0.3...
                try:
                    await env.step(CallToolAction(tool_name="no_such_tool"))
                except openenv.ExecutionError as exc:
                    print(exc.code)  # EXECUTION_ERROR; the session goes on
                result = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "still here"}))
            ```
        """
        codec = self._codec_or_raise()
        reply = await self._request(lambda request_id: codec.step(action, request_id), timeout)
        return self._step_result(reply)

    async def state(self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT) -> StateT:
        """Ask for the environment's current state.

        Args:
            timeout: Seconds to wait for the reply, instead of the client's
                `timeout` (``None``: no limit).

        Returns:
            The state, of the client's state type (a dict for an untyped client).

        Raises:
            ExecutionError: The environment raised reading its state; the session survives.
            ServerError: Any other error frame (a subclass per code, see
                `openenv.ServerError`).
            TimeoutError: No reply within the timeout; the session survives.
            ConnectionClosed: The server closed the connection, or it broke.
            ProtocolError: The server sent something that is not a state reply.
            ReplyValidationError: The reply does not fit the client's state type.
            ClientStateError: The client is not connected, or is closed.
        """
        reply = await self._request(self._codec_or_raise().state, timeout)
        if not isinstance(reply, StateReply):
            raise ProtocolError(f"expected a state reply, got {type(reply).__name__}")
        return reply.data

    # -- MCP tool environments --------------------------------------------------

    def _tool_codec_or_raise(self) -> ClientCodec[Any, Any, Any]:
        codec = self._codec_or_raise()
        if self._tool_codec is None:
            self._tool_codec = client_codec(codec.dialect, ListToolsObservation | CallToolObservation, dict)
        return self._tool_codec

    async def _tool_step(self, action: Any, timeout: float | _UseClientDefault | None) -> Any:
        tool_codec = self._tool_codec_or_raise()
        reply = await self._request(lambda request_id: tool_codec.step(action, request_id), timeout, tool_codec)
        if not isinstance(reply, ObservationReply):
            raise ProtocolError(f"expected an observation reply, got {type(reply).__name__}")
        return reply.data.observation

    async def list_tools(self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT) -> list[Tool]:
        """List the tools of an MCP tool environment.

        Sends a `ListToolsAction` step, as OpenEnv's ``MCPToolClient`` does in
        its simulation mode, so it works over every transport and against
        OpenEnv's servers; no `reset` is needed first. In the client's
        ``"production"`` `mode`, a JSON-RPC ``tools/list`` instead (see `mcp`).

        Args:
            timeout: Seconds to wait for the reply, instead of the client's
                `timeout` (``None``: no limit).

        Returns:
            One `Tool` per tool: its name, description and argument schema;
            ``[]`` for an environment without tools (it refuses the action as
            invalid), as OpenEnv's ``MCPToolClient`` answers.

        Raises:
            ReplyValidationError: The reply is not a list of tools.
            ServerError: Any other error frame.
            TimeoutError: No reply within the timeout; the session survives.
            ConnectionClosed: The server closed the connection, or it broke.
            ClientStateError: The client is not connected, or is closed.

        Examples:
            ```python
            from openenv.examples.echo import EchoEnv

            async with EchoEnv("ws://127.0.0.1:8000") as env:
                for tool in await env.list_tools():
                    print(tool.name, tool.input_schema["required"])  # echo_message ['message'] ...
            ```
        """
        if self.mode == "production":
            try:
                listed = await self.mcp("tools/list", timeout=timeout)
            except MCPError as exc:
                if exc.code in (-32601, -32603):  # the environment has no tools (OpenEnv's answer)
                    return []
                raise
            if not isinstance(listed, dict) or not isinstance(listed.get("tools"), list):
                raise ReplyValidationError(f"expected a list of tools, got {listed!r:.80}")
            return [_tool_from_jsonrpc(entry) for entry in listed["tools"]]
        try:
            observation = await self._tool_step(ListToolsAction(), timeout)
        except ValidationError:  # its action type has no room for a tool listing: it has no tools
            return []
        if not isinstance(observation, ListToolsObservation):
            raise ReplyValidationError(f"expected a list of tools, got {type(observation).__name__}")
        return observation.tools

    async def call_tool(
        self, name: str, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT, **arguments: Any
    ) -> Any:
        """Call one tool of an MCP tool environment and return its result.

        Sends a `CallToolAction` step, as OpenEnv's ``MCPToolClient`` does in
        its simulation mode (so the environment counts it as a step). For the
        reward and the whole observation, ``step(CallToolAction(...))``
        instead. In the client's ``"production"`` `mode`, a JSON-RPC
        ``tools/call`` instead, bypassing ``step`` (see `mcp`).

        Args:
            name: The tool's name.
            timeout: Seconds to wait for the reply, instead of the client's
                `timeout` (``None``: no limit).
            **arguments: The tool's arguments.

        Returns:
            What the tool returned (plain data: a dict, a list, a string, ...).

        Raises:
            ToolCallError: The tool failed (unknown, bad arguments, or it raised);
                it carries the tool's error. An environment without tools
                gives ``tool_not_found``. The session survives.
            ServerError: Any other error frame.
            TimeoutError: No reply within the timeout; the session survives.
            ConnectionClosed: The server closed the connection, or it broke.
            EncodingError: An argument cannot be encoded.
            ClientStateError: The client is not connected, or is closed.

        Examples:
            ```python
            from openenv.examples.echo import EchoEnv

            async with EchoEnv("ws://127.0.0.1:8000") as env:
                print(await env.call_tool("echo_with_length", message="Hello!"))  # {'message': 'Hello!', 'length': 6}
            ```
        """
        if self.mode == "production":
            try:
                result = await self.mcp("tools/call", {"name": name, "arguments": arguments}, timeout=timeout)
            except MCPError as exc:
                data = exc.data if isinstance(exc.data, dict) else {}
                kind = data.get("error_type") or ("invalid_args" if exc.code == -32602 else "execution_error")
                raise ToolCallError(name, str(kind), exc.message) from exc
            return _tool_value(result)
        try:
            observation = await self._tool_step(CallToolAction(tool_name=name, arguments=arguments), timeout)
        except ValidationError as exc:
            message = f"the environment has no MCP tools: it refused the tool call as an action ({exc})"
            raise ToolCallError(name, "tool_not_found", message) from exc
        if not isinstance(observation, CallToolObservation):
            raise ReplyValidationError(f"expected the result of a tool call, got {type(observation).__name__}")
        error = observation.error
        if error is not None:
            raise ToolCallError(name, error.error_type, error.message)
        return _tool_value(observation.result)

    async def mcp(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT,
    ) -> Any:
        """Send one MCP (JSON-RPC 2.0) request in an ``mcp`` frame and return its result.

        The request goes to the session's own environment, bypassing `step` (no
        reward, no step counted), as ``{"type": "mcp", ...}`` frames do on OpenEnv's
        servers.

        Args:
            method: The JSON-RPC method: ``"tools/list"``, ``"tools/call"``, ...
            params: Its parameters (``{"name": ..., "arguments": {...}}`` for a call).
            timeout: Seconds to wait for the reply, instead of the client's
                `timeout` (``None``: no limit).

        Returns:
            The response's ``result``.

        Raises:
            MCPError: The response is an error (its JSON-RPC ``code``, ``message``
                and ``data``); the session survives.
            ProtocolError: The reply is not an ``mcp`` frame.
            ServerError: An error frame (the server does not take ``mcp`` frames:
                ``UNKNOWN_TYPE``).
            TimeoutError: No reply within the timeout; the session survives.
            ConnectionClosed: The server closed the connection, or it broke.
            EncodingError: A parameter cannot be encoded.
            ClientStateError: The client is not connected, or is closed.

        Examples:
            ```python
            from openenv.examples.echo import EchoEnv

            async with EchoEnv("ws://127.0.0.1:8000") as env:
                result = await env.mcp("tools/call", {"name": "echo_message", "arguments": {"message": "hi"}})
                print(result["data"])  # hi
            ```
        """
        codec = self._codec_or_raise()
        self._jsonrpc_id += 1
        message = {"jsonrpc": "2.0", "method": method, "params": params or {}, "id": self._jsonrpc_id}
        reply = await self._request(lambda request_id: codec.mcp(message, request_id), timeout)
        if not isinstance(reply, MCPMessage):
            raise ProtocolError(f"expected an mcp reply, got {type(reply).__name__}")
        error = reply.data.get("error")
        if error is not None:
            if not isinstance(error, dict):
                raise ProtocolError(f"malformed JSON-RPC error: {error!r}")
            raise MCPError(int(error.get("code", 0)), str(error.get("message", "")), error.get("data"))
        return reply.data.get("result")

    # Zero-cost coroutine aliases (the very same functions), as OpenEnv names them.
    # They await the reply like the methods above; this is not Gymnasium's
    # send-now-wait-later.
    reset_async = reset
    """The same coroutine function as `reset`, by the name OpenEnv's client gives it."""
    step_async = step
    """The same coroutine function as `step`, by the name OpenEnv's client gives it."""

    def _codec_or_raise(self) -> ClientCodec[ActT, ObsT, StateT]:
        if self._state is not _OPENED:
            if self._state is _ClientState.UNOPENED:
                raise ClientStateError("the client is not connected: use `async with` or `await client.connect()`")
            raise ClientStateError("the client is closed")
        assert self._codec is not None
        return self._codec

    def _step_result(self, reply: Any) -> StepResult[ObsT]:
        if not isinstance(reply, ObservationReply):
            raise ProtocolError(f"expected an observation reply, got {type(reply).__name__}")
        return self._result_of(reply.data)

    def _batch_result(self, observation: Any) -> StepResult[ObsT]:
        """The result of a step of a batch, whose observation came whole (`openenv._messages.StepBatchReply`)."""
        if isinstance(observation, msgspec.Struct):  # a union's member too: reward and done came in it
            fields: Any = observation
            metadata = getattr(observation, "metadata", None)  # `_own_metadata`'s, without its call: one per step
            return StepResult(observation, fields.reward, fields.done, metadata if isinstance(metadata, dict) else {})  # type: ignore[arg-type]
        return self._result_of(ObservationData(*lift_observation_fields(observation)))

    def _batch_results(self, observations: list[Any]) -> list[StepResult[ObsT]] | None:
        """The results of a batch's steps, made at once in C when every observation came whole; else ``None``.

        Each is the result `_batch_result` makes, for an observation type that
        allows it (`_results_at_once`).
        """
        if not self._results_at_once:
            return None
        try:
            rewards, dones = map(_REWARD, observations), map(_DONE, observations)
            return list(map(StepResult, observations, rewards, dones, map(_METADATA, observations)))
        except AttributeError:  # a step not taken (``None`` in its place): each is looked at alone
            return None

    def _result_of(self, data: ObservationData[Any]) -> StepResult[ObsT]:
        """The result an observation reply's data makes: reward and done set on a Struct observation too."""
        observation = data.observation
        if self._observation_is_struct:
            if self._observation_is_frozen:
                observation = msgspec.structs.replace(observation, reward=data.reward, done=data.done)
            else:
                observation.reward = data.reward
                observation.done = data.done
        metadata = data.metadata
        if metadata is msgspec.UNSET:  # an older server, or none to send: the observation's own, if any
            metadata = _own_metadata(observation)
        return StepResult(observation, data.reward, data.done, metadata)

    async def _request(
        self,
        encode: Callable[[int], bytes],
        timeout: float | _UseClientDefault | None,
        codec: ClientCodec[Any, Any, Any] | None = None,
    ) -> ObservationReply[ObsT] | StateReply[StateT] | MCPMessage:
        if timeout is USE_CLIENT_DEFAULT:
            timeout = self.timeout
        assert self._lock is not None
        async with self._lock:
            codec, transport, frame, request_id = self._prepare(encode, codec)
            if timeout is None:
                return await self._exchange(codec, transport, frame, request_id, None, math.inf)
            watchdog = self._watchdog
            deadline = self._clock.now() + timeout
            if watchdog is None:  # a client without an owner: a timer of the clock's per call
                scope = self._clock.cancel_scope(deadline=deadline)
            else:
                scope = anyio.CancelScope()
                if timeout <= 0:
                    scope.cancel()
                watchdog.arm(scope, deadline)
            try:
                with scope:
                    return await self._exchange(codec, transport, frame, request_id, scope, deadline)
            finally:
                if watchdog is not None:
                    watchdog.disarm(scope)
            # Reached only when the deadline cancelled the exchange.
            raise TimeoutError(f"no reply within {timeout} s")

    def _prepare(
        self,
        encode: Callable[..., bytes],
        codec: ClientCodec[Any, Any, Any] | None = None,
        *,
        payload: Any = _NO_PAYLOAD,
    ) -> tuple[ClientCodec[Any, Any, Any], Transport, bytes, int]:
        """Number and encode a request; call with the lock held. Returns the codec, transport, frame and id.

        ``encode(request_id)`` makes the frame; given a ``payload``,
        ``encode(codec, payload, request_id)`` does (an `EnvPool`'s requests,
        with no closure to make per call).

        Raises:
            ClientStateError: The client is not open.
            EncodingError: The request cannot be encoded.
        """
        own_codec = self._codec_or_raise()
        transport = self._transport
        assert transport is not None
        self._next_id += 1
        request_id = self._next_id
        try:
            frame = encode(request_id) if payload is _NO_PAYLOAD else encode(codec or own_codec, payload, request_id)
        except (TypeError, msgspec.EncodeError) as exc:
            raise EncodingError(f"cannot encode the request: {exc}") from exc
        except RecursionError as exc:  # msgspec's guard against nesting deeper than the stack allows
            raise EncodingError(f"cannot encode the request: it is nested too deeply ({exc})") from exc
        return codec or own_codec, transport, frame, request_id

    async def _send_request(
        self, codec: ClientCodec[Any, Any, Any], transport: Transport, frame: bytes, request_id: int
    ) -> None:
        """Send a prepared request with no deadline of its own (see `_exchange`); call with the lock held."""
        try:
            if codec.dialect.request_ids:
                self._unanswered.append(request_id)
                await transport.send(frame)
            else:
                with anyio.CancelScope(shield=True):
                    await transport.send(frame)
                self._unanswered.append(request_id)
        except ConnectionClosed as exc:
            await self._raise_parting_error(codec, transport, exc)

    async def _exchange(
        self,
        codec: ClientCodec[ActT, ObsT, StateT],
        transport: Transport,
        frame: bytes,
        request_id: int,
        scope: anyio.CancelScope | None,
        deadline: float,
    ) -> ObservationReply[ObsT] | StateReply[StateT] | MCPMessage:
        """Send one request and return its reply; late replies of earlier calls are dropped.

        ``scope`` is the call's own, armed with ``deadline`` (``None`` for a call without one).
        """
        try:
            if codec.dialect.request_ids:
                # Replies name their request, so a send cut short by a cancellation
                # does no harm: a request that never went out gets no reply, and is
                # skipped when a later one's reply arrives.
                self._unanswered.append(request_id)
                await transport.send(frame)
            elif scope is None:
                # Replies are matched by order alone, so a cancellation must not leave
                # it unknown whether the frame went out: shield the send.
                with anyio.CancelScope(shield=True):
                    await transport.send(frame)
                self._unanswered.append(request_id)
            else:
                await self._send_within_grace(transport, frame, scope, deadline)
                self._unanswered.append(request_id)
        except ConnectionClosed as exc:
            await self._raise_parting_error(codec, transport, exc)
        return await self._receive_reply(codec, transport, request_id)

    async def _send_within_grace(
        self, transport: Transport, frame: bytes, scope: anyio.CancelScope, deadline: float
    ) -> None:
        """Send a plain OpenEnv request whole, in the call's ``scope``, shielded from cancellation outside it.

        Replies are matched by order alone, so a cancellation must not leave it
        unknown whether the frame went out. A deadline that has passed sends
        nothing; one that passes while the frame goes out must not cut it short
        (the channel would be lost), so the send gets at least `SEND_GRACE`
        seconds: only a stuck channel runs out of it, and closes the client.
        """
        now = self._clock.now()
        if now >= deadline:
            raise TimeoutError("the timeout elapsed before the request was sent")
        watchdog = self._watchdog
        scope.shield = True
        if watchdog is not None:
            watchdog.arm(scope, max(deadline, now + SEND_GRACE))
        elif self._clock is EVENT_LOOP_CLOCK:
            scope.deadline = max(deadline, now + SEND_GRACE)
        try:
            await transport.send(frame)
        except anyio.get_cancelled_exc_class():
            if not scope.cancel_called:  # not the grace running out: someone else's cancellation
                raise
            self._state = _ClientState.CLOSED
            with anyio.CancelScope(shield=True):
                await transport.aclose()
            raise TimeoutError("timed out sending the request; the client is closed") from None
        scope.shield = False
        if self._clock.now() >= deadline:
            # Passed while the frame went out: cancel now, not whenever the watchdog runs next.
            scope.cancel()
        elif watchdog is not None:
            watchdog.arm(scope, deadline)
        elif self._clock is EVENT_LOOP_CLOCK:
            scope.deadline = deadline

    def _owner_of(self, reply_id: int | None) -> int:
        """Which request a reply answers, and forget it (and any skipped request) as unanswered."""
        unanswered = self._unanswered
        if not unanswered:
            raise ProtocolError("the server sent a reply to no request")
        if reply_id is None:
            return unanswered.popleft()  # plain OpenEnv, or an id-less fatal error: order decides
        if reply_id not in unanswered:
            raise ProtocolError(f"the server sent a reply to an unknown request id {reply_id}")
        # Replies come in order: older requests still listed were never sent.
        while unanswered[0] != reply_id:
            unanswered.popleft()
        return unanswered.popleft()

    async def _receive_reply(
        self, codec: ClientCodec[ActT, ObsT, StateT], transport: Transport, request_id: int
    ) -> ObservationReply[ObsT] | StateReply[StateT] | MCPMessage:
        while True:
            reply = self._reply_in(codec, await transport.receive(), request_id)
            if reply is not None:
                return reply

    def _reply_in(
        self, codec: ClientCodec[Any, Any, Any], frame: bytes, request_id: int
    ) -> ObservationReply[ObsT] | StateReply[StateT] | MCPMessage | None:
        """The reply to ``request_id`` in ``frame``, or ``None`` for a late reply to an earlier request (dropped).

        Raises:
            ServerError: The reply is an error frame (a subclass per code).
            ProtocolError: The frame is not a reply, or answers no request.
            ReplyValidationError: The reply does not fit the client's types.
        """
        use_ids = codec.dialect.request_ids
        try:
            reply = codec.decode_reply(frame)
        except (ProtocolError, ReplyValidationError):
            # A late reply for a call that gave up is dropped even if malformed.
            if self._owner_of(codec.reply_id(frame) if use_ids else None) != request_id:
                return None
            raise
        if self._owner_of(reply.id if use_ids else None) != request_id:
            self._drop_late_reply(reply)
            return None
        if isinstance(reply, ErrorReply):
            raise server_error_from_frame(reply.data)
        return reply

    async def _raise_parting_error(
        self, codec: ClientCodec[ActT, ObsT, StateT], transport: Transport, closed: ConnectionClosed
    ) -> NoReturn:
        """Raise the reason a server gave before closing (``CAPACITY_REACHED``, ...), if it gave one."""
        # Transports hand out frames that arrived before the close; read what is left.
        with self._clock.move_on_after(PARTING_FRAME_WAIT):
            while True:
                try:
                    frame = await transport.receive()
                    reply = codec.decode_reply(frame)
                except OpenEnvError:
                    break
                if isinstance(reply, ErrorReply):
                    raise server_error_from_frame(reply.data) from closed
        raise closed

    @staticmethod
    def _drop_late_reply(reply: ObservationReply[ObsT] | StateReply[StateT] | ErrorReply | MCPMessage) -> None:
        """Drop the reply of a call that timed out or was cancelled; unless it is fatal."""
        if isinstance(reply, ErrorReply):
            error = server_error_from_frame(reply.data)
            if error.fatal:
                raise error
