"""The ``openenv`` script: runs the command line, or says in one line which extra it needs.

The command's own libraries (click, rich) come with the ``cli`` extra, which the
``server`` and ``test`` extras pull in; a client-only install has no command.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["main"]

_CLI_LIBRARIES = ("click", "rich")


def main() -> None:
    """Run ``openenv``; without click or rich, print what to install and exit with status 1."""
    for library in _CLI_LIBRARIES:
        try:
            importlib.import_module(library)
        except ModuleNotFoundError:
            sys.stderr.write(f"Error: the openenv command needs {library}: pip install 'openenv[cli]'\n")
            raise SystemExit(1) from None
    from .cli import main as command

    command(prog_name="openenv")
