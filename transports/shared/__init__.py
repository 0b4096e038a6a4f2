"""What several transports use, client or server end: no transport of its own.

- `_network_client`: the network clients' URLs, headers, connects and error messages.
- `_wrapping`: a transport that carries its frames on another one (``http+mcp://``, ``project://``).
- `_auth`: the bearer token's environment variable, which both ends read.
- `_asgi`: the ASGI types the raw endpoints are written against; `_error_body`: openenv's JSON error body.
- `_raw_http`: answering HTTP requests as raw ASGI (bodies, headers, error responses), for the hot routes.
- `_public_io`: the switch to other libraries' public classes only (``OPENENV_PUBLIC_IO=1``).
- `_locks`: taking a nearly always free lock cheaply; `_deprecated`: old option names.
"""
