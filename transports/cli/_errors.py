"""What the ``openenv`` command says when a user's mistake stops it: one line, what to do, no traceback.

Every failure a user can cause ends in one line on stderr (``Error: ...``) and
exit status 1 (2 for a misused command line). A traceback is shown only with
``openenv --debug``, or for what is not a user's mistake (a bug: report it).

The mapping from errors to those lines lives here, in one place: `listen_error`
for an address the server cannot take, `user_error` for failures any command
may meet (a missing extra), `CLIGroup` for the command line's own usage errors.
"""

from __future__ import annotations

import errno
import functools
import socket
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

import click
from click.exceptions import NoArgsIsHelpError

__all__ = ["CLIGroup", "listen_error", "require_installed", "user_error"]

# The extra that installs each optional module a command may import.
_EXTRA_OF_MODULE = {
    "starlette": "server",
    "uvicorn": "server",
    "hypercorn": "server",
    "prometheus_client": "server",
    "trio": "trio",
    "rich": "cli",
}


def listen_error(exc: OSError, host: str, port: int) -> str:
    """Say why the server cannot listen on ``host:port``, and what to do instead.

    Args:
        exc: The error binding the address raised.
        host: The ``--host`` given.
        port: The ``--port`` given.

    Returns:
        One line.
    """
    where = f"{host}:{port}"
    if isinstance(exc, socket.gaierror):
        return (
            f"cannot listen on {host!r}: no such host here; give an address such as 127.0.0.1 "
            "(this machine only) or 0.0.0.0 (every interface)"
        )
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {where}: the port is in use (another server?); stop it, "
            "or pick another --port (0 picks a free one)"
        )
    if exc.errno == errno.EACCES:
        return f"cannot listen on {where}: permission denied; pick a --port above 1023"
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"cannot listen on {where}: {host} is not an address of this machine; give one of its addresses, or 0.0.0.0"
        )
    return f"cannot listen on {where}: {exc.strerror or exc}"


def require_installed(module: str) -> None:
    """Fail with the line `user_error` gives if ``module`` (one an extra installs) cannot be imported.

    Args:
        module: The module's name, such as ``"trio"``.

    Raises:
        click.ClickException: It is not installed.
    """
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise click.ClickException(_missing_extra(module))


def _missing_extra(module: str) -> str:
    extra = _EXTRA_OF_MODULE.get(module)
    if extra is None:
        return f"{module} is not installed: pip install {module}"
    return f"{module} is not installed: pip install 'openenv-anyio[{extra}]'"


def user_error(exc: BaseException) -> str | None:
    """The line to print for an error a user caused that no command caught, or ``None`` for a bug.

    Args:
        exc: What a command raised.

    Returns:
        One line saying what to do, or ``None`` if the error is not the user's
        (it is then shown with its traceback).
    """
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.partition(".")[0]
        if top in _EXTRA_OF_MODULE:
            return _missing_extra(top)
    return None


class CLIGroup(click.Group):
    """A click group whose every failure is one line on stderr; ``--debug`` adds the traceback."""

    debug = False

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            message = user_error(exc)
            if message is None:
                raise  # not the user's mistake: the traceback is for a bug report
            raise click.ClickException(message) from exc

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        run = functools.partial(super().main, args, prog_name, complete_var, standalone_mode=False, **extra)
        if not standalone_mode:
            return run()
        self.debug = False
        try:
            result: Any = run()
        except NoArgsIsHelpError as exc:  # ``openenv`` alone: the help, not an error line
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            hint = f" ({exc.ctx.command_path} -h for help)" if exc.ctx is not None else ""
            self._fail(exc, f"{exc.format_message().rstrip('.')}{hint}")
        except click.ClickException as exc:
            self._fail(exc, exc.format_message())
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)

    def _fail(self, exc: click.ClickException, message: str) -> NoReturn:
        if self.debug and exc.__cause__ is not None:
            traceback.print_exception(type(exc.__cause__), exc.__cause__, exc.__cause__.__traceback__)
        click.echo(f"Error: {message}", err=True)
        sys.exit(exc.exit_code)
