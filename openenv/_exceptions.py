"""The exceptions openenv raises, and only these.

Every failure a caller can see is one of these classes; no exception of anyio,
msgspec or a transport's I/O library escapes. Cancellation (asyncio's or trio's)
is never caught and always passes through untouched.

Several classes also subclass a builtin, so that generic handlers keep working
(``except TimeoutError``, ``except ConnectionError``, ``except ValueError``).

```
OpenEnvError
├── TransportError
│   ├── ConnectError            (ConnectionError) the channel could not be opened
│   ├── ConnectionClosed        (ConnectionError) the peer or the network ended it
│   └── ProtocolError                             the peer sent a malformed frame
├── TimeoutError                (TimeoutError)    no reply within the timeout
├── ClientStateError            (RuntimeError)    used before connect or after close
├── UnsupportedSchemeError      (ValueError)      no transport for the URL's scheme
├── EncodingError               (TypeError)       a request cannot be encoded (not serialisable)
├── ReplyValidationError        (ValueError)      a reply does not fit the client's types
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
    "CapacityReachedError",
    "ClientStateError",
    "ConnectError",
    "ConnectionClosed",
    "EncodingError",
    "ExecutionError",
    "FactoryError",
    "InvalidJSONError",
    "OpenEnvError",
    "ProtocolError",
    "ReplyValidationError",
    "ServerError",
    "SessionError",
    "TimeoutError",
    "TransportError",
    "UnknownTypeError",
    "UnsupportedSchemeError",
    "ValidationError",
    "server_error_from_frame",
]


class OpenEnvError(Exception):
    """The root of every exception openenv raises."""


class TransportError(OpenEnvError):
    """The channel to the server failed; the client cannot use it any more."""


class ConnectError(TransportError, ConnectionError):
    """The transport could not open its channel (refused, unreachable, handshake failed)."""


class ConnectionClosed(TransportError, ConnectionError):
    """The channel was closed by the peer, or broken by the network, while in use."""


class ProtocolError(TransportError):
    """The peer sent something that is not a valid frame of the protocol."""


class TimeoutError(OpenEnvError, builtins.TimeoutError):
    """No reply arrived within the timeout.

    The request may still run on the server. Its late reply is recognised and
    dropped, so it is never handed to a later call.
    """


class ClientStateError(OpenEnvError, RuntimeError):
    """The client was used before it was connected, or after it was closed."""


class UnsupportedSchemeError(OpenEnvError, ValueError):
    """No registered transport handles the URL's scheme."""


class EncodingError(OpenEnvError, TypeError):
    """A request could not be encoded: an action or a reset argument is not serialisable."""


class ReplyValidationError(OpenEnvError, ValueError):
    """A reply from the server could not be decoded into the client's types."""


class ServerError(OpenEnvError):
    """The server answered a request with an error frame.

    Attributes:
        code: The error code from the frame (``"EXECUTION_ERROR"``, ...).
        message: The human-readable message from the frame.
        data: The whole ``data`` object of the error frame, with any extra fields.
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
    """The server could not parse the request frame (``INVALID_JSON``)."""

    code_name = "INVALID_JSON"


class UnknownTypeError(ServerError):
    """The server does not know the request's message type (``UNKNOWN_TYPE``)."""

    code_name = "UNKNOWN_TYPE"


class ValidationError(ServerError):
    """The server rejected the request's data, usually an invalid action (``VALIDATION_ERROR``).

    Attributes:
        errors: One dict per problem found, each with ``type``, ``loc`` and ``msg``.
    """

    code_name = "VALIDATION_ERROR"

    @property
    def errors(self) -> list[dict[str, Any]]:
        """The list of problems the server reported (may be empty)."""
        errors = self.data.get("errors")
        return errors if isinstance(errors, list) else []


class ExecutionError(ServerError):
    """The environment raised while handling the request (``EXECUTION_ERROR``)."""

    code_name = "EXECUTION_ERROR"


class CapacityReachedError(ServerError):
    """The server has no free session slot (``CAPACITY_REACHED``); it ends the connection."""

    code_name = "CAPACITY_REACHED"
    fatal = True


class FactoryError(ServerError):
    """The server could not create the environment (``FACTORY_ERROR``); it ends the connection."""

    code_name = "FACTORY_ERROR"
    fatal = True


class SessionError(ServerError):
    """The server's session failed (``SESSION_ERROR``); it ends the connection."""

    code_name = "SESSION_ERROR"
    fatal = True


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
