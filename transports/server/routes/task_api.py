"""OpenEnv's Task API: the task specs an environment offers, by split, over plain HTTP.

```text
GET  /list_environments                                   -> ["<name>"]
GET  /{name}/splits                                       -> [{"name": "train", "type": "train"}, ...]
POST /{name}/tasks       {"split": "test"}                -> {"tasks": [...], "env_name": "<name>"}
POST /{name}/num_tasks   {"split": "test"}                -> {"num_tasks": 7}
POST /{name}/task        {"split": "test", "index": 3}    -> {"task": {...}}
POST /{name}/task_range  {"split": "test", "start": 0, "stop": 2}  -> {"tasks": [...]}
```

``<name>`` is the environment's metadata name (any case). An environment
offers tasks by overriding `openenv.Environment.tasks` (each split's specs, by
name); one ported from OpenEnv may instead define OpenEnv's own methods
(``list_splits``, ``list_tasks``, ``num_tasks``, ``get_task``,
``get_task_range``), which are used where present. Each request builds an
environment from the factory (holding a session slot while it lives: ``503``
at capacity), asks it, and closes it.

Answers as OpenEnv 0.10's server gives them: ``501`` when the environment
offers no tasks, ``400`` for an index out of range, ``404`` for another
environment's name, ``422`` for a body that does not fit; and ``404`` for a
split the environment does not have (OpenEnv leaves that to the environment).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

import anyio.to_thread
import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from openenv import Environment
from openenv.server import factory_error_message
from transports.admission._sessions import SessionRegistry
from transports.server._json_response import JSONResponse

__all__ = ["task_api_routes"]

logger = logging.getLogger("openenv.server")

_SPLIT_TYPES = frozenset({"train", "validation", "test"})
_MAX_BODY = 64 * 1024


class _SplitRequest(msgspec.Struct, forbid_unknown_fields=True):
    split: str


class _TaskRequest(msgspec.Struct, forbid_unknown_fields=True):
    split: str
    index: int


class _TaskRangeRequest(msgspec.Struct, forbid_unknown_fields=True):
    split: str
    start: int | None = None
    stop: int | None = None


class _Refused(Exception):
    """An answer other than 200: its status and detail."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


async def _call(env: Any, name: str, *args: Any) -> Any:
    """Call one of the environment's methods: ``async`` on the event loop, plain on a worker thread."""
    method = getattr(env, name)
    if inspect.iscoroutinefunction(method):
        return await method(*args)
    result = await anyio.to_thread.run_sync(functools.partial(method, *args))
    return (await result) if inspect.isawaitable(result) else result


def _own(env: Any, name: str) -> bool:
    """Whether the environment defines OpenEnv's method ``name`` itself."""
    return callable(getattr(env, name, None))


def _split_descriptor(split: Any) -> Any:
    """A split as OpenEnv lists it: ``{"name", "type"}``, the type guessed from a plain name."""
    if isinstance(split, str):
        return {"name": split, "type": split if split in _SPLIT_TYPES else "validation"}
    if isinstance(split, dict):
        return split
    builtins = msgspec.to_builtins(split)
    return builtins if isinstance(builtins, dict) else {"name": str(split), "type": "validation"}


class _Tasks:
    """What the Task API asks of one environment, from its ``tasks()`` or OpenEnv's own methods."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self._by_split: Any = None

    async def _splits(self) -> Any:
        if self._by_split is None:
            tasks = getattr(self.env, "tasks", None)
            if not callable(tasks):
                raise NotImplementedError
            self._by_split = await _call(self.env, "tasks")
        return self._by_split

    async def _split(self, split: str) -> Sequence[Any]:
        splits = await self._splits()
        try:
            specs: Sequence[Any] = splits[split]
        except KeyError:
            raise _Refused(404, f"unknown split {split!r}") from None
        return specs

    async def splits(self) -> list[Any]:
        if _own(self.env, "list_splits"):
            return [_split_descriptor(split) for split in await _call(self.env, "list_splits")]
        return [_split_descriptor(name) for name in await self._splits()]

    async def tasks(self, split: str) -> Any:
        if _own(self.env, "list_tasks"):
            return await _call(self.env, "list_tasks", split)
        specs = await self._split(split)
        return [specs[index] for index in range(len(specs))]

    async def count(self, split: str) -> int:
        if _own(self.env, "num_tasks"):
            return int(await _call(self.env, "num_tasks", split))
        return len(await self._split(split))

    async def task(self, split: str, index: int) -> Any:
        if _own(self.env, "get_task"):
            return await _call(self.env, "get_task", split, index)
        specs = await self._split(split)
        if not 0 <= index < len(specs):
            raise IndexError(index)
        return specs[index]

    async def task_range(self, split: str, start: int | None, stop: int | None) -> Any:
        if _own(self.env, "get_task_range"):
            return await _call(self.env, "get_task_range", split, start, stop)
        specs = await self._split(split)
        return [specs[index] for index in range(*slice(start, stop).indices(len(specs)))]


async def _close(env: Any) -> None:
    close = getattr(env, "close", None)
    if close is None or getattr(type(env), "close", None) is Environment.close:
        return
    try:
        await _call(env, "close")
    except Exception:
        logger.exception("environment close() raised")


def task_api_routes(
    factory: Callable[[], Any],
    *,
    name: str,
    registry: SessionRegistry | None = None,
    error_details: bool = True,
) -> list[BaseRoute]:
    """OpenEnv's Task API routes for an environment factory (see the module's docs).

    Args:
        factory: Builds the environment each request asks.
        name: The environment's name, as the routes take it (any case).
        registry: The app's session registry: each request's environment holds
            a slot while it lives (``503`` at capacity); ``None`` for no limit.
        error_details: Whether a failing factory's error names its exception.

    Returns:
        The routes: ``GET /list_environments``, ``GET /{env_name}/splits``,
        ``POST /{env_name}/tasks``, ``/num_tasks``, ``/task`` and ``/task_range``.
    """

    def check_name(request: Request) -> None:
        asked = request.path_params["env_name"]
        if asked.lower() != name.lower():
            raise _Refused(404, f"unknown environment {asked!r}")

    async def body(request: Request, kind: type[Any]) -> Any:
        data = b""
        async for chunk in request.stream():
            data += chunk
            if len(data) > _MAX_BODY:
                raise _Refused(
                    413, [{"type": "too_large", "loc": ["body"], "msg": f"the body exceeds {_MAX_BODY} bytes"}]
                )
        try:
            return msgspec.json.decode(data, type=kind)
        except msgspec.DecodeError as exc:  # ValidationError included
            raise _Refused(422, [{"type": "value_error", "loc": ["body"], "msg": str(exc)}]) from None

    async def ask(method: str, question: Callable[[_Tasks], Any]) -> Any:
        lease = None
        if registry is not None:
            lease = await registry.admit(transport="http-stateless")
            if lease is None:
                raise _Refused(503, registry.capacity_reached_message())
            lease.mark_busy()
        try:
            try:
                env = factory()
            except Exception as exc:
                logger.exception("environment factory failed")
                raise _Refused(500, factory_error_message(exc, error_details=error_details)) from exc
            try:
                return await question(_Tasks(env))
            except NotImplementedError:
                raise _Refused(501, f"{method} is not supported for this environment") from None
            except IndexError:
                raise _Refused(400, "Invalid task index") from None
            finally:
                await _close(env)
        finally:
            if lease is not None:
                lease.release()

    def route(path: str, handler: Callable[[Request], Any], method: str) -> Route:
        async def endpoint(request: Request) -> Response:
            try:
                return JSONResponse(await handler(request))
            except _Refused as refused:
                headers = {"Retry-After": "1"} if refused.status == 503 else None
                return JSONResponse({"detail": refused.detail}, status_code=refused.status, headers=headers)

        return Route(path, endpoint, methods=[method])

    async def list_environments(request: Request) -> Any:
        return [name]

    async def splits(request: Request) -> Any:
        check_name(request)
        return await ask("list_splits", lambda tasks: tasks.splits())

    async def tasks(request: Request) -> Any:
        check_name(request)
        asked = await body(request, _SplitRequest)
        found = await ask("list_tasks", lambda tasks: tasks.tasks(asked.split))
        return {"tasks": msgspec.to_builtins(found), "env_name": name}

    async def num_tasks(request: Request) -> Any:
        check_name(request)
        asked = await body(request, _SplitRequest)
        return {"num_tasks": await ask("num_tasks", lambda tasks: tasks.count(asked.split))}

    async def task(request: Request) -> Any:
        check_name(request)
        asked = await body(request, _TaskRequest)
        return {"task": msgspec.to_builtins(await ask("get_task", lambda tasks: tasks.task(asked.split, asked.index)))}

    async def task_range(request: Request) -> Any:
        check_name(request)
        asked = await body(request, _TaskRangeRequest)
        found = await ask("get_task_range", lambda tasks: tasks.task_range(asked.split, asked.start, asked.stop))
        return {"tasks": msgspec.to_builtins(found)}

    return [
        route("/list_environments", list_environments, "GET"),
        route("/{env_name}/splits", splits, "GET"),
        route("/{env_name}/tasks", tasks, "POST"),
        route("/{env_name}/num_tasks", num_tasks, "POST"),
        route("/{env_name}/task", task, "POST"),
        route("/{env_name}/task_range", task_range, "POST"),
    ]
