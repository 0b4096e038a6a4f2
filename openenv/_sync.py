"""`SyncEnvClient`: the blocking facade of an `EnvClient`, on anyio's blocking portal."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic

import anyio.lowlevel
from anyio.from_thread import BlockingPortal, BlockingPortalProvider

from ._client import USE_CLIENT_DEFAULT, EnvClient, _UseClientDefault
from ._exceptions import ClientStateError
from ._mcp_types import Tool
from ._types import ActT, ObsT, StateT, StepResult

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["SyncEnvClient"]

# One event-loop thread per backend, shared by every sync client that is open and
# started on demand; it stops when the last of them closes.
_providers: dict[str, BlockingPortalProvider] = {}
_providers_lock = threading.Lock()


def _provider(backend: str) -> BlockingPortalProvider:
    with _providers_lock:
        provider = _providers.get(backend)
        if provider is None:
            provider = _providers[backend] = BlockingPortalProvider(backend=backend)
        return provider


def _refuse_inside_event_loop(name: str) -> None:
    try:
        anyio.lowlevel.current_token()
    except RuntimeError:
        return  # no event loop in this thread: blocking is fine
    raise ClientStateError(
        f"SyncEnvClient.{name}() blocks, so it cannot run inside an event loop; "
        "await the EnvClient's own methods instead"
    )


class SyncEnvClient(Generic[ActT, ObsT, StateT]):
    """The same client, blocking: for scripts, notebooks and training loops without async.

    Get one from `EnvClient.sync`. It runs the async client on an event loop in a
    background thread (anyio's blocking portal, shared by all sync clients of a
    backend, started with the first and stopped with the last), so it behaves
    exactly as the async client does, under asyncio or trio, and raises the same
    exceptions.

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
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._client_cm: AbstractContextManager[Any] | None = None

    def __repr__(self) -> str:
        return f"<SyncEnvClient of {self.client!r}>"

    def __enter__(self) -> Self:
        """Connect (see `connect`); the end of the ``with`` block closes the client.

        Returns:
            This facade.

        Raises:
            ConnectError: The transport could not connect.
            ClientStateError: Already connected or closed, or called inside an event loop.
        """
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def connect(self) -> Self:
        """Connect the client; pair with `close` (or use ``with``).

        Returns:
            This facade.

        Raises:
            ConnectError: The transport could not connect.
            ClientStateError: Already connected or closed, or called inside an event loop.
            UnsupportedSchemeError: No transport handles the URL's scheme.
            ValueError: The transport rejected the URL or an option.
            TypeError: The transport does not take an option given, or msgspec
                cannot decode into the client's types.
        """
        _refuse_inside_event_loop("connect")
        if self._portal is not None:
            raise ClientStateError("this SyncEnvClient is already connected")
        portal_cm = _provider(self.backend)
        portal = portal_cm.__enter__()
        try:
            # Entered and left in one task of the portal, as the transport needs.
            client_cm = portal.wrap_async_context_manager(self.client)
            client_cm.__enter__()
        except BaseException:
            portal_cm.__exit__(None, None, None)
            raise
        self._portal_cm, self._portal, self._client_cm = portal_cm, portal, client_cm
        return self

    def close(self) -> None:
        """Close the client (see `EnvClient.close`) and release the event-loop thread. Idempotent.

        Raises:
            ClientStateError: Called inside an event loop.
        """
        _refuse_inside_event_loop("close")
        client_cm, portal_cm = self._client_cm, self._portal_cm
        self._client_cm = self._portal_cm = self._portal = None
        try:
            if client_cm is not None:
                client_cm.__exit__(None, None, None)
        finally:
            if portal_cm is not None:
                portal_cm.__exit__(None, None, None)

    def _portal_or_raise(self, name: str) -> BlockingPortal:
        _refuse_inside_event_loop(name)
        if self._portal is None:
            raise ClientStateError("the SyncEnvClient is not connected: use `with` or call connect()")
        return self._portal

    def reset(
        self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT, **kwargs: Any
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
        portal = self._portal_or_raise("reset")
        return portal.call(lambda: self.client.reset(timeout=timeout, **kwargs))

    def step(self, action: ActT, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT) -> StepResult[ObsT]:
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
        portal = self._portal_or_raise("step")
        return portal.call(lambda: self.client.step(action, timeout=timeout))

    def state(self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT) -> StateT:
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
        portal = self._portal_or_raise("state")
        return portal.call(lambda: self.client.state(timeout=timeout))

    def list_tools(self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT) -> list[Tool]:
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
        portal = self._portal_or_raise("list_tools")
        return portal.call(lambda: self.client.list_tools(timeout=timeout))

    def call_tool(
        self, name: str, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT, **arguments: Any
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
        portal = self._portal_or_raise("call_tool")
        return portal.call(lambda: self.client.call_tool(name, timeout=timeout, **arguments))

    def mcp(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT,
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
        portal = self._portal_or_raise("mcp")
        return portal.call(lambda: self.client.mcp(method, params, timeout=timeout))
