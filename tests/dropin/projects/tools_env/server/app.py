"""The tool environment's app, as an MCP package's ``server/app.py`` makes it."""

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from tools_env.server.environment import CounterToolsEnvironment, NotesToolsEnvironment

app = create_app(
    CounterToolsEnvironment, CallToolAction, CallToolObservation, env_name="tools_env", max_concurrent_envs=8
)
notes_app = create_app(
    NotesToolsEnvironment, CallToolAction, CallToolObservation, env_name="notes_env", max_concurrent_envs=8
)
