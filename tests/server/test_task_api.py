"""OpenEnv's Task API (``/list_environments``, ``/{name}/splits``, ``/{name}/tasks``, ...) on a real server.

``tests/interop/test_interop.py`` compares every answer with OpenEnv 0.10.0's own server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

import openenv
from tests.envs import TASKS, MessageEchoEnv, TaskEchoEnv

pytestmark = pytest.mark.anyio

LIMIT = 30


@asynccontextmanager
async def task_server(factory: Any = TaskEchoEnv, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with openenv.serve(factory, **options) as server, httpx.AsyncClient(base_url=server.url) as http:
        yield http


async def test_tasks_by_split() -> None:
    with anyio.fail_after(LIMIT):
        async with task_server() as http:
            assert (await http.get("/list_environments")).json() == ["TaskEchoEnv"]
            assert (await http.get("/taskechoenv/splits")).json() == [
                {"name": "train", "type": "train"},
                {"name": "test", "type": "test"},
                {"name": "dev", "type": "validation"},
            ]
            assert (await http.post("/TaskEchoEnv/tasks", json={"split": "train"})).json() == {
                "tasks": TASKS["train"],
                "env_name": "TaskEchoEnv",
            }
            assert (await http.post("/TaskEchoEnv/num_tasks", json={"split": "test"})).json() == {"num_tasks": 1}
            assert (await http.post("/TaskEchoEnv/task", json={"split": "train", "index": 2})).json() == {
                "task": TASKS["train"][2]
            }
            ranged = await http.post("/TaskEchoEnv/task_range", json={"split": "train", "start": 1})
            assert ranged.json() == {"tasks": TASKS["train"][1:]}
            ranged = await http.post("/TaskEchoEnv/task_range", json={"split": "train", "start": 0, "stop": -1})
            assert ranged.json() == {"tasks": TASKS["train"][:-1]}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "detail"),
    [
        ("POST", "/TaskEchoEnv/task", {"split": "train", "index": 3}, 400, "Invalid task index"),
        ("POST", "/TaskEchoEnv/task", {"split": "train", "index": -1}, 400, "Invalid task index"),
        ("POST", "/TaskEchoEnv/tasks", {"split": "nope"}, 404, "unknown split 'nope'"),
        ("GET", "/OtherEnv/splits", None, 404, "unknown environment 'OtherEnv'"),
        ("POST", "/TaskEchoEnv/tasks", {}, 422, None),
        ("POST", "/TaskEchoEnv/task", {"split": "train", "index": "first"}, 422, None),
        ("POST", "/TaskEchoEnv/num_tasks", {"split": "train", "extra": 1}, 422, None),
    ],
)
async def test_requests_that_do_not_fit(
    method: str, path: str, body: dict[str, Any] | None, status: int, detail: str | None
) -> None:
    with anyio.fail_after(LIMIT):
        async with task_server() as http:
            response = await http.request(method, path, json=body)
            assert response.status_code == status, response.text
            if detail is not None:
                assert response.json() == {"detail": detail}
            # Nothing is left holding a slot.
            assert (await http.post("/TaskEchoEnv/num_tasks", json={"split": "dev"})).json() == {"num_tasks": 0}


async def test_an_environment_without_tasks_answers_501() -> None:
    with anyio.fail_after(LIMIT):
        async with task_server(MessageEchoEnv) as http:
            assert (await http.get("/list_environments")).json() == ["MessageEchoEnv"]
            for method, path, body, name in [
                ("GET", "/MessageEchoEnv/splits", None, "list_splits"),
                ("POST", "/MessageEchoEnv/tasks", {"split": "train"}, "list_tasks"),
                ("POST", "/MessageEchoEnv/num_tasks", {"split": "train"}, "num_tasks"),
                ("POST", "/MessageEchoEnv/task", {"split": "train", "index": 0}, "get_task"),
                ("POST", "/MessageEchoEnv/task_range", {"split": "train"}, "get_task_range"),
            ]:
                response = await http.request(method, path, json=body)
                assert response.status_code == 501
                assert response.json() == {"detail": f"{name} is not supported for this environment"}


class PortedTaskEnv(MessageEchoEnv):
    """Tasks offered the way OpenEnv's environments offer them: its TaskProvider methods, some async."""

    closed = 0

    async def list_splits(self) -> list[Any]:
        return ["train", {"name": "holdout", "type": "test"}]

    def num_tasks(self, split: str) -> int:
        return 41

    async def get_task(self, split: str, index: int) -> Any:
        return {"split": split, "index": index}

    def close(self) -> None:
        PortedTaskEnv.closed += 1


async def test_openenv_task_methods_are_used_where_an_environment_has_them() -> None:
    PortedTaskEnv.closed = 0
    with anyio.fail_after(LIMIT):
        async with task_server(PortedTaskEnv) as http:
            assert (await http.get("/PortedTaskEnv/splits")).json() == [
                {"name": "train", "type": "train"},
                {"name": "holdout", "type": "test"},
            ]
            assert (await http.post("/PortedTaskEnv/num_tasks", json={"split": "x"})).json() == {"num_tasks": 41}
            task = await http.post("/PortedTaskEnv/task", json={"split": "x", "index": 7})
            assert task.json() == {"task": {"split": "x", "index": 7}}
            assert (await http.post("/PortedTaskEnv/tasks", json={"split": "x"})).status_code == 501
        assert PortedTaskEnv.closed == 4  # one environment per request, each closed


async def test_task_requests_hold_a_session_slot() -> None:
    with anyio.fail_after(LIMIT):
        async with openenv.serve(TaskEchoEnv, max_sessions=1) as server, httpx.AsyncClient(base_url=server.url) as http:
            async with openenv.EnvClient(server.url) as holder:
                await holder.reset()
                refused = await http.get("/TaskEchoEnv/splits")
                assert refused.status_code == 503
                assert refused.headers["retry-after"] == "1"
            assert (await http.get("/TaskEchoEnv/splits")).status_code == 200


async def test_the_schema_names_what_reset_returns() -> None:
    from openenv.examples.echo import EchoEnvironment

    with anyio.fail_after(LIMIT):
        async with task_server(EchoEnvironment) as http:
            schema = (await http.get("/schema")).json()
    assert list(schema) == ["action", "observation", "state", "reset_observation"]
    assert schema["reset_observation"]["title"] == "Observation"  # reset's return annotation
    assert schema["observation"]["title"] == "EchoObservation"
