"""The ASGI servers the runner drives, each configured, bounded and patched as `openenv serve` runs it.

- `_uvicorn` and `_uvicorn_protocols`: uvicorn (asyncio), with bounded, cheaper protocols.
- `_hypercorn`, `_hypercorn_limits` and `_hypercorn_patches`: hypercorn on asyncio or trio, capped.
- `_websocket_front`: WebSocket connections served beside hypercorn on trio by websockets' protocol.
"""
