"""The first thing every script run with a reference's python does: import *its* ``openenv``.

Stdlib only; the scripts beside it import it by name (a script's own folder
is first on ``sys.path``). Ours and the reference both install a package named
``openenv``: a script that found ours (a stray ``PYTHONPATH``, a script run
with the wrong python) would test our code against itself and pass. So it
refuses to run.

The reference's ``openenv.core.env_server`` imports its gradio web UI eagerly
(~5 s of a ~9 s import). Marking that one module absent takes the reference's
own ``except ModuleNotFoundError`` fallback; the HTTP, WebSocket and MCP paths
never use it.
"""

from __future__ import annotations

import os
import sys

FULL_IMPORT_FLAG = "--full-import"
"""A script's command-line flag that imports the web UI after all (removed from ``sys.argv``)."""


def import_reference_openenv() -> None:
    """Import the reference's ``openenv`` without its web UI; exit if ``openenv`` is not the venv's own."""
    if FULL_IMPORT_FLAG in sys.argv:
        sys.argv.remove(FULL_IMPORT_FLAG)
    else:
        sys.modules.setdefault("openenv.core.env_server.web_interface", None)  # type: ignore[arg-type]
    import openenv

    if not os.path.realpath(openenv.__file__).startswith(os.path.realpath(sys.prefix)):
        sys.exit(f"refusing to run: 'openenv' resolves to {openenv.__file__}, not the reference venv ({sys.prefix})")
