"""Who and what a server lets in, shared by every server end: checked before any environment is built.

- `_guard`: who may use the server at all: the ``Host``, ``Origin`` and bearer-token checks.
- `_sessions`: how many: the registry of the session slots every endpoint of one app shares
  (capacity, per-client quota, idle reaping, shutdown);
- `_lease`: one session's slot; `_queue`: the sessions waiting for a slot, in order.
"""
