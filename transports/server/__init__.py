"""The server: one ASGI app that serves an environment over every transport, and what runs it.

- `app`: `create_app`, the app: its routes, bounds and endpoints mounted.
- `runner`: `serve` and `run`, the app on a real ASGI server (uvicorn, hypercorn), embedded or blocking.
- `routes/`: OpenEnv's plain HTTP routes, the Task API and MCP sessions over ``POST /mcp``.
- `drivers/`: each ASGI server configured, bounded and patched as `openenv serve` runs it.
- `_body_deadline`: request bodies in time.
- `_metrics`: ``GET /metrics``; `_logs`: the servers' logs.

The transports' server ends (``/ws``, ``/poll``, the links) live beside their client ends,
in `transports.websocket` and `transports.http`; the app mounts them. Who gets in, and how
many, is `transports.admission`, below them all.
"""
