"""`EnvClient`: the typed client of one environment session over any transport; `SyncEnvClient`, its blocking facade.

The client owns its session's lifetime and its public calls; each call's
request goes through the client's `openenv._requests.RequestChannel`, made when
it connects. The facade runs the very same client on a loop thread
(`openenv._blocking`).
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, Literal, NoReturn, Self, TypeVar

import anyio
from anyio.abc import TaskGroup

from ._blocking import BlockingFacade, Holder, call
from ._clock import EVENT_LOOP_CLOCK, Clock
from ._codec import ClientCodec, client_codec
from ._exceptions import (
    ClientStateError,
    ConnectError,
    MCPError,
    OpenEnvError,
    ProtocolError,
    ReplyValidationError,
    ToolCallError,
    ValidationError,
)
from ._generics import bind_alias_type_attributes, bind_type_attributes
from ._lane import LaneCalls
from ._limits import DEFAULT_REPLY_TIMEOUT, USE_CLIENT_DEFAULT, UseClientDefault
from ._mcp_types import CallToolAction, CallToolObservation, ListToolsAction, ListToolsObservation, Tool
from ._messages import MCPMessage, ObservationReply, StateReply
from ._registry import check_transport_options, create_transport, takes_option
from ._requests import Encoder, RequestChannel, encode_mcp, encode_reset, encode_state, encode_step
from ._transport import Transport
from ._types import ActT, ObsT, StateT, StepResult
from ._watchdog import Watchdog

__all__ = ["EnvClient", "SyncEnvClient", "requests_of"]

_T = TypeVar("_T")

logger = logging.getLogger("openenv.client")


# The client's own keyword options; every other keyword goes to the transport.
_CLIENT_OPTIONS = ("transport", "timeout", "action_type", "observation_type", "state_type", "clock", "mode")
_MODES = ("simulation", "production")


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


class _ClientState(enum.Enum):
    UNOPENED = 1
    OPENED = 2
    CLOSED = 3


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
        # The session's requests: made when the client connects, kept once it closes (closed).
        self._requests: RequestChannel[ActT, ObsT, StateT] | None = None
        # Decodes the replies of list_tools and call_tool, whatever the client's types; built on first use.
        self._tool_codec: ClientCodec[Any, Any, Any] | None = None
        self._jsonrpc_id = 0
        # The task group of the `async with` block that owns the client: its transport's
        # idle work and the watchdog run there. None for a client opened with connect().
        self._tasks: TaskGroup | None = None
        self._idle_work: list[anyio.CancelScope] = []

    def __repr__(self) -> str:
        state = "unopened" if self._state is _ClientState.UNOPENED else "opened" if self.is_connected else "closed"
        return f"<{type(self).__name__} {self.base_url or type(self._transport).__name__} {state}>"

    @property
    def transport(self) -> Transport | None:
        """The transport in use: the one given, or the one the URL picked once connected; else ``None``."""
        return self._transport

    @property
    def is_connected(self) -> bool:
        """Whether the client is connected and not closed."""
        requests = self._requests
        return requests is not None and requests.open

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
        assert self._requests is not None
        # Cancels a request at its deadline, in the owner's task group.
        self._requests.watchdog = Watchdog(self._clock, launch=self._start_idle_work)
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
        try:
            codec = client_codec(self._transport.dialect, self.observation_type, self.state_type)
        except BaseException:
            # Types msgspec cannot decode into: leave nothing open behind the TypeError.
            await self._transport.__aexit__(None, None, None)
            raise
        self._requests = RequestChannel(self._transport, codec, self.observation_type, self._clock)
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
        self._state = _ClientState.CLOSED
        requests = self._requests
        with anyio.CancelScope(shield=True):
            if requests is not None:
                await requests.close()
                requests.watchdog = None
            for scope in self._idle_work:
                scope.cancel()

    async def _exit_transport(self) -> None:
        if self._transport is not None and self._requests is not None:
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
        return SyncEnvClient(self, backend=backend)

    # -- requests --------------------------------------------------------------

    async def reset(
        self, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT, **kwargs: Any
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
        requests = self._requests_or_raise()
        reply = await requests.request(encode_reset, kwargs, timeout, self.timeout)
        return requests.results.of_reply(reply)

    async def step(
        self, action: ActT, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT
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
        requests = self._requests_or_raise()
        reply = await requests.request(encode_step, action, timeout, self.timeout)
        return requests.results.of_reply(reply)

    async def state(self, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT) -> StateT:
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
        reply = await self._requests_or_raise().request(encode_state, None, timeout, self.timeout)
        if not isinstance(reply, StateReply):
            raise ProtocolError(f"expected a state reply, got {type(reply).__name__}")
        return reply.data

    # -- MCP tool environments --------------------------------------------------

    async def _tool_step(self, action: Any, timeout: float | UseClientDefault | None) -> Any:
        requests = self._requests_or_raise()
        if self._tool_codec is None:
            self._tool_codec = client_codec(requests.codec.dialect, ListToolsObservation | CallToolObservation, dict)
        reply = await requests.request(encode_step, action, timeout, self.timeout, self._tool_codec)
        if not isinstance(reply, ObservationReply):
            raise ProtocolError(f"expected an observation reply, got {type(reply).__name__}")
        return reply.data.observation

    async def list_tools(self, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT) -> list[Tool]:
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
        self, name: str, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT, **arguments: Any
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
        timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
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
        requests = self._requests_or_raise()
        self._jsonrpc_id += 1
        message = {"jsonrpc": "2.0", "method": method, "params": params or {}, "id": self._jsonrpc_id}
        reply = await requests.request(encode_mcp, message, timeout, self.timeout)
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

    def _requests_or_raise(self) -> RequestChannel[ActT, ObsT, StateT]:
        """The client's request channel, while it is open.

        Raises:
            ClientStateError: The client is not connected, or is closed.
        """
        requests = self._requests
        if requests is None or not requests.open:
            if self._state is _ClientState.UNOPENED:
                raise ClientStateError("the client is not connected: use `async with` or `await client.connect()`")
            raise ClientStateError("the client is closed")
        return requests


def requests_of(client: EnvClient[ActT, ObsT, StateT]) -> RequestChannel[ActT, ObsT, StateT] | None:
    """A client's request channel, for an `openenv.EnvPool` that drives it; ``None`` until it connects."""
    return client._requests


class SyncEnvClient(BlockingFacade, Generic[ActT, ObsT, StateT]):
    """The same client, blocking: for scripts, notebooks and training loops without async.

    Get one from `EnvClient.sync`. It runs the async client on an event loop in a
    background thread (anyio's blocking portal, shared by all sync clients of a
    backend, started with the first and stopped with the last), so it behaves
    exactly as the async client does, under asyncio or trio, and raises the same
    exceptions. Over a transport that can lend its connection to the caller's
    thread (``ws://`` and ``http://`` without TLS), `reset`, `step` and `state`
    write their request and read their reply in the calling thread itself, with
    no hand-off to the event loop (`openenv._lane`); whatever else the
    connection needs (a ping answered, a drop resumed) goes through the event
    loop as before. One call at a time goes through a facade; calls of
    different facades, from different threads, go on together.

    Every method raises `ClientStateError` when called from inside a running
    event loop, where blocking would stall it: there, await the `EnvClient`
    itself.

    Examples:
        ```python
        from openenv.examples.echo import CallToolAction, EchoEnv

        with EchoEnv("ws://127.0.0.1:8000").sync() as env:
            result = env.reset()
            for message in ("one", "two"):
                result = env.step(CallToolAction(tool_name="echo_message", arguments={"message": message}))
            print(result.observation.echoed_message, env.state().step_count)  # two 2
        ```

        Without a ``with`` block, pair `connect` with `close`:

        ```python
        from openenv.examples.echo import EchoEnv

        env = EchoEnv("ws://127.0.0.1:8000").sync(backend="trio").connect()
        try:
            env.reset()
        finally:
            env.close()
        ```

    Args:
        client: The async client to drive; it must not be connected yet.
        backend: The event loop to run it on: ``"asyncio"`` (the default) or ``"trio"``.

    Attributes:
        client: The async client this facade drives.
        backend: The event loop it runs on.
    """

    def __init__(self, client: EnvClient[ActT, ObsT, StateT], *, backend: str = "asyncio") -> None:
        self.client = client
        self.backend = backend
        self._holder = Holder("SyncEnvClient", "connected")
        self._calls = LaneCalls()

    def __repr__(self) -> str:
        return f"<SyncEnvClient of {self.client!r}>"

    def connect(self) -> Self:
        """Connect the client; pair with `close` (or use ``with``).

        Ctrl-C while it connects cancels the connect and raises
        `KeyboardInterrupt` at once. A facade never closed is closed when it is
        garbage-collected, or at the latest when the interpreter exits, with a
        `ResourceWarning` (as an unclosed file is): it never keeps the process alive.

        Returns:
            This facade.

        Raises:
            ConnectError: The transport could not connect.
            ClientStateError: Already connected or closed, or called inside an event loop.
            UnsupportedSchemeError: No transport handles the URL's scheme.
            ValueError: The transport rejected the URL or an option.
            TypeError: msgspec cannot decode into the client's types.
        """
        calls, client = self._calls, self.client
        self._holder.open(self, client, self.backend, on_open=lambda: calls.attach(client.transport))
        return self

    def close(self) -> None:
        """Close the client (see `EnvClient.close`) and release the event-loop thread. Idempotent.

        Ctrl-C while it closes cuts the close short (the server is then not told).

        Raises:
            ClientStateError: Called inside an event loop.
        """
        self._holder.close()

    def reset(
        self, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT, **kwargs: Any
    ) -> StepResult[ObsT]:
        """Start a new episode, blocking; see `EnvClient.reset`.

        Args:
            timeout: Seconds to wait for the reply, instead of the client's
                timeout (``None``: no limit).
            **kwargs: Passed to the environment's ``reset`` (``seed``, ``episode_id``, ...).

        Returns:
            The first observation, with its reward and done flag.

        Raises:
            ServerError: The server answered with an error (a subclass per code).
            TimeoutError: No reply within the timeout.
            TransportError: The connection closed or broke, or the server sent a
                malformed frame.
            ReplyValidationError: The reply does not fit the client's observation type.
            EncodingError: A keyword argument cannot be encoded.
            ClientStateError: Not connected, closed, or called inside an event loop.
        """
        if type(self.client).reset is not EnvClient.reset:  # the subclass's own reset: on the event loop
            return self._through_the_loop("reset", lambda: self.client.reset(timeout=timeout, **kwargs))
        requests, reply = self._request("reset", encode_reset, kwargs, timeout)
        return requests.results.of_reply(reply)

    def step(self, action: ActT, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT) -> StepResult[ObsT]:
        """Take one step, blocking; see `EnvClient.step`.

        Args:
            action: The action to apply.
            timeout: Seconds to wait for the reply, instead of the client's
                timeout (``None``: no limit).

        Returns:
            The observation that followed, with its reward and done flag.

        Raises:
            ValidationError: The server rejected the action; the session survives.
            ExecutionError: The environment raised while stepping; the session survives.
            ServerError: Any other error frame (a subclass per code).
            TimeoutError: No reply within the timeout.
            TransportError: The connection closed or broke, or the server sent a
                malformed frame.
            ReplyValidationError: The reply does not fit the client's observation type.
            EncodingError: The action cannot be encoded.
            ClientStateError: Not connected, closed, or called inside an event loop.
        """
        if type(self.client).step is not EnvClient.step:  # the subclass's own step: on the event loop
            return self._through_the_loop("step", lambda: self.client.step(action, timeout=timeout))
        requests, reply = self._request("step", encode_step, action, timeout)
        return requests.results.of_reply(reply)

    def state(self, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT) -> StateT:
        """Ask for the environment's state, blocking; see `EnvClient.state`.

        Args:
            timeout: Seconds to wait for the reply, instead of the client's
                timeout (``None``: no limit).

        Returns:
            The state, of the client's state type (a dict for an untyped client).

        Raises:
            ServerError: The server answered with an error (a subclass per code).
            TimeoutError: No reply within the timeout.
            TransportError: The connection closed or broke, or the server sent a
                malformed frame.
            ReplyValidationError: The reply does not fit the client's state type.
            ClientStateError: Not connected, closed, or called inside an event loop.
        """
        if type(self.client).state is not EnvClient.state:  # the subclass's own state: on the event loop
            return self._through_the_loop("state", lambda: self.client.state(timeout=timeout))
        _, reply = self._request("state", encode_state, None, timeout)
        if not isinstance(reply, StateReply):
            raise ProtocolError(f"expected a state reply, got {type(reply).__name__}")
        return reply.data  # type: ignore[no-any-return]

    def list_tools(self, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT) -> list[Tool]:
        """List the tools of an MCP tool environment, blocking; see `EnvClient.list_tools`.

        Args:
            timeout: Seconds to wait for the reply, instead of the client's
                timeout (``None``: no limit).

        Returns:
            One `Tool` per tool.

        Raises:
            ServerError: The server answered with an error (``VALIDATION_ERROR``:
                the environment has no tools).
            TimeoutError: No reply within the timeout.
            TransportError: The connection closed or broke.
            ReplyValidationError: The reply is not a list of tools.
            ClientStateError: Not connected, closed, or called inside an event loop.
        """
        return self._through_the_loop("list_tools", lambda: self.client.list_tools(timeout=timeout))

    def call_tool(
        self, name: str, *, timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT, **arguments: Any
    ) -> Any:
        """Call one tool and return its result, blocking; see `EnvClient.call_tool`.

        Args:
            name: The tool's name.
            timeout: Seconds to wait for the reply, instead of the client's
                timeout (``None``: no limit).
            **arguments: The tool's arguments.

        Returns:
            What the tool returned.

        Raises:
            ToolCallError: The tool failed; the session survives.
            ServerError: The server answered with an error.
            TimeoutError: No reply within the timeout.
            TransportError: The connection closed or broke.
            EncodingError: An argument cannot be encoded.
            ClientStateError: Not connected, closed, or called inside an event loop.
        """
        return self._through_the_loop("call_tool", lambda: self.client.call_tool(name, timeout=timeout, **arguments))

    def mcp(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        timeout: float | UseClientDefault | None = USE_CLIENT_DEFAULT,
    ) -> Any:
        """Send one MCP (JSON-RPC 2.0) request and return its result, blocking; see `EnvClient.mcp`.

        Args:
            method: The JSON-RPC method.
            params: Its parameters.
            timeout: Seconds to wait for the reply, instead of the client's
                timeout (``None``: no limit).

        Returns:
            The response's ``result``.

        Raises:
            MCPError: The response is an error; the session survives.
            ServerError: The server answered with an error frame.
            TimeoutError: No reply within the timeout.
            TransportError: The connection closed or broke.
            ClientStateError: Not connected, closed, or called inside an event loop.
        """
        return self._through_the_loop("mcp", lambda: self.client.mcp(method, params, timeout=timeout))

    def __getattr__(self, name: str) -> Any:
        """The client's own attribute of that name; a coroutine method of a subclass comes as a blocking one.

        As OpenEnv's sync wrapper does: a typed client's own ``async def``
        helpers (``async def solve(self, ...)``) are called blocking on the
        facade (``env.solve(...)``), on the client's event loop; any other
        attribute is the client's own.

        Args:
            name: The attribute's name.

        Returns:
            The attribute, or a blocking function that runs the coroutine method.

        Raises:
            AttributeError: The client has no such attribute.
        """
        if name.startswith("__") or name in _OWN_ATTRIBUTES:
            raise AttributeError(name)
        client = self.__dict__.get("client")
        if client is None:
            raise AttributeError(name)
        attribute = getattr(client, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute

        @functools.wraps(attribute)
        def blocking(*args: Any, **kwargs: Any) -> Any:
            return self._through_the_loop(name, lambda: getattr(client, name)(*args, **kwargs))

        return blocking

    def _request(
        self, name: str, encode: Encoder, payload: Any, timeout: float | UseClientDefault | None
    ) -> tuple[RequestChannel[ActT, ObsT, StateT], Any]:
        """Make a request on the lane, finishing on the event loop what it cannot; the channel and the reply."""
        portal = self._holder.portal(name)
        client = self.client
        requests = client._requests_or_raise()
        reply = self._calls.make(lambda work: call(portal, work), requests, encode, payload, timeout, client.timeout)
        return requests, reply

    def _through_the_loop(self, name: str, method: Callable[[], Awaitable[_T]]) -> _T:
        """Run one of the client's coroutine methods on the event loop, as the facade's one call at a time."""
        portal = self._holder.portal(name)
        calls = self._calls
        with calls.lock:
            return call(portal, lambda: calls.through_the_loop(method))


_OWN_ATTRIBUTES = frozenset({"client", "backend", "_holder", "_calls"})
