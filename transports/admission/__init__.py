"""Who and what a server lets in, shared by every server end: checked before any environment is built.

- `_guard`: who may use the server at all: the ``Host``, ``Origin`` and bearer-token checks.
- `_sessions`: how many: the session slots every endpoint of one app shares, their idle reaping,
  and the queue of connections waiting for a slot.
"""
