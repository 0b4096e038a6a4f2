"""Where a benchmark gets an environment's action schema: the server's ``GET /schema``, or the factory itself."""

from __future__ import annotations

from typing import Any

import anyio
import httpx

from openenv import ConnectError
from openenv._registry import url_scheme
from openenv.server import environment_schemas, load_factory
from transports.shared._network_client import (
    authentication_error,
    client_headers,
    describe,
    error_detail,
    is_loopback,
    network_cause,
    sends_token,
    split_url,
    user_agent,
)
from transports.websocket._client import ENDPOINT_PATH

__all__ = ["SchemaUnavailable", "fetch_action_schema", "schema_url"]

# The HTTP scheme of each network transport's server, which serves /schema beside it.
_HTTP_SCHEMES = {
    "ws": "http",
    "wss": "https",
    "http": "http",
    "https": "https",
    "http+poll": "http",
    "https+poll": "https",
}

# The schemes of the WebSocket transport, whose URL may name the endpoint itself (``ws://host/ws``).
_WEBSOCKET_SCHEMES = frozenset({"ws", "wss", "http", "https"})

_INPROC = "inproc"
# Schemes whose URL names the factory (``scheme://package.module:Factory?options``): its types give the schema here.
_FACTORY_SCHEMES = (_INPROC, "ray")


class SchemaUnavailable(LookupError):
    """The environment's action schema cannot be had (no such endpoint, an unknown scheme, ...)."""


def schema_url(url: str) -> str | None:
    """The URL of the ``GET /schema`` endpoint beside an environment URL's server.

    ``ws://host:8000/env`` and ``http+poll://host:8000/env`` both give
    ``http://host:8000/env/schema``; ``wss://`` and ``https+poll://`` give
    ``https://``. A WebSocket URL that names the endpoint (``ws://host:8000/ws``,
    taken as it is by the transport) gives ``http://host:8000/schema``. A query
    string is kept; a fragment is dropped.

    Args:
        url: An environment URL.

    Returns:
        The schema's URL, or ``None`` for a scheme not served over HTTP
        (``inproc://``, third-party transports).
    """
    parts = split_url(url, _HTTP_SCHEMES)
    if parts is None:
        return None
    location = parts.location
    if url.partition("://")[0].lower() in _WEBSOCKET_SCHEMES:
        location = location.removesuffix(ENDPOINT_PATH)
    return f"{parts.scheme}://{location}/schema{parts.query}"


async def fetch_action_schema(
    url: str, *, timeout: float | None = 30.0, auth_token: str | None = None
) -> dict[str, Any]:
    """Get the action JSON Schema of the environment behind an environment URL.

    Over the network, from the server's ``GET /schema`` (openenv's server and
    OpenEnv's reference server both answer ``{"action", "observation", "state"}``).
    For ``inproc://module:Factory`` and ``ray://module:Factory``, from the factory's types, by the function
    that builds our server's ``/schema`` (`openenv.server.environment_schemas`).

    Args:
        url: An environment URL.
        timeout: Seconds to wait for the server; ``None`` for no limit.
        auth_token: The server's bearer token, sent as the transports send it;
            ``None`` takes it from ``OPENENV_AUTH_TOKEN``, if set.

    Returns:
        The action's JSON Schema, with any ``$defs`` it refers to.

    Raises:
        SchemaUnavailable: The scheme offers no schema, the server has no
            ``/schema`` or answers something else.
        AuthenticationError: The server wants a token, and none or another was sent.
        ConnectError: The server cannot be reached.
        UnsupportedSchemeError: The URL has no scheme.
    """
    scheme = url_scheme(url)
    if scheme in _FACTORY_SCHEMES:
        return _inprocess_action_schema(url)
    address = schema_url(url)
    if address is None:
        raise SchemaUnavailable(f"the {scheme}:// transport offers no action schema")
    headers = client_headers(
        [("Accept", "application/json"), ("User-Agent", user_agent(f"python-httpx/{httpx.__version__}"))],
        auth_token,
        reserved=(),
        owner="",
    )
    try:
        with anyio.fail_after(timeout):
            async with httpx.AsyncClient(timeout=timeout, trust_env=not is_loopback(httpx.URL(address).host)) as client:
                response = await client.get(address, headers=headers)
    except TimeoutError as exc:
        raise ConnectError(f"no answer from {address} within {timeout} s") from exc
    except httpx.HTTPError as exc:
        raise ConnectError(f"cannot reach {address}: {describe(exc)}") from network_cause(exc)
    if response.status_code == 401:
        refusal = f"HTTP 401 {response.reason_phrase}: {error_detail(response.content)}"
        raise authentication_error(address, refusal, token_sent=sends_token(headers))
    if response.status_code != 200:
        raise SchemaUnavailable(f"GET {address} answered HTTP {response.status_code}")
    try:
        schemas = response.json()
    except ValueError as exc:
        raise SchemaUnavailable(f"GET {address} answered something other than JSON") from exc
    action = schemas.get("action") if isinstance(schemas, dict) else None
    if not isinstance(action, dict):
        raise SchemaUnavailable(f"GET {address} answered no action schema")
    return action


def _inprocess_action_schema(url: str) -> dict[str, Any]:
    try:
        factory = load_factory(url.partition("://")[2].partition("?")[0])
    except (ImportError, ValueError, TypeError) as exc:
        raise ConnectError(f"cannot load the environment factory of {url!r}: {exc}") from exc
    return environment_schemas(factory)["action"]
