"""The driver's side of the Ray transport: the actors hosting one environment, and their free slots.

A `Fleet` holds the `EnvHost` actors of one environment and one set of options,
for the driver process (one fleet per factory, options and Ray job). A session
leases a slot on the fullest actor that has one (so a few actors are kept busy
rather than many half empty), and a new actor is started when none has. A slot is
returned when the session closes; an actor without sessions is retired after
``idle_timeout`` seconds. Actors are owned by the driver (not detached), so none
outlives it either.

Ray's calls block, so they run in worker threads (`anyio.to_thread`), which keeps
the fleet usable from asyncio and trio alike; its bookkeeping is guarded by a
threading lock, as the fleets are shared by every event loop of the process.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable
from typing import Any

import anyio.to_thread

from openenv import ConnectError
from transports.ray._host import EnvHost

__all__ = ["ACTOR_NAME_PREFIX", "Fleet", "HostActor", "fleet_for", "init_ray"]

ACTOR_NAME_PREFIX = "openenv-envhost-"
"""Every `EnvHost` actor's name starts with it (``ray.util.list_named_actors`` finds them)."""

_ray_lock = threading.Lock()
_fleets: dict[tuple[Any, ...], Fleet] = {}
_fleets_lock = threading.Lock()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"ray:// URLs need Ray: pip install 'openenv-anyio[ray]' ({exc})") from exc
    return ray


def init_ray(**init_options: Any) -> str:
    """Connect this process to Ray (``ray.init(**init_options)``) unless it is already; return the job id.

    Ray ties the processes it starts for a local cluster to the thread that
    started them (they die with it), so ``ray.init`` runs in a thread of its own
    that lives as long as the process, whichever thread or event loop asks.
    Blocking: call it from a worker thread in async code.

    Args:
        **init_options: Passed to ``ray.init`` (``address``, ``num_cpus``, ...).

    Returns:
        The id of this process's Ray job.
    """
    ray = _import_ray()
    with _ray_lock:
        if not ray.is_initialized():
            outcome: list[BaseException | None] = []
            done = threading.Event()

            def keeper() -> None:
                try:
                    ray.init(**init_options)
                    outcome.append(None)
                except BaseException as exc:
                    outcome.append(exc)
                done.set()
                threading.Event().wait()  # stay alive: the cluster's processes live while this thread does

            threading.Thread(target=keeper, name="openenv-ray-keeper", daemon=True).start()
            done.wait()
            if outcome[0] is not None:
                raise outcome[0]
        return str(ray.get_runtime_context().get_job_id())


def _ensure_ray(address: str | None) -> str:
    # None lets Ray read RAY_ADDRESS, and start a local cluster when that is unset too.
    return init_ray(address=address, include_dashboard=False, logging_level="warning")


class HostActor:
    """One `EnvHost` actor, as the driver sees it: its handle, address and number of sessions.

    Attributes:
        name: The actor's Ray name (`ACTOR_NAME_PREFIX` and a random suffix).
        handle: The Ray actor handle.
        url: The WebSocket URL of its server, once started (else ``None``).
        node_id: The id of the Ray node it runs on, once started (else ``None``).
        leases: How many sessions hold one of its slots.
    """

    def __init__(self, name: str, handle: Any) -> None:
        self.name = name
        self.handle = handle
        self.url: str | None = None
        self.node_id: str | None = None
        self.leases = 0
        self.usable = True  # new sessions may be placed on it
        self._started = threading.Lock()
        self._start_error: BaseException | None = None
        self._idle_timer: threading.Timer | None = None

    def __repr__(self) -> str:
        return f"<HostActor {self.name} at {self.url} with {self.leases} sessions>"

    def wait_started(self, timeout: float | None) -> None:
        """Block until the actor's server is up (one Ray call, shared by every caller)."""
        ray = _import_ray()
        with self._started:
            if self.url is not None:
                return
            if self._start_error is None:
                try:
                    self.url, self.node_id = ray.get(self.handle.address.remote(), timeout=timeout)
                    return
                except Exception as exc:
                    self._start_error = exc
            raise ConnectError(f"the Ray actor hosting the environment did not start: {self._start_error}")


class Fleet:
    """The actors hosting one environment with one set of options, and how full each is.

    Args:
        factory: The environment factory's ``"package.module:Factory"`` name.
        sessions_per_actor: The most sessions one actor hosts.
        actor_options: Passed to Ray's ``.options()`` (``num_cpus``, ``resources``, ...).
        host: The address actors listen on (``None``: their node's IP address).
        server_options: Passed to each actor's server.
        idle_timeout: Seconds an actor without sessions lives on (0: it stops at once).
        start_timeout: Seconds to wait for a new actor's server (``None``: no limit).
    """

    def __init__(
        self,
        factory: str,
        *,
        sessions_per_actor: int,
        actor_options: dict[str, Any],
        host: str | None,
        server_options: dict[str, Any],
        idle_timeout: float,
        start_timeout: float | None,
    ) -> None:
        self.factory = factory
        self.sessions_per_actor = sessions_per_actor
        self.actor_options = actor_options
        self.host = host
        self.server_options = {"max_sessions": sessions_per_actor, **server_options}
        self.idle_timeout = idle_timeout
        self.start_timeout = start_timeout
        self.actors: list[HostActor] = []
        self._lock = threading.Lock()

    async def lease(self) -> HostActor:
        """Take a slot on an actor with room, starting one if none has; wait until it serves.

        Returns:
            The actor, with its ``url``, and one more lease counted.

        Raises:
            ConnectError: The actor could not start (its factory failed, no node
                has the resources it asks for within ``start_timeout``, ...).
        """
        actor = self._take_slot()
        try:
            await anyio.to_thread.run_sync(actor.wait_started, self.start_timeout, abandon_on_cancel=True)
        except BaseException:
            self.discard(actor)
            self.release(actor)
            raise
        return actor

    def _take_slot(self) -> HostActor:
        with self._lock:
            open_actors = [a for a in self.actors if a.usable and a.leases < self.sessions_per_actor]
            if open_actors:
                actor = max(open_actors, key=lambda a: a.leases)
            else:
                actor = self._start_actor()
                self.actors.append(actor)
            actor.leases += 1
            if actor._idle_timer is not None:
                actor._idle_timer.cancel()
                actor._idle_timer = None
            return actor

    def _start_actor(self) -> HostActor:
        ray = _import_ray()
        name = f"{ACTOR_NAME_PREFIX}{uuid.uuid4().hex}"
        remote_class = ray.remote(EnvHost)
        handle = remote_class.options(name=name, **self.actor_options).remote(
            self.factory, self.host, self.server_options
        )
        return HostActor(name, handle)

    def release(self, actor: HostActor) -> None:
        """Give a session's slot back; retire the actor if it has no sessions left (now or after ``idle_timeout``)."""
        with self._lock:
            actor.leases -= 1
            if actor.leases > 0:
                return
            if self.idle_timeout <= 0 or not actor.usable:
                self._retire(actor)
                return
            timer = threading.Timer(self.idle_timeout, self._retire_if_idle, args=(actor,))
            timer.daemon = True
            actor._idle_timer = timer
            timer.start()

    def discard(self, actor: HostActor) -> None:
        """Place no new session on ``actor`` (it failed); it is stopped once its sessions have closed."""
        with self._lock:
            actor.usable = False

    def _retire_if_idle(self, actor: HostActor) -> None:
        with self._lock:
            if actor.leases == 0 and actor._idle_timer is not None:
                actor._idle_timer = None
                self._retire(actor)

    def _retire(self, actor: HostActor) -> None:
        if actor in self.actors:
            self.actors.remove(actor)
            # An idle timer may fire after Ray was shut down (and the actor with it), in a thread
            # where nobody could handle the error.
            with contextlib.suppress(Exception):
                _import_ray().kill(actor.handle, no_restart=True)


def _options_key(options: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((name, repr(value)) for name, value in options.items()))


async def fleet_for(address: str | None, factory: str, **options: Any) -> Fleet:
    """The process's fleet for ``factory`` and ``options`` on the Ray cluster at ``address``.

    Connects to Ray first if this process is not connected yet (``address``, or
    ``RAY_ADDRESS``, or a new local cluster).

    Args:
        address: The Ray cluster's address, or ``None``.
        factory: The environment factory's ``"package.module:Factory"`` name.
        **options: The keyword arguments of `Fleet`.

    Returns:
        The fleet, created on first use.
    """
    connect: Callable[[], str] = lambda: _ensure_ray(address)  # noqa: E731
    job = await anyio.to_thread.run_sync(connect, abandon_on_cancel=True)
    key = (job, factory, _options_key(options))
    with _fleets_lock:
        fleet = _fleets.get(key)
        if fleet is None:
            fleet = _fleets[key] = Fleet(factory, **options)
        return fleet
