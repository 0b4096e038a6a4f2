"""The app as upstream OpenEnv's ``create_app`` returns it: a FastAPI app, so an environment package may add routes.

Environment packages decorate the app their ``create_app`` call returned
(``@app.get("/config")``, ``app.add_middleware(...)``, ``app.routes``): upstream's is
FastAPI's. `create_extensible_app` gives openenv's app (`transports.server.app.create_app`)
behind a FastAPI front where FastAPI is installed (every upstream environment package
depends on it): a package's own routes are tried first, and every other request and
WebSocket goes to openenv's app, its guard and its bounds included. The front shares
that app's ``state``, and its lifespan runs that app's. Without FastAPI, the app itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette

from openenv.server import AppFunction, ServerConfig
from transports.server.app import create_app

__all__ = ["create_extensible_app"]


def create_extensible_app(factory: Callable[..., Any], /, *, config: ServerConfig) -> Starlette:
    """Openenv's app for ``factory``, behind a FastAPI front a package can add routes to.

    Args:
        factory: Builds one environment per session.
        config: The server's options.

    Returns:
        A FastAPI app (a Starlette app) where FastAPI is installed, else openenv's app itself.
    """
    app = create_app(factory, config=config)
    try:
        from fastapi import FastAPI
    except ImportError:
        return app

    @asynccontextmanager
    async def lifespan(front: Starlette) -> AsyncIterator[None]:
        async with app.router.lifespan_context(app):
            yield

    # No OpenAPI of FastAPI's own: openenv's app answers /openapi.json with the environment's schemas.
    front = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    front.router.default = app
    front.state = app.state
    return front


if TYPE_CHECKING:  # openenv.server.build_app calls it: mypy checks the signatures agree
    _builds_openenv_apps: AppFunction = create_extensible_app
