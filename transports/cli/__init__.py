"""The ``openenv`` command line: ``serve``, ``demo`` and ``bench``.

- `_entry`: the script itself; it says in one line when the ``cli`` extra or our ``openenv`` is missing.
- `_commands`: the commands (click); `_errors`: a user's mistake as one line, no traceback.
- `_demo`: ``openenv demo``; `_coexistence`: telling when upstream OpenEnv's ``openenv`` is imported.

Run it as ``openenv`` or ``python -m transports.cli``.
"""
