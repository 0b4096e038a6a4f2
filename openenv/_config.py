"""`ServerConfig`: every option of a server, with its one default, checked by msgspec.

A server is configured in one place, whichever way it is started:
`openenv.serve`, ``transports.server.runner.serve`` and ``run``, ``transports.server.app.create_app``
and the ``openenv serve`` command all build a `ServerConfig` and read it. Each
of them takes the fields as keyword options too (typed by `ServerOptions`), so
``openenv.serve(Env, max_sessions=4)`` and
``openenv.serve(Env, config=ServerConfig(max_sessions=4))`` are the same server.

It lives in ``openenv``, not ``transports``: `openenv.serve` takes it and
checks it before it reaches for the server, and it is plain data (no I/O
library is imported to describe one).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Final, Literal, TypedDict, TypeVar

import msgspec
from msgspec import Meta

__all__ = [
    "SERVER_DEFAULTS",
    "LogLevel",
    "ServerConfig",
    "ServerName",
    "ServerOptions",
    "check_options",
    "explicit_fields",
    "server_config",
    "type_text",
]

ServerName = Literal["uvicorn", "hypercorn", "hypercorn+websockets"]
"""The servers that can run the app: uvicorn (asyncio only), hypercorn (either), hypercorn+websockets (trio only)."""

LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]
"""The levels of the servers' loggers."""


class ServerConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How a server serves an environment: its bounds, timeouts, checks and logging.

    Every option's default is here, and only here. Options marked *the app's*
    belong to the ASGI app (``transports.server.app.create_app``): a server given a
    ready app takes them from the app, and refuses them in its own call. The
    others belong to the ASGI server that runs the app (``openenv.serve``,
    ``openenv serve``); an app run by another ASGI server has only the app's.

    Building one checks nothing; every function that takes one checks it (with
    ``msgspec.convert``) and raises `ValueError` or `TypeError` naming the option.

    Examples:
        ```python
        import openenv
        from openenv.examples.echo import EchoEnv, EchoEnvironment

        config = openenv.ServerConfig(max_sessions=4, session_idle_timeout=60.0)
        async with openenv.serve(EchoEnvironment, config=config, port=0) as server:
            async with EchoEnv(server.url) as env:
                await env.reset()
        print(config.max_message_size)  # 16777216
        ```
    """

    APP_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {
            "max_sessions",
            "queue_timeout",
            "session_idle_timeout",
            "http_idle_timeout",
            "max_message_size",
            "auth_token",
            "allow_origins",
            "error_details",
            "metrics",
            "resume_timeout",
            "max_sessions_per_client",
            "step_timeout",
            "body_timeout",
            "allowed_hosts",
        }
    )
    """The app's fields: those ``create_app`` reads (the others are the ASGI server's)."""

    server: ServerName | None = None
    """Which ASGI server runs the app: ``"uvicorn"`` (asyncio only), ``"hypercorn"``, or
    ``"hypercorn+websockets"`` (trio only: hypercorn, with WebSocket connections served by
    ``websockets``' protocol); ``None``: uvicorn on asyncio, hypercorn+websockets on trio."""

    max_sessions: Annotated[int, Meta(ge=1)] | None = 256
    """The app's: the most sessions open at once over all transports; beyond, a client gets
    ``CAPACITY_REACHED``. ``None`` for no limit."""

    queue_timeout: Annotated[float, Meta(gt=0)] | None = None
    """The app's: seconds a new session may wait for a slot when ``max_sessions`` are open, admitted
    in arrival order, before it gets ``CAPACITY_REACHED``; ``None`` refuses it at once, as OpenEnv does."""

    session_idle_timeout: Annotated[float, Meta(gt=0)] | None = 600.0
    """The app's: seconds a session may go without its client before the server ends it; ``None``
    for never. It counts only while the session has no request in hand and no connection open to its
    client (an HTTP long-polling session between requests, an MCP session made over ``POST /mcp``
    with no WebSocket attached): a WebSocket session lasts as long as its connection, however quiet."""

    http_idle_timeout: Annotated[float, Meta(gt=0)] | None = 300.0
    """The app's: the same for HTTP long-polling sessions, whose clients cannot be seen leaving: a
    session nobody deletes ends after it (or after ``session_idle_timeout``, if shorter). ``None``
    leaves only ``session_idle_timeout``."""

    max_message_size: Annotated[int, Meta(ge=1)] = 16 * 1024 * 1024
    """The app's: the largest request accepted, in bytes: a WebSocket message (a larger one ends its
    own connection, close code 1009) or an HTTP request body (``413``); refused as it arrives, before
    it is buffered whole."""

    auth_token: str | tuple[str, ...] | None = None
    """The app's: the bearer token every request but ``GET /health`` must carry
    (``Authorization: Bearer <token>``), or several (any one is accepted); ``None`` takes it from
    ``OPENENV_AUTH_TOKEN`` if that is set; ``()`` accepts requests without one. A missing or wrong
    token gets ``401`` before any environment is built."""

    allow_origins: tuple[str, ...] = ()
    """The app's: the browser origins (``"https://app.example"``; ``"*"`` for any) whose requests are
    accepted, with CORS headers. A request with any other ``Origin`` gets ``403``; requests without
    one (every client but a browser) are not affected."""

    error_details: bool = True
    """The app's: whether error replies say what failed on the server (the exception an environment
    or its factory raised, and the factory's name, as OpenEnv's do). ``False`` sends generic
    messages, so no path or module name leaves the server; the log keeps the details."""

    metrics: bool = False
    """The app's: serve ``GET /metrics`` for Prometheus: sessions, steps and resets with their latency,
    errors by code, bytes, per environment (``transports.server._metrics``). Behind the same token as every
    route but ``/health``. Off by default: counting costs each request about a microsecond."""

    resume_timeout: Annotated[float, Meta(ge=0)] = 30.0
    """The app's: seconds the sessions of a link (a WebSocket connection carrying many, ``openenv.v2.*``)
    wait for their client to take the link over on a new connection after it drops; then they end. A
    client may ask for less (``OpenEnv-Resume-Timeout``; 0 when it will not resume)."""

    max_sessions_per_client: Annotated[int, Meta(ge=1)] | None = None
    """The app's: the most sessions one client may hold at once over all transports, queued ones
    included; a client is the token it presents, or else its address. Past it the client gets
    ``CAPACITY_REACHED`` saying so; other clients are unaffected. ``None`` (the default) for no
    quota: a trainer often runs all its sessions from one process with one token, and any default
    below ``max_sessions`` would refuse it."""

    step_timeout: Annotated[float, Meta(gt=0)] | None = None
    """The app's: seconds one request (a reset, a step, a tool call) may run before the server gives
    up on it: the session ends (WebSocket close 1001 "step timeout"; an HTTP session ends with that
    reason) and frees its slot. A plain (``def``) step cannot be stopped: it runs on in its thread
    until it returns. ``None`` (the default) lets a step run as long as its client stays, as a step
    may take minutes (an evaluation, a long tool call); a step whose client has gone is given up on
    in any case."""

    body_timeout: Annotated[float, Meta(gt=0)] = 10.0
    """The app's: seconds a request's body may take to arrive once the app reads it, plus one for
    every 64 KiB received; a slower body gets ``408`` and its connection is closed."""

    allowed_hosts: tuple[str, ...] = ()
    """The app's: host names (``"env.internal"``; ``"*"`` for any) a server without a token answers,
    beside IP addresses and ``localhost``: a request for another ``Host`` gets ``403``, so a web page
    cannot reach the server by a name of its own (DNS rebinding). With a token, every ``Host`` is
    answered."""

    header_timeout: Annotated[float, Meta(gt=0)] = 10.0
    """Seconds a connection may take to send a request's headers (the WebSocket handshake's
    included), from its first byte or the connection's start; then it is closed."""

    max_connections: Annotated[int, Meta(ge=1)] | None = 1000
    """The most connections at once, on every server (beyond, requests get ``503``), lowered to fit
    the process's open-file limit (said in the log); ``None`` for no limit but that one."""

    shutdown_timeout: Annotated[float, Meta(ge=0)] = 5.0
    """Seconds a stopping server gives open sessions to finish the request in hand before they are cut."""

    startup_timeout: Annotated[float, Meta(gt=0)] = 30.0
    """Seconds the server may take to start (``openenv.serve`` raises `TimeoutError` beyond)."""

    public_io: bool = False
    """Serve with the ASGI servers' stock public classes only, without openenv's speed paths
    (uvicorn's WebSocket protocol reading and writing small frames itself and lending its socket
    to a session's thread; hypercorn+websockets): slower, and free of their internals, for when an
    upgrade broke one. The default server is then hypercorn on both backends, and
    hypercorn+websockets is plain hypercorn. ``OPENENV_PUBLIC_IO=1`` in the environment turns it on
    for every server and client of the process."""

    log_level: LogLevel | None = None
    """The level of the server's own loggers; ``None``: ``"warning"`` for a server in a program
    (``openenv.serve``), ``"info"`` for ``run`` and the ``openenv serve`` command. The process's
    logging configuration is replaced only by the command."""


class ServerOptions(TypedDict, total=False):
    """`ServerConfig`'s fields as keyword options (``openenv.serve(Env, max_sessions=4)``), for type checkers."""

    server: ServerName | None
    max_sessions: int | None
    queue_timeout: float | None
    session_idle_timeout: float | None
    http_idle_timeout: float | None
    max_message_size: int
    auth_token: str | typing.Sequence[str] | None
    allow_origins: typing.Sequence[str]
    error_details: bool
    metrics: bool
    resume_timeout: float
    max_sessions_per_client: int | None
    step_timeout: float | None
    body_timeout: float
    allowed_hosts: typing.Sequence[str]
    header_timeout: float
    max_connections: int | None
    shutdown_timeout: float
    startup_timeout: float
    public_io: bool
    log_level: LogLevel | None


SERVER_DEFAULTS: Final = ServerConfig()
"""Every option at its default: the values the server-side components take when not told otherwise."""


def server_config(config: ServerConfig | None = None, options: Mapping[str, Any] | None = None) -> ServerConfig:
    """``config`` (or the defaults) with ``options`` replacing its fields, checked.

    Args:
        config: The configuration to start from; the defaults when ``None``.
        options: `ServerConfig` fields by name, replacing ``config``'s.

    Returns:
        The checked configuration (sequences given for ``auth_token`` and
        ``allow_origins`` become tuples).

    Raises:
        TypeError: ``config`` is not a `ServerConfig`, an option is not one of its
            fields (the message lists them), or a value is not of its field's type.
        ValueError: A value out of its field's range, or not one of its choices.
    """
    if config is not None and not isinstance(config, ServerConfig):
        raise TypeError(f"config= takes a ServerConfig, not {type(config).__name__}")
    fields = msgspec.structs.asdict(config if config is not None else SERVER_DEFAULTS)
    if options:
        fields.update(options)
    return check_options(ServerConfig, fields)


_StructT = TypeVar("_StructT", bound=msgspec.Struct)


def check_options(kind: type[_StructT], options: Mapping[str, Any], *, of: str = "") -> _StructT:
    """Check ``options`` against the Struct ``kind`` with msgspec, in words that name the option.

    Args:
        kind: The Struct whose fields are the options (their names, types,
            defaults and bounds).
        options: The options given, by name.
        of: Whose options they are, for the messages (``"ws:// URLs"``).

    Returns:
        The options converted to ``kind``.

    Raises:
        TypeError: An option ``kind`` has no field for (unless it takes unknown
            fields; the message lists those it has), or a value not of its
            field's type.
        ValueError: A value out of its field's bounds, or not one of its choices.
    """
    if kind.__struct_config__.forbid_unknown_fields:
        unknown = sorted(set(options) - set(kind.__struct_fields__))
        if unknown:
            raise TypeError(
                f"unknown option {', '.join(name + '=' for name in unknown)}{' for ' + of if of else ''}; "
                f"the options are: {', '.join(sorted(kind.__struct_fields__))}"
            )
    try:
        return msgspec.convert(dict(options), kind)
    except msgspec.ValidationError as exc:
        raise _option_error(kind, options, exc, of=of) from None


def _option_error(
    kind: type[msgspec.Struct], options: Mapping[str, Any], exc: msgspec.ValidationError, *, of: str
) -> Exception:
    """Msgspec's complaint about one option, as a `TypeError` or `ValueError` naming the option and its type."""
    detail, _, path = str(exc).partition(" - at `$.")
    name = re.split(r"[`.\[]", path, maxsplit=1)[0]
    if name not in options:  # not one option's fault: msgspec's words are the best there are
        return TypeError(f"bad options{' for ' + of if of else ''}: {exc}")
    value = options[name]
    hint = typing.get_type_hints(kind, include_extras=True)[name]
    if detail.startswith("Invalid enum value"):
        choices = ", ".join(repr(choice) for choice in _members(hint) if choice is not None)
        return ValueError(f"unknown {name} {value!r}{' for ' + of if of else ''}; use one of {choices}")
    subject = f"the {name}= option{' of ' + of if of else ''}"
    if ", got `" not in detail:  # the right type, out of its bounds
        bound = detail.removeprefix("Expected ").replace("`", "")
        return ValueError(f"{subject} must be {bound}{' (or None)' if None in _members(hint) else ''}, not {value!r}")
    return TypeError(f"{subject} takes {type_text(hint)}, not {type(value).__name__} ({value!r:.60})")


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _members(hint: Any) -> list[Any]:
    """The members of a union, with the values of its literals, flattened (``None`` for ``None``)."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        return _members(typing.get_args(hint)[0])
    if origin is Literal:
        return list(typing.get_args(hint))
    if _is_union(hint):
        return [member for argument in typing.get_args(hint) for member in _members(argument)]
    return [None] if hint is None or hint is type(None) else [hint]


def type_text(hint: Any) -> str:
    """A declared type as a reader writes it (``float | None``, ``ssl.SSLContext``), bounds left out.

    Args:
        hint: The type, as ``typing.get_type_hints`` gives it.

    Returns:
        Its text.
    """
    if hint is None or hint is type(None):
        return "None"
    if typing.get_origin(hint) is Annotated:
        return type_text(typing.get_args(hint)[0])
    if _is_union(hint):
        return " | ".join(type_text(argument) for argument in typing.get_args(hint))
    if isinstance(hint, type) and not typing.get_args(hint):
        package = hint.__module__.partition(".")[0]
        return hint.__qualname__ if package == "builtins" else f"{package}.{hint.__qualname__}"
    return str(hint).replace("typing.", "").replace("collections.abc.", "")


def explicit_fields(config: ServerConfig | None, options: Mapping[str, Any]) -> set[str]:
    """The fields a caller set: given as options, or changed from the default in ``config``.

    Args:
        config: The configuration given, if any.
        options: The options given.

    Returns:
        Their names.
    """
    given = set(options)
    if config is not None:
        given.update(
            name for name in ServerConfig.__struct_fields__ if getattr(config, name) != getattr(SERVER_DEFAULTS, name)
        )
    return given
