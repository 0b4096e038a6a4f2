"""Upstream OpenEnv's ``openenv.core``, on openenv-anyio: environment packages written for upstream, unchanged.

Needs the ``core`` extra (``pip install 'openenv-anyio[core]'``: pydantic). Offered so
far: the server side (`openenv.core.env_server`) and the clients (`EnvClient` with its
hooks, `SyncEnvClient`, `GenericEnvClient`, `MCPToolClient`, `StepResult`); ``docs/migrating.md`` says
what works unchanged, what differs, and what is not offered yet.
"""

try:
    import pydantic  # noqa: F401  (the core extra: said here, in one line, rather than deep in a model)
except ImportError as exc:
    raise ImportError(
        "openenv.core needs the core extra: pip install 'openenv-anyio[core]' (it brings pydantic)"
    ) from exc

from openenv.core import env_server
from openenv.core.client_types import StepResult as StepResult
from openenv.core.env_client import EnvClient as EnvClient
from openenv.core.env_client import SyncEnvClient as SyncEnvClient
from openenv.core.env_server import *  # noqa: F403
from openenv.core.generic_client import GenericAction as GenericAction
from openenv.core.generic_client import GenericEnvClient as GenericEnvClient
from openenv.core.mcp_client import MCPClientBase as MCPClientBase
from openenv.core.mcp_client import MCPToolClient as MCPToolClient

__all__ = sorted(
    [
        "EnvClient",
        "GenericAction",
        "GenericEnvClient",
        "MCPClientBase",
        "MCPToolClient",
        "StepResult",
        "SyncEnvClient",
        *env_server.__all__,
    ],
    key=lambda name: (0 if name.isupper() else 1 if name[0].isupper() else 2, name),
)
