"""A counter with tools: ``add`` and ``total`` on a FastMCP server, an ``MCPEnvironment`` around it."""

import uuid

from fastmcp import Context, FastMCP

from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Observation, State


class CounterToolsEnvironment(MCPEnvironment):
    """Counts what its ``add`` tool is given; ``total`` says how much; ``fail`` raises."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("counter_tools")
        self.total_so_far = 0

        @mcp.tool
        def add(amount: int) -> dict:
            """Add to the counter; the new total."""
            self.total_so_far += amount
            return {"added": amount, "total": self.total_so_far}

        @mcp.tool
        def total() -> int:
            """The counter's total."""
            return self.total_so_far

        @mcp.tool
        def fail(reason: str) -> str:
            """Raise, with the reason given."""
            raise ValueError(reason)

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.total_so_far = 0
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return Observation(done=False, reward=0.0, metadata={"status": "ready"})

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(done=False, reward=0.0, metadata={"error": f"Unknown action type: {type(action).__name__}"})

    @property
    def state(self):
        return self._state


class NotesToolsEnvironment(MCPEnvironment):
    """Remembers a note in FastMCP's session state (``ctx.set_state``): it lasts as long as the MCP session."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("notes_tools")

        @mcp.tool
        async def remember(note: str, ctx: Context) -> str:
            """Keep a note for the rest of the session."""
            await ctx.set_state("note", note)
            return note

        @mcp.tool
        async def recall(ctx: Context) -> str:
            """The note kept in this session, or an empty string."""
            return await ctx.get_state("note") or ""

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        return Observation(done=False, reward=0.0)

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(done=False, reward=0.0)

    @property
    def state(self):
        return self._state
