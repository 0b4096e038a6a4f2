"""The ``openenv`` command line: ``serve``, ``demo``, ``bench`` and ``install``.

- `_entry`: the script itself; it says in one line when the ``cli`` extra or our ``openenv`` is missing.
- `_commands`: the commands (click); `_errors`: a user's mistake as one line, no traceback.
- `_demo`: ``openenv demo``; `_coexistence`: telling when upstream OpenEnv's ``openenv`` is imported.
- `_install`: ``openenv install``: an upstream environment package, without upstream's ``openenv``.

Run it as ``openenv`` or ``python -m transports.cli``.
"""
