"""``python -m transports.cli``: the ``openenv`` command."""

from transports.cli._commands import main

main(prog_name="openenv")
