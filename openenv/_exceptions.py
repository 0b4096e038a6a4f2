"""The exceptions openenv raises, and only these.

Every failure a caller can see is one of these classes; no exception of anyio,
msgspec or a transport's I/O library escapes. Cancellation (asyncio's or trio's)
is never caught and always passes through untouched.

Several classes also subclass a builtin, so that generic handlers keep working
(``except TimeoutError``, ``except ConnectionError``, ``except ValueError``).

```text
OpenEnvError
├── TransportError
│   ├── ConnectError            (ConnectionError) the channel could not be opened
│   │   └── AuthenticationError                   the server refused the client's token
│   ├── ConnectionClosed        (ConnectionError) the peer or the network ended it
│   └── ProtocolError                             the peer sent a malformed frame
├── TimeoutError                (TimeoutError)    no reply within the timeout
├── ClientStateError            (RuntimeError)    used before connect or after close
├── UnsupportedSchemeError      (ValueError)      no transport for the URL's scheme
├── EncodingError               (TypeError)       a request cannot be encoded (not serialisable)
├── ReplyValidationError        (ValueError)      a reply does not fit the client's types
├── ToolCallError                                 a tool of an MCP environment failed (session survives)
├── MCPError                                      a JSON-RPC error answered an ``mcp`` request
├── EnvPoolError                                  sessions of an EnvPool failed (the error of each)
└── ServerError                                   the server answered with an error frame
    ├── InvalidJSONError            INVALID_JSON      (session survives)
    ├── UnknownTypeError            UNKNOWN_TYPE      (session survives)
    ├── ValidationError             VALIDATION_ERROR  (session survives)
    ├── ExecutionError              EXECUTION_ERROR   (session survives)
    ├── CapacityReachedError        CAPACITY_REACHED  (fatal: the server ends the session)
    ├── FactoryError                FACTORY_ERROR     (fatal)
    └── SessionError                SESSION_ERROR     (fatal)
```
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

__all__ = [
    "AuthenticationError",
    "CapacityReachedError",
    "ClientStateError",
    "ConnectError",
    "ConnectionClosed",
    "EncodingError",
    "EnvPoolError",
    "ExecutionError",
    "FactoryError",
    "InvalidJSONError",
    "MCPError",
    "OpenEnvError",
    "ProtocolError",
    "ReplyValidationError",
    "ServerError",
    "SessionError",
    "TimeoutError",
    "ToolCallError",
    "TransportError",
    "UnknownTypeError",
    "UnsupportedSchemeError",
    "ValidationError",
    "server_error_from_frame",
]


class OpenEnvError(Exception):
    """The root of every exception openenv raises.

    Catch it to handle any failure of a call, whatever its cause; cancellation is
    never one of them.

    Examples:
        ```python
        import openenv
        from openenv.examples.echo import EchoEnv

        try:
            async with EchoEnv("ws://127.0.0.1:8000") as env:
                await env.reset()
        except openenv.OpenEnvError as exc:
            print(f"the environment failed: {exc}")
        ```
    """


class TransportError(OpenEnvError):
    """The channel to the server failed: it could not be opened, it ended, or it carried garbage.

    After a `ConnectionClosed` (or a `ProtocolError` from the transport itself)
    the session is lost: close the client and connect a new one.
    """


class ConnectError(TransportError, ConnectionError):
    """The transport could not open its channel (refused, unreachable, handshake failed).

    Raised on entering a client (``async with``, `EnvClient.connect`): by a
    refused or unreachable server, a failed TLS or WebSocket handshake (the
    message gives the HTTP status), an elapsed ``connect_timeout``, or an
    ``inproc://`` factory that cannot be imported. Also a builtin `ConnectionError`.

    Examples:
        ```python
        import openenv
        from openenv.examples.echo import EchoEnv

        try:
            async with EchoEnv("inproc://no_such_module:Environment") as env:
                await env.reset()
        except openenv.ConnectError as exc:
            print(exc)  # cannot load the environment factory of 'inproc://no_such_module:Environment': ...
        ```
    """


class AuthenticationError(ConnectError):
    """The server refused the client's credentials: a missing or wrong bearer token (HTTP 401).

    Raised on entering a client (``async with``, `EnvClient.connect`) when the
    server requires a token (``openenv serve --auth-token``) and the client sent
    none or another. No session was opened and no environment built. Give the
    token with the client's ``auth_token=`` option or the ``OPENENV_AUTH_TOKEN``
    environment variable. Also a `ConnectError`.

    Examples:
        ```python
        import openenv
        from openenv.examples.echo import EchoEnv

        try:
            async with EchoEnv("ws://127.0.0.1:8000", auth_token="wrong") as env:
                await env.reset()
        except openenv.AuthenticationError as exc:
            print(exc)  # the server at ws://127.0.0.1:8000/ws refused the token: HTTP 401 ...
        ```
    """


class ConnectionClosed(TransportError, ConnectionError):
    """The channel was closed by the peer, or broken by the network, while in use.

    Raised by a request (`EnvClient.reset`, `EnvClient.step`, `EnvClient.state`)
    whose session ended before its reply came: the server ended it or closed its
    connection (stopped, or ended an idle session), or the network broke the
    connection (or a keepalive ping went unanswered) and it could not be
    resumed; and by a transport's `send` and `receive` after it closed. The
    session is gone; a new client starts a new one. Also a builtin `ConnectionError`.
    """


class ProtocolError(TransportError):
    """The peer sent something that is not a valid frame of the protocol.

    Raised by a request when the reply is not a frame of the protocol at all
    (not JSON or MessagePack, no known ``type``, the wrong kind of reply), or
    answers no request; and by a transport when the server breaks the
    WebSocket or HTTP long-polling protocol, which also ends the connection.
    A reply that is well formed but does not fit the client's types raises
    `ReplyValidationError` instead.
    """


class TimeoutError(OpenEnvError, builtins.TimeoutError):
    """No reply arrived within the timeout.

    Raised by a request after the client's `EnvClient.timeout`, or the call's own
    ``timeout=``. The request may still run on the server. Its late reply is
    recognised and dropped, so it is never handed to a later call, and the session
    goes on. (In plain OpenEnv frames, without request ids, a timeout that cuts
    the request's own sending short closes the client instead, which then says so.)

    It is also the builtin `TimeoutError`, so ``except TimeoutError`` catches it.

    Examples:
        ```python
        import openenv
        from openenv.examples.echo import EchoEnv

        async with EchoEnv("ws://127.0.0.1:8000", timeout=30.0) as env:
            try:
                await env.reset(timeout=5.0)
            except openenv.TimeoutError:
                print("no reply within 5 s; the session goes on")
        ```
    """


class ClientStateError(OpenEnvError, RuntimeError):
    """The client was used before it was connected, or after it was closed.

    Also raised on connecting a client a second time (a client connects once:
    create a new one), and by `SyncEnvClient` called inside a running event
    loop. Also a builtin `RuntimeError`.

    Examples:
        ```python
        import openenv
        from openenv.examples.echo import EchoEnv

        env = EchoEnv("ws://127.0.0.1:8000")
        try:
            await env.reset()  # not connected yet
        except openenv.ClientStateError as exc:
            print(exc)  # the client is not connected: use `async with` or `await client.connect()`
        ```
    """


class UnsupportedSchemeError(OpenEnvError, ValueError):
    """No registered transport handles the URL's scheme.

    Raised by `create_transport`, so on connecting a client; the message lists
    the schemes that are registered. Also a builtin `ValueError`.

    Examples:
        ```python
        import openenv

        try:
            openenv.create_transport("ftp://127.0.0.1:8000")
        except openenv.UnsupportedSchemeError as exc:
            print(exc)  # no transport for the URL scheme 'ftp'; registered schemes: http, http+poll, ...
        ```
    """


class EncodingError(OpenEnvError, TypeError):
    """A request could not be encoded: an action or a reset argument is not serialisable.

    Raised by `EnvClient.step` and `EnvClient.reset` before anything is sent, so
    the session goes on. Also a builtin `TypeError`.

    Examples:
        ```python
        import openenv

        async with openenv.EnvClient("ws://127.0.0.1:8000") as env:
            try:
                await env.reset(seed=object())
            except openenv.EncodingError as exc:
                print(exc)  # cannot encode the request: ...
            await env.reset(seed=1)  # nothing was sent: the session goes on
        ```
    """


class ReplyValidationError(OpenEnvError, ValueError):
    """A reply from the server could not be decoded into the client's types.

    The reply is a well-formed frame, but its data does not fit the client's
    observation or state type (a missing field, a wrong type): the client and
    the server disagree on the types. The reply was consumed, so the session goes
    on. Also a builtin `ValueError`.

    Examples:
        ```python
        import openenv


        class CountObservation(openenv.Observation):
            count: int  # the echo environment sends no count


        async with openenv.EnvClient("ws://127.0.0.1:8000", observation_type=CountObservation) as env:
            try:
                await env.reset()
            except openenv.ReplyValidationError as exc:
                print(exc)  # reply does not match the client's types: Object missing required field `count` ...
        ```
    """


class EnvPoolError(OpenEnvError):
    """Sessions of an `openenv.EnvPool` failed in one call; `errors` holds each one's error.

    Raised by `EnvPool.reset`, `EnvPool.step` and `EnvPool.state` once every
    session's call has finished, when one or more failed and the pool does not
    replace them (``on_error="raise"``, or a caller's mistake such as an invalid
    action). The exception of the lowest failing index is its ``__cause__``.
    Sessions whose error is not `ServerError.fatal` go on; the others are broken.

    Args:
        errors: The error of each failed session, by its index in the pool.

    Attributes:
        errors: The error of each failed session, by its index in the pool.
    """

    def __init__(self, errors: dict[int, OpenEnvError]) -> None:
        self.errors = dict(sorted(errors.items()))
        first, error = next(iter(self.errors.items()))
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"session {first} of the pool failed{more}: {type(error).__name__}: {error}")


class ServerError(OpenEnvError):
    """The server answered a request with an error frame.

    Each code of the protocol has its own subclass; a code this version does not
    know raises `ServerError` itself. Whether the session survives depends on the
    code (`fatal`): after a per-request error (`InvalidJSONError`,
    `UnknownTypeError`, `ValidationError`, `ExecutionError`) the session goes on;
    after a fatal one (`CapacityReachedError`, `FactoryError`, `SessionError`)
    the server has ended it, and the client must be replaced.

    ``str(exc)`` is ``"[CODE] message"``.

    Examples:
        ```python
        import openenv
        from openenv.examples.echo import CallToolAction, EchoEnv

        async with EchoEnv("ws://127.0.0.1:8000") as env:
            await env.reset()
            try:
                await env.step(CallToolAction(tool_name="no_such_tool"))
            except openenv.ServerError as exc:
                print(exc.code, exc.fatal)  # EXECUTION_ERROR False
                print(exc.message)  # ValueError: unknown tool 'no_such_tool'; available: ...
        ```

    Args:
        message: The human-readable message.
        code: The error code; by default the class's `code_name`
            (``"UNKNOWN"`` for `ServerError` itself).
        data: The whole ``data`` object of the error frame; by default built
            from ``message`` and ``code``.

    Attributes:
        code: The error code from the frame (``"EXECUTION_ERROR"``, ...).
        message: The human-readable message from the frame.
        data: The whole ``data`` object of the error frame, with any extra fields.
        code_name: The code a subclass stands for (a class attribute; ``None``
            on `ServerError` itself).
        fatal: Whether the server ends the session after this error (a class
            attribute).
    """

    code_name: ClassVar[str | None] = None
    fatal: ClassVar[bool] = False

    def __init__(self, message: str, *, code: str | None = None, data: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else (self.code_name or "UNKNOWN")
        self.data: dict[str, Any] = data if data is not None else {"message": message, "code": self.code}

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class InvalidJSONError(ServerError):
    """The server could not parse the request frame (``INVALID_JSON``).

    The frame was not JSON (or MessagePack, in that dialect), or came in the
    wrong kind of WebSocket frame. The session goes on. openenv's client never
    sends such a frame; it means a bug in a transport or a proxy on the way.
    """

    code_name = "INVALID_JSON"


class UnknownTypeError(ServerError):
    """The server does not know the request's message type (``UNKNOWN_TYPE``).

    The session goes on. openenv's client sends only the four types OpenEnv
    defines (``reset``, ``step``, ``state``, ``close``).
    """

    code_name = "UNKNOWN_TYPE"


class ValidationError(ServerError):
    """The server rejected the request's data, usually an invalid action (``VALIDATION_ERROR``).

    Raised by `EnvClient.step` when the action does not fit the environment's
    action type (a missing or unknown field, a wrong type), and by
    `EnvClient.reset` for reset data that is not an object. The environment
    never saw the request, and the session goes on.

    Examples:
        ```python
        import openenv

        async with openenv.EnvClient("ws://127.0.0.1:8000") as env:
            await env.reset()
            try:
                await env.step({"tool_name": "echo_message", "colour": "blue"})
            except openenv.ValidationError as exc:
                print(exc)  # [VALIDATION_ERROR] Invalid message: Object contains unknown field `colour` (at colour)
                print(exc.errors[0]["type"], exc.errors[0]["loc"])  # extra_forbidden ['colour']
        ```

    Attributes:
        errors: The problems found, one dict each with ``type``, ``loc`` and
            ``msg`` (and ``input``, as OpenEnv's pydantic-shaped errors have).
            openenv's server reports the first problem only; OpenEnv's may
            report several. ``str(exc)`` includes each ``msg`` and ``loc``.
    """

    code_name = "VALIDATION_ERROR"

    @property
    def errors(self) -> list[dict[str, Any]]:
        """The list of problems the server reported (may be empty)."""
        errors = self.data.get("errors")
        return errors if isinstance(errors, list) else []

    def __str__(self) -> str:
        """``"[VALIDATION_ERROR] message: why (at field); ..."``: the reasons, not only the headline."""
        reasons = []
        for error in self.errors:
            if not isinstance(error, dict) or not error.get("msg"):
                continue
            loc = error.get("loc")
            where = ".".join(str(part) for part in loc) if isinstance(loc, (list, tuple)) else ""
            reasons.append(f"{error['msg']} (at {where})" if where else str(error["msg"]))
        return super().__str__() + (": " + "; ".join(reasons) if reasons else "")


class ExecutionError(ServerError):
    """The environment raised while handling the request (``EXECUTION_ERROR``).

    Its `message` names the environment's exception (``"ValueError: ..."``); the
    traceback stays in the server's log. Also raised when the environment returned
    something that cannot be encoded. The session goes on: the environment is
    whatever state its exception left it in.

    Examples:
        ```python
        import openenv
        from openenv.examples.echo import CallToolAction, EchoEnv

        async with EchoEnv("ws://127.0.0.1:8000") as env:
            await env.reset()
            try:
                await env.step(CallToolAction(tool_name="echo_message", arguments={"message": 42}))
            except openenv.ExecutionError as exc:
                print(exc.message)  # ValueError: message must be a string, not int
        ```
    """

    code_name = "EXECUTION_ERROR"


class CapacityReachedError(ServerError):
    """The server has no free session slot (``CAPACITY_REACHED``); it ends the connection.

    The server accepts the connection, sends this error and closes it, as
    OpenEnv's does; the client raises it from its first request. Fatal: connect
    a new client later. Its `data` carries ``active_sessions`` and ``max_sessions``.

    Examples:
        ```python
        import openenv
        from openenv.examples.echo import EchoEnv, EchoEnvironment

        async with openenv.serve(EchoEnvironment, port=0, max_sessions=1) as server:
            async with EchoEnv(server.url) as first, EchoEnv(server.url) as second:
                await first.reset()
                try:
                    await second.reset()
                except openenv.CapacityReachedError as exc:
                    print(exc.data["active_sessions"], exc.data["max_sessions"])  # 1 1
        ```
    """

    code_name = "CAPACITY_REACHED"
    fatal = True


class FactoryError(ServerError):
    """The server could not create the environment (``FACTORY_ERROR``); it ends the connection.

    The environment's factory (its class, usually) raised when the session
    started; the client raises this from its first request. Fatal. Its `data`
    carries ``factory_name``.

    Examples:
        ```python
        import openenv


        def broken_environment() -> openenv.Environment:
            raise RuntimeError("no GPU left")


        async with openenv.serve(broken_environment, port=0) as server:
            async with openenv.EnvClient(server.url) as env:
                try:
                    await env.reset()
                except openenv.FactoryError as exc:
                    print(exc.message)  # Failed to create environment: RuntimeError: no GPU left
        ```
    """

    code_name = "FACTORY_ERROR"
    fatal = True


class SessionError(ServerError):
    """The server's session failed (``SESSION_ERROR``); it ends the connection.

    The server itself failed while hosting the session (not the environment: that
    is an `ExecutionError`). OpenEnv's reference server also sends it for some
    malformed frames. Fatal: connect a new client.
    """

    code_name = "SESSION_ERROR"
    fatal = True


class ToolCallError(OpenEnvError):
    """A tool of an MCP environment failed: `EnvClient.call_tool` got an observation with an error.

    The session survives.

    Examples:
        ```python
        import openenv
        from openenv.examples.echo import EchoEnv

        async with EchoEnv("ws://127.0.0.1:8000") as env:
            try:
                await env.call_tool("no_such_tool")
            except openenv.ToolCallError as exc:
                print(exc.tool_name, exc.error_type)  # no_such_tool tool_not_found
        ```

    Args:
        tool_name: The tool called.
        error_type: The kind of failure, as OpenEnv names it (``tool_not_found``,
            ``invalid_args``, ``execution_error``, ``timeout``, ``transport_error``).
        message: The tool's error message.

    Attributes:
        tool_name: The tool called.
        error_type: The kind of failure.
        message: The tool's error message.
    """

    def __init__(self, tool_name: str, error_type: str, message: str) -> None:
        super().__init__(f"tool {tool_name!r} failed ({error_type}): {message}")
        self.tool_name = tool_name
        self.error_type = error_type
        self.message = message


class MCPError(OpenEnvError):
    """The server answered an ``mcp`` request (JSON-RPC 2.0) with an error.

    The session survives.

    Args:
        code: The JSON-RPC error code (``-32601`` method not found, ``-32602``
            invalid params, ``-32603`` internal error, ...).
        message: The error's message.
        data: The error's ``data``, if any.

    Attributes:
        code: The JSON-RPC error code.
        message: The error's message.
        data: The error's ``data``, or ``None``.
    """

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} (JSON-RPC error {code})")
        self.code = code
        self.message = message
        self.data = data


_BY_CODE: dict[str, type[ServerError]] = {
    cls.code_name: cls
    for cls in (
        InvalidJSONError,
        UnknownTypeError,
        ValidationError,
        ExecutionError,
        CapacityReachedError,
        FactoryError,
        SessionError,
    )
    if cls.code_name is not None
}


def server_error_from_frame(data: dict[str, Any]) -> ServerError:
    """Build the typed exception for the ``data`` object of an error frame.

    Args:
        data: The error frame's ``data``: at least ``message`` and ``code``.

    Returns:
        An instance of the class registered for the code, or of `ServerError`
        itself for a code this version does not know.
    """
    code = str(data.get("code", "UNKNOWN"))
    message = str(data.get("message", "")) or code
    cls = _BY_CODE.get(code, ServerError)
    return cls(message, code=code, data=data)
