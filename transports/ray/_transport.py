"""`RayTransport`: ``ray://package.module:Factory``, an environment session hosted on a Ray cluster."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl

from openenv import ConnectError, ConnectionClosed, Transport
from openenv._batch import LinkStepBatcher
from openenv.server import server_config
from transports.ray._fleet import Fleet, HostActor, fleet_for
from transports.shared._network_client import connect_once
from transports.websocket import WebSocketTransport
from transports.websocket._link import LinkChannel

__all__ = ["RayTransport", "parse_ray_url"]

_DEFAULT_SESSIONS_PER_ACTOR = 256
_DEFAULT_IDLE_TIMEOUT = 60.0
_DEFAULT_START_TIMEOUT = 120.0

# The options a URL's query may set (``ray://pkg.mod:Factory?num_cpus=0.5&sessions_per_actor=64``), and their types.
_QUERY_OPTIONS: dict[str, Callable[[str], Any]] = {
    "address": str,
    "sessions_per_actor": int,
    "num_cpus": float,
    "num_gpus": float,
    "memory": int,
    "host": str,
    "idle_timeout": float,
    "start_timeout": float,
    "scheduling_strategy": str,
}

# Ray starts its workers at nice 15, behind every other process of the node; a server whose clients
# wait on each step must not queue behind them. Each worker applies this variable to itself.
_WORKER_NICENESS = "RAY_worker_niceness"

# Tries at placing a session when the actor picked turns out to be unreachable (its node died).
_PLACEMENT_TRIES = 3


def parse_ray_url(url: str) -> tuple[str, dict[str, Any]]:
    """Split a ``ray://package.module:Factory?option=value&...`` URL.

    Args:
        url: The URL.

    Returns:
        The factory's name and the options of the query, converted to their types.

    Raises:
        ValueError: The URL does not name a factory, or its query has an unknown
            option or a value of the wrong type.
    """
    scheme, separator, rest = url.partition("://")
    factory, _, query = rest.partition("?")
    module, colon, attribute = factory.partition(":")
    if scheme.lower() != "ray" or not separator or not colon or not module or not attribute or "/" in factory:
        raise ValueError(f"{url!r} is not a ray://package.module:Factory URL")
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        convert = _QUERY_OPTIONS.get(name)
        if convert is None:
            raise ValueError(f"unknown option {name!r} in {url!r}; a ray:// URL takes {', '.join(_QUERY_OPTIONS)}")
        try:
            options[name] = convert(value)
        except ValueError:
            raise ValueError(f"option {name}={value!r} in {url!r} is not a valid {convert.__name__}") from None
    return factory, options


def _server_runtime_env(runtime_env: Mapping[str, Any] | None) -> dict[str, Any]:
    """The actors' runtime environment: the caller's, with their worker at nice 0 unless it says otherwise."""
    merged = dict(runtime_env or {})
    merged["env_vars"] = {_WORKER_NICENESS: "0", **(merged.get("env_vars") or {})}
    return merged


class RayTransport(Transport):
    """One environment session on a Ray cluster: ``ray://package.module:Factory``.

    Ray places, starts and stops the servers; the session's frames go over a
    WebSocket straight to the server that hosts it. Each server is a Ray actor
    (`transports.ray.EnvHost`) that hosts up to ``sessions_per_actor`` sessions;
    a session takes a slot on an actor with room, or a new actor is started. The
    slot is freed when the session closes, and an actor left without sessions is
    stopped after ``idle_timeout`` seconds. An actor (or node) that dies ends its
    own sessions with `openenv.ConnectionClosed` and no others.

    The process connects to Ray on the first connect if it is not connected yet:
    to ``address``, else to ``RAY_ADDRESS``, else to a new local cluster. The
    factory is imported on the actor's node, so its package must be installed
    there (or shipped with ``runtime_env``).

    Examples:
        <!-- docs-test: skip (needs a Ray cluster) -->
        ```python
        from openenv import EnvPool
        from openenv.examples.echo import EchoEnv

        async with EnvPool(
            "ray://openenv.examples.echo:EchoEnvironment", size=512, client=EchoEnv, sessions_per_actor=128, num_cpus=1
        ) as pool:
            await pool.reset()
        ```

    The simple options may also be given in the URL's query string
    (``ray://package.module:Factory?num_cpus=0.5&sessions_per_actor=64``), for
    tools that take only a URL (``openenv bench``); an option is given once.

    Args:
        url: ``ray://package.module:Factory``, with options in a query string if you like.
        address: The Ray cluster to connect to if this process is not connected
            yet (``"auto"``, ``"ray://head:10001"``, ...).
        sessions_per_actor: The most sessions one actor hosts (256 by default).
        num_cpus: CPUs Ray reserves for each actor (1 by default).
        num_gpus: GPUs Ray reserves for each actor.
        memory: Bytes of memory Ray reserves for each actor.
        resources: Custom Ray resources each actor needs.
        runtime_env: The actors' Ray runtime environment (packages, env vars, ...).
            Its ``env_vars`` get ``RAY_worker_niceness=0`` unless they set it:
            the actors' servers run at the priority of ordinary processes, not
            behind them as Ray's workers do by default (nice 15).
        scheduling_strategy: Where Ray places actors (``"SPREAD"``, a placement
            group strategy, ...).
        actor_options: Any other options of Ray's ``.options()`` for the actors.
        host: The address the actors' servers listen on; their node's IP address
            when ``None``.
        server_options: Fields of `openenv.ServerConfig` for each actor's server
            (``session_idle_timeout``, ``max_message_size``, ...); its
            ``max_sessions`` is ``sessions_per_actor`` unless given here.
        idle_timeout: Seconds an actor without sessions is kept for new ones (60
            by default; 0: it is stopped as soon as its last session closes).
        start_timeout: Seconds to wait for a new actor to serve (120 by default;
            ``None``: no limit).
        **websocket_options: Passed to the `transports.websocket.WebSocketTransport`
            that carries the frames (``connect_timeout``, ``encoding``, ...).

    Attributes:
        url: The URL given.
        factory: The factory's ``"package.module:Factory"`` name.
        actor: The `transports.ray.HostActor` hosting the session, while connected.
        fleet: The `transports.ray.Fleet` of actors it took its slot from, once connected.

    Raises:
        ValueError: The URL does not name a factory, its query is wrong, an
            option is given twice, or is out of range.
        TypeError: A server option unknown or of the wrong type.
    """

    def __init__(
        self,
        url: str,
        *,
        address: str | None = None,
        sessions_per_actor: int | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: int | None = None,
        resources: Mapping[str, float] | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        scheduling_strategy: Any = None,
        actor_options: Mapping[str, Any] | None = None,
        host: str | None = None,
        server_options: Mapping[str, Any] | None = None,
        idle_timeout: float | None = None,
        start_timeout: float | None = _DEFAULT_START_TIMEOUT,
        **websocket_options: Any,
    ) -> None:
        factory, query = parse_ray_url(url)
        given = {
            "address": address,
            "sessions_per_actor": sessions_per_actor,
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "memory": memory,
            "host": host,
            "idle_timeout": idle_timeout,
            "scheduling_strategy": scheduling_strategy,
        }
        if start_timeout != _DEFAULT_START_TIMEOUT:
            given["start_timeout"] = start_timeout
        for name, value in query.items():
            if given.get(name) is not None:
                raise ValueError(f"{name} is given both in the URL and as an option; give it once")
            given[name] = value
        sessions = int(
            given["sessions_per_actor"] if given["sessions_per_actor"] is not None else _DEFAULT_SESSIONS_PER_ACTOR
        )
        idle = float(given["idle_timeout"] if given["idle_timeout"] is not None else _DEFAULT_IDLE_TIMEOUT)
        if sessions < 1:
            raise ValueError(f"sessions_per_actor must be at least 1, not {sessions}")
        if idle < 0:
            raise ValueError(f"idle_timeout must not be negative, not {idle}")
        self.url = url
        self.factory = factory
        options: dict[str, Any] = {"num_cpus": given["num_cpus"] if given["num_cpus"] is not None else 1.0}
        for name, value in (
            ("num_gpus", given["num_gpus"]),
            ("memory", given["memory"]),
            ("resources", dict(resources) if resources else None),
            ("runtime_env", _server_runtime_env(runtime_env)),
            ("scheduling_strategy", given["scheduling_strategy"]),
        ):
            if value is not None:
                options[name] = value
        options.update(actor_options or {})
        self._address: str | None = given["address"]
        self._fleet_options: dict[str, Any] = {
            "sessions_per_actor": sessions,
            "actor_options": options,
            "host": given["host"],
            "server_options": dict(server_options or {}),
            "idle_timeout": idle,
            "start_timeout": given.get("start_timeout", start_timeout),
        }
        # Checked now, so a wrong option fails before any actor starts.
        server_config(None, server_options)
        WebSocketTransport("ws://127.0.0.1", **websocket_options)
        self._websocket_options = websocket_options
        self.actor: HostActor | None = None
        self.fleet: Fleet | None = None
        self._inner: WebSocketTransport | None = None
        self._entered = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    async def __aenter__(self) -> RayTransport:
        """Take a slot on an actor (starting one if needed) and open a WebSocket to it.

        Returns:
            The transport itself.

        Raises:
            ConnectError: No actor could be started or reached.
            ClientStateError: The transport was entered before.
            ImportError: Ray is not installed (``pip install 'openenv-anyio[ray]'``).
        """
        connect_once(self._entered, self)
        self._entered = True
        fleet = self.fleet = await fleet_for(self._address, self.factory, **self._fleet_options)
        for attempt in range(_PLACEMENT_TRIES):
            actor = await fleet.lease()
            inner = WebSocketTransport(actor.url or "", **self._websocket_options)
            try:
                await inner.__aenter__()
            except ConnectError:
                # Its node may be gone: place nothing more there, and try another actor.
                fleet.discard(actor)
                fleet.release(actor)
                if attempt == _PLACEMENT_TRIES - 1:
                    raise
                continue
            except BaseException:
                fleet.release(actor)
                raise
            self.actor, self._inner = actor, inner
            self.dialect = inner.dialect
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close the WebSocket (stopping its tasks) and free the session's slot."""
        inner = self._inner
        try:
            if inner is not None:
                await inner.__aexit__(exc_type, exc_value, traceback)
        finally:
            self._release()

    def _release(self) -> None:
        actor, self.actor = self.actor, None
        if actor is not None and self.fleet is not None:
            self.fleet.release(actor)

    async def send(self, frame: bytes) -> None:
        """Send one frame to the session's server; see `openenv.Transport.send`."""
        if self._inner is None:
            raise ConnectionClosed("the transport is not connected")
        await self._inner.send(frame)

    async def receive(self) -> bytes:
        """Receive the next frame from the session's server; see `openenv.Transport.receive`."""
        if self._inner is None:
            raise ConnectionClosed("the transport is not connected")
        return await self._inner.receive()

    send_waits = False  # as its WebSocket's

    def send_nowait(self, frame: bytes) -> None:
        """As the WebSocket transport's `WebSocketTransport.send_nowait`.

        Raises:
            anyio.WouldBlock: The frame must be written now: await `send`.
            ConnectionClosed: The session has ended, or the transport is not connected.
        """
        if self._inner is None:
            raise ConnectionClosed("the transport is not connected")
        self._inner.send_nowait(frame)

    def receive_nowait(self) -> bytes:
        """As the WebSocket transport's `WebSocketTransport.receive_nowait`.

        Raises:
            anyio.WouldBlock: No frame came yet: await `receive`.
            ConnectionClosed: The session has ended and every frame was returned.
        """
        if self._inner is None:
            raise ConnectionClosed("the transport is not connected")
        return self._inner.receive_nowait()

    def step_batcher(self) -> LinkStepBatcher | None:
        """Its WebSocket's: a pool steps the sessions that share an actor's connection as one entry each way."""
        return None if self._inner is None else self._inner.step_batcher()

    @property
    def link_channel(self) -> LinkChannel | None:
        """Its WebSocket's channel on the link: what the link's batcher reads of each session it steps."""
        return None if self._inner is None else self._inner.link_channel

    async def keep(self) -> None:
        """The WebSocket's idle work (answering the actor's server's pings, resuming a drop)."""
        if self._inner is not None:
            await self._inner.keep()

    async def aclose(self) -> None:
        """Close the WebSocket; the slot is freed when the transport is exited. Idempotent."""
        if self._inner is not None:
            await self._inner.aclose()
