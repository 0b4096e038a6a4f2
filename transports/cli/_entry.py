"""The ``openenv`` script: runs the command line, or says in one line which extra it needs.

The command's own libraries (click, rich) come with the ``cli`` extra, which the
``server`` and ``test`` extras pull in; a client-only install has no command.
"""

from __future__ import annotations

import importlib
import sys
import warnings

from transports.cli._coexistence import foreign_openenv, shadowed_upstream

__all__ = ["main"]

_CLI_LIBRARIES = ("click", "rich")


def main() -> None:
    """Run ``openenv``; print one line and exit with status 1 when it cannot run.

    It cannot when the ``openenv`` package Python imports is upstream OpenEnv's
    (see `transports.cli._coexistence`), or without click or rich. When upstream's
    files are mixed into ours, it says so in one line, and runs.
    """
    with warnings.catch_warnings(record=True) as caught:  # openenv's import warnings, as one line each
        warnings.simplefilter("always", RuntimeWarning)
        problem = foreign_openenv()  # before anything imports openenv's own modules
    if problem is not None:
        sys.stderr.write(f"Error: {problem}\n")
        raise SystemExit(1)
    for warning in caught:
        sys.stderr.write(f"Warning: {warning.message}\n")
    shadowed = None if caught else shadowed_upstream()  # a mixed install has said it all
    if shadowed is not None:
        sys.stderr.write(f"Warning: {shadowed}\n")
    for library in _CLI_LIBRARIES:
        try:
            importlib.import_module(library)
        except ModuleNotFoundError:
            sys.stderr.write(f"Error: the openenv command needs {library}: pip install 'openenv-anyio[cli]'\n")
            raise SystemExit(1) from None
    from transports.cli._commands import main as command

    command(prog_name="openenv")
