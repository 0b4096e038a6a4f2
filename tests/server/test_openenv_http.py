"""OpenEnv's stateless HTTP routes (POST /reset, POST /step, GET /state, POST /mcp, /openapi.json)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

import openenv
from openenv.examples.echo import EchoEnvironment
from tests.envs import MessageEchoEnv, SyncCounterEnv, failing_factory
from transports.server.app import create_app
from transports.server.routes.openenv_http import OPENAPI_VERSION

pytestmark = pytest.mark.anyio

LIMIT = 30


@asynccontextmanager
async def http_client(factory: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(factory)
    with anyio.fail_after(LIMIT):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as client:
            yield client


async def test_reset_and_step_are_stateless_as_the_reference_s() -> None:
    async with http_client(SyncCounterEnv) as client:
        reset = await client.post("/reset", json={"seed": 1, "episode_id": "ep", "start": 4, "unknown": 1})
        assert reset.status_code == 200
        # This reset takes **kwargs, so every keyword reaches it (it notes their names).
        observation = {"count": 4, "note": "episode_id,seed,start,unknown", "metadata": {}}
        assert reset.json() == {"observation": observation, "reward": None, "done": False, "metadata": None}
        assert (await client.post("/reset")).json()["observation"]["count"] == 0  # no body: no keywords
        step = await client.post("/step", json={"action": {"by": "3"}})  # lax, as on /ws
        assert step.json() == {
            "observation": {"count": 3, "note": "", "metadata": {}},
            "reward": 3.0,
            "done": False,
            "metadata": None,
        }
        # A fresh environment per request: the count starts over.
        assert (await client.post("/step", json={"action": {"by": 1}})).json()["observation"]["count"] == 1
        assert (await client.get("/state")).json() == {"episode_id": None, "step_count": 0, "count": 0}


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/step", {"action": {"by": "x"}}, 422),
        ("/step", {"action": {"bye": 1}}, 422),
        ("/step", {"act": {}}, 422),
        ("/step", [1], 422),
        ("/step", {"action": {"fail": True}}, 500),
        ("/reset", [1], 422),
    ],
)
async def test_bad_requests_and_failing_steps(path: str, body: Any, status: int) -> None:
    async with http_client(SyncCounterEnv) as client:
        response = await client.post(path, json=body)
        assert response.status_code == status
        assert "detail" in response.json()
        unparsable = await client.post(path, content=b"{not json")
        assert unparsable.status_code == 422


async def test_a_failing_factory_is_a_500_not_a_traceback() -> None:
    async with http_client(failing_factory) as client:
        for response in (await client.post("/reset"), await client.get("/state")):
            assert response.status_code == 500
            assert "Failed to create environment" in response.json()["detail"]


async def test_mcp_endpoint_speaks_json_rpc() -> None:
    async with http_client(EchoEnvironment) as client:
        listed = await client.post("/mcp", json={"jsonrpc": "2.0", "method": "tools/list", "id": 1})
        assert [tool["name"] for tool in listed.json()["result"]["tools"]] == ["echo_message", "echo_with_length"]
        call = {"name": "echo_with_length", "arguments": {"message": "ab"}}
        called = await client.post("/mcp", json={"jsonrpc": "2.0", "method": "tools/call", "params": call, "id": 2})
        assert called.json()["result"]["data"] == {"message": "ab", "length": 2}
        for body, code in [(b"{", -32700), (b"{}", -32600), (b"[1]", -32600), (b'{"jsonrpc": "2.0"}', -32600)]:
            response = await client.post("/mcp", content=body)
            assert response.status_code == 200  # JSON-RPC errors travel in the body, as the reference's do
            assert response.json()["error"]["code"] == code
    async with http_client(MessageEchoEnv) as client:
        response = await client.post("/mcp", json={"jsonrpc": "2.0", "method": "tools/list", "id": 7})
        assert response.json() == {
            "jsonrpc": "2.0",
            "id": 7,
            "error": {"code": -32603, "message": "Environment does not support MCP", "data": None},
        }


async def test_openapi_is_generated_from_the_msgspec_schemas() -> None:
    async with http_client(EchoEnvironment) as client:
        document = (await client.get("/openapi.json")).json()
        schemas = (await client.get("/schema")).json()
    assert document["openapi"] == "3.1.0"
    assert document["info"]["version"] == OPENAPI_VERSION
    assert document["info"]["x-openenv-package-version"] == openenv.__version__
    assert {"/health", "/metadata", "/schema", "/reset", "/step", "/state", "/mcp"} <= set(document["paths"])
    assert set(document["paths"]["/step"]) == {"post"}
    components = document["components"]["schemas"]
    assert components["Action"] == schemas["action"]
    assert components["Observation"] == schemas["observation"]
    assert components["StepRequest"]["required"] == ["action"]


async def test_metadata_derives_a_description_as_the_reference_does() -> None:
    class Undocumented(openenv.Environment[Any, Any, Any]):
        pass

    assert Undocumented.metadata().description == "Undocumented environment"
    async with http_client(Undocumented) as client:
        assert (await client.get("/metadata")).json()["description"] == "Undocumented environment"
