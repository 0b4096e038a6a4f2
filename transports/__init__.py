"""The transports that carry openenv's frames: each module holds both ends of one.

- `transports.inprocess`: ``inproc://`` (same event loop; tests and local runs).
- `transports.websocket`: ``ws://``, ``wss://``, ``http://``, ``https://``.
- `transports.http`: ``http+poll://``, ``https+poll://`` (HTTP long-polling).

They join the ``openenv.transports`` entry-point group, as a third party's would.
"""
