"""How openenv's frames travel, and the server that answers them: everything that does I/O.

By role (docs/architecture.md walks a step through them):

- Each transport, its client end beside its server end:
  `transports.websocket` (``ws://``, ``wss://``, ``http://``, ``https://``),
  `transports.http` (``http+poll://``, ``https+poll://``: HTTP long-polling),
  `transports.inprocess` (``inproc://``: the caller's own event loop),
  `transports.ray` (``ray://``: actors on a Ray cluster, over WebSocket),
  `transports.project` (``project://``: a local upstream-style project in a venv of its own) and
  `transports.mcp_session` (``http+mcp://``: a session made over ``POST /mcp``).
- `transports.link`: links, many sessions of one process over one connection, both ends.
- `transports.server`: the ASGI app, its runner, its routes and the ASGI servers' drivers.
- `transports.admission`: who may use a server and how many sessions it holds.
- `transports.cli`: the ``openenv`` command; `transports.bench`: ``openenv bench``.
- `transports.shared`: what several transports use.

The transports join the ``openenv.transports`` entry-point group, as a third party's would.
"""
