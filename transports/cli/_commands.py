"""The ``openenv`` command line: serve an environment, or watch the echo demo run.

```
openenv [--debug] serve package.module:Factory [--host H] [--port P] [--backend asyncio|trio]
                                     [--max-sessions N] [--session-idle-timeout S]
                                     [--http-idle-timeout S] [--metrics]
openenv demo [--backend asyncio|trio|both]
openenv bench URL [URL ...] [--steps N | --seconds T] [--sessions C] [--action JSON|@FILE]
                            [--warmup N] [--timeout S] [--backend asyncio|trio] [--auth-token T]
                            [--json] [--no-progress]
openenv --version
```

The demo itself lives in `transports.cli._demo`. A failure the user can cause
prints one line saying what to do (see `transports.cli._errors`); ``--debug``
adds its traceback.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import typing
from pathlib import Path
from typing import Any, cast

import click
import msgspec

import openenv
from openenv.server import SERVER_DEFAULTS, LogLevel, ServerConfig
from transports.cli._errors import CLIGroup, listen_error, require_installed

__all__ = ["main"]

LOG_LEVELS = typing.get_args(LogLevel)


@click.group(cls=CLIGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(openenv.__version__, "-V", "--version", prog_name="openenv")
@click.option("--debug", is_flag=True, help="On an error, show its traceback too.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Serve environments and try them out."""
    cast(CLIGroup, ctx.command).debug = debug


@main.command()
@click.argument("factory")
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option(
    "--backend",
    type=click.Choice(["asyncio", "trio"]),
    default="asyncio",
    show_default=True,
    help="The event loop (asyncio runs uvicorn, trio runs hypercorn+websockets).",
)
@click.option(
    "--server",
    type=click.Choice(["uvicorn", "hypercorn", "hypercorn+websockets"]),
    default=None,
    help="The ASGI server, if not the backend's default.",
)
@click.option(
    "--max-sessions",
    type=click.IntRange(min=1),
    default=SERVER_DEFAULTS.max_sessions,
    show_default=True,
    help="The most sessions open at once.",
)
@click.option(
    "--session-idle-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=SERVER_DEFAULTS.session_idle_timeout,
    show_default=True,
    help="Seconds a session may go without its client (no request, no open connection) before it is closed.",
)
@click.option(
    "--http-idle-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=SERVER_DEFAULTS.http_idle_timeout,
    show_default=True,
    help="The same for HTTP long-polling sessions, whose clients cannot be seen leaving.",
)
@click.option(
    "--max-message-size",
    type=click.IntRange(min=1),
    default=SERVER_DEFAULTS.max_message_size,
    show_default=True,
    help="The largest message accepted, in bytes: a WebSocket message, or an HTTP request body.",
)
@click.option(
    "--header-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=SERVER_DEFAULTS.header_timeout,
    show_default=True,
    help="Seconds a connection may take to send a request's headers (or WebSocket handshake).",
)
@click.option(
    "--body-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=SERVER_DEFAULTS.body_timeout,
    show_default=True,
    help="Seconds a request's body may take, plus one for every 64 KiB received; then 408 and the "
    "connection is closed.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=SERVER_DEFAULTS.max_connections,
    show_default=True,
    help="The most connections at once (uvicorn; beyond, requests get 503).",
)
@click.option(
    "--queue-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds a new session may wait for a free slot at --max-sessions (in arrival order) "
    "before it is refused; by default it is refused at once.",
)
@click.option(
    "--max-sessions-per-client",
    type=click.IntRange(min=1),
    default=None,
    help="The most sessions one client (its token, or else its address) may hold at once, queued ones "
    "included; by default no quota.",
)
@click.option(
    "--step-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds one request (a step, a tool call) may run before the server ends its session; by "
    "default a step runs as long as its client stays.",
)
@click.option(
    "--hide-error-details",
    is_flag=True,
    help="Error replies say only that the environment failed, not its exception (the log keeps it).",
)
@click.option(
    "--auth-token-file",
    "auth_token_files",
    multiple=True,
    envvar="OPENENV_AUTH_TOKEN_FILE",
    type=click.Path(dir_okay=False),
    help="A file holding the bearer token clients must send (Authorization: Bearer TOKEN), or several, "
    "one a line; repeatable. Also read from OPENENV_AUTH_TOKEN_FILE. /health stays open.",
)
@click.option(
    "--auth-token",
    "auth_tokens",
    multiple=True,
    envvar="OPENENV_AUTH_TOKEN",
    help="A bearer token given as it is: prefer OPENENV_AUTH_TOKEN or --auth-token-file, as the "
    "command line shows in the process list. Repeat it to accept several.",
)
@click.option(
    "--allow-origin",
    "allow_origins",
    multiple=True,
    help="A browser origin (https://app.example, or '*') whose requests are accepted, with CORS headers; "
    "repeatable. By default requests carrying an Origin header are refused.",
)
@click.option(
    "--allow-host",
    "allowed_hosts",
    multiple=True,
    help="A host name clients may reach a server without a token by (besides IP addresses and localhost), "
    "or '*'; repeatable. Other Host headers get 403 (DNS rebinding).",
)
@click.option(
    "--metrics",
    is_flag=True,
    help="Serve GET /metrics for Prometheus (sessions, steps, latency, errors, bytes); behind --auth-token if set.",
)
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True, help="The log level.")
@click.option(
    "--app-dir",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Looks for the factory's module here first (as uvicorn does).",
)
def serve(
    factory: str,
    host: str,
    port: int,
    backend: str,
    server: str | None,
    max_sessions: int | None,
    session_idle_timeout: float | None,
    http_idle_timeout: float,
    max_message_size: int,
    header_timeout: float,
    body_timeout: float,
    max_connections: int,
    queue_timeout: float | None,
    max_sessions_per_client: int | None,
    step_timeout: float | None,
    hide_error_details: bool,
    auth_token_files: tuple[str, ...],
    auth_tokens: tuple[str, ...],
    allow_origins: tuple[str, ...],
    allowed_hosts: tuple[str, ...],
    metrics: bool,
    log_level: str,
    app_dir: str,
) -> None:
    """Serve FACTORY (package.module:Factory) over WebSocket and HTTP long-polling until Ctrl-C.

    FACTORY builds one environment per session: usually an openenv.Environment
    subclass. It may also name an app, as uvicorn takes one: an environment package
    written for upstream OpenEnv serves as its server/app.py's create_app() made it
    (package.server.app:app), with the options it set there. Clients connect to
    ws://HOST:PORT or http://HOST:PORT (WebSocket; the client appends the endpoint,
    /ws), or to http+poll://HOST:PORT for HTTP long-polling (under /poll/sessions).
    """
    if backend == "trio":
        require_installed("trio")
        if server == "uvicorn":
            raise click.UsageError("uvicorn runs on asyncio only: use --server hypercorn, or --backend asyncio")
    elif server == "hypercorn+websockets":
        raise click.UsageError("hypercorn+websockets runs on trio only: use --backend trio, or --server uvicorn")
    context = click.get_current_context()
    if auth_tokens and context.get_parameter_source("auth_tokens") is click.core.ParameterSource.COMMANDLINE:
        click.echo(
            "openenv: warning: --auth-token shows the token to anyone who can list processes (ps); "
            "give it in OPENENV_AUTH_TOKEN or a file (--auth-token-file) instead",
            err=True,
        )
    tokens = [*auth_tokens, *(token for path in auth_token_files for token in _read_token_file(path))]

    from starlette.applications import Starlette

    from openenv.server import load_factory
    from transports.server.app import create_app
    from transports.server.runner import RunningServer, run

    sys.path.insert(0, os.path.abspath(app_dir))
    try:
        env_factory = load_factory(factory)
    except ModuleNotFoundError as exc:
        raise click.BadParameter(_missing_module(exc, factory, app_dir), param_hint="FACTORY") from exc
    except (ImportError, ValueError, TypeError) as exc:
        raise click.BadParameter(str(exc), param_hint="FACTORY") from exc
    except Exception as exc:  # the user's module raised on import: --debug shows where
        message = f"importing it raised {type(exc).__name__}: {exc} (openenv --debug serve ... shows where)"
        raise click.BadParameter(message, param_hint="FACTORY") from exc

    def announce(running: RunningServer) -> None:
        # The URLs a client takes: EnvClient appends /ws itself, as OpenEnv's client does.
        ws_url = running.url.replace("http://", "ws://", 1)
        poll_url = running.url.replace("http://", "http+poll://", 1)
        click.echo(
            f"openenv: serving {factory} on {running.url} ({running.server} on {backend}); clients connect to "
            f"{ws_url} (WebSocket) or {poll_url} (HTTP long-polling); press CTRL+C to quit",
            err=True,
        )

    config = ServerConfig(
        server=cast(Any, server),
        max_sessions=max_sessions,
        session_idle_timeout=session_idle_timeout,
        http_idle_timeout=http_idle_timeout,
        max_message_size=max_message_size,
        header_timeout=header_timeout,
        max_connections=max_connections,
        queue_timeout=queue_timeout,
        error_details=not hide_error_details,
        auth_token=tuple(tokens),
        allow_origins=allow_origins,
        metrics=metrics,
        allowed_hosts=allowed_hosts,
        body_timeout=body_timeout,
        max_sessions_per_client=max_sessions_per_client,
        step_timeout=step_timeout,
        log_level=cast(Any, log_level),
    )
    if isinstance(env_factory, Starlette):  # an app, as uvicorn takes one: an environment package's create_app()
        app = env_factory
        given_here = context.get_parameter_source("auth_tokens") is click.core.ParameterSource.COMMANDLINE
        if not given_here and not auth_token_files:  # the app read OPENENV_AUTH_TOKEN itself, in create_app()
            config = msgspec.structs.replace(config, auth_token=None)
    else:
        try:
            app = create_app(env_factory, config=config)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--auth-token") from exc
    try:
        run(app, config=config, host=host, port=port, backend=cast(Any, backend), on_ready=announce)
    except ValueError as exc:  # an option the app's create_app() sets already
        raise click.BadParameter(str(exc), param_hint="FACTORY") from exc
    except OSError as exc:
        raise click.ClickException(listen_error(exc, host, port)) from exc
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc


def _read_token_file(path: str) -> list[str]:
    """The tokens in a token file: one a line; blank lines and lines starting with ``#`` are skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise click.BadParameter(f"cannot read {path}: {reason}", param_hint="--auth-token-file") from exc
    tokens = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not tokens:
        raise click.BadParameter(f"{path} holds no token", param_hint="--auth-token-file")
    return tokens


def _missing_module(exc: ModuleNotFoundError, factory: str, app_dir: str) -> str:
    """What to do when serving FACTORY meets a module that is not there: where it was looked for."""
    module = factory.partition(":")[0]
    missing = exc.name or ""
    if missing and (module == missing or module.startswith(f"{missing}.")):
        folder = os.path.abspath(app_dir)
        return (
            f"no module named {missing!r} in {folder} nor among the installed packages: run from the folder "
            f"that holds it, give that folder with --app-dir, or pip install the package"
        )
    return f"importing {module} failed: {exc}; pip install it into this environment"


# -- demo ------------------------------------------------------------------------


@main.command()
@click.option(
    "--backend",
    type=click.Choice(["asyncio", "trio", "both"]),
    default="both",
    show_default=True,
    help="The event loop(s) to run the demo on.",
)
def demo(backend: str) -> None:
    """Run the echo environment over every available transport, and show what comes back.

    For each transport it resets, steps, resets and steps again (reset_async /
    step_async) and reads the state through the async client, then once more
    through the blocking .sync() facade. Exits non-zero if anything fails.
    """
    from transports.cli._demo import run_demo

    backends = ["asyncio", "trio"] if backend == "both" else [backend]
    if "trio" in backends and importlib.util.find_spec("trio") is None:
        if backend == "trio":
            require_installed("trio")
        click.echo("(trio is not installed: the demo runs on asyncio only)")
        backends.remove("trio")
    if not run_demo(backends):
        raise click.ClickException("the demo failed")
    click.secho("all good", fg="green")


# -- install ---------------------------------------------------------------------


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("package")
@click.argument("pip_options", nargs=-1, type=click.UNPROCESSED)
def install(package: str, pip_options: tuple[str, ...]) -> None:
    """Install PACKAGE, an environment written for upstream OpenEnv, without upstream's openenv.

    PACKAGE is what pip installs: a folder, a wheel, or a name on an index
    (name[extra] too). Its requirements are installed with it, except upstream's
    openenv (or openenv-core), which pip would otherwise put over this one:
    openenv-anyio's openenv.core stands in for it. PIP_OPTIONS go to pip as they
    are (--index-url URL, --no-index, ...).
    """
    from transports.cli._coexistence import upstream_installed
    from transports.cli._install import PipFailed
    from transports.cli._install import install as install_package

    try:
        name, requirements = install_package(package, pip_options)
    except PipFailed as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"openenv: installed {name} and its {len(requirements)} requirements, upstream's openenv left out", err=True
    )
    upstream = upstream_installed()
    if upstream is not None:
        click.echo(f"openenv: warning: {upstream} is installed here all the same (pip uninstall it)", err=True)


# -- bench -----------------------------------------------------------------------


def _parse_action(ctx: click.Context, param: click.Parameter, value: str | None) -> dict[str, Any] | None:
    """``--action``: a JSON object, given inline or as ``@FILE``."""
    if value is None:
        return None
    text = value
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise click.BadParameter(f"cannot read {value[1:]}: {exc.strerror or exc}") from exc
    try:
        action = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}") from exc
    if not isinstance(action, dict):
        raise click.BadParameter('the action must be a JSON object, such as \'{"message": "hi"}\'')
    return action


@main.command()
@click.argument("urls", nargs=-1, required=True, metavar="URL [URL ...]")
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=None,
    help="Steps to take in all, over all sessions.  [default: 1000, unless --seconds]",
)
@click.option(
    "--seconds", type=click.FloatRange(min=0, min_open=True), default=None, help="Measure for this long instead."
)
@click.option(
    "--sessions", type=click.IntRange(min=1), default=1, show_default=True, help="Concurrent sessions (clients)."
)
@click.option(
    "--action",
    callback=_parse_action,
    help="The action to step with: a JSON object, or @FILE holding one. By default, the smallest action "
    "the environment's action schema allows.",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Steps each session takes before the measurement starts (not measured).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds to wait for a connection, and for each reply (a step that times out is an error).",
)
@click.option(
    "--backend",
    type=click.Choice(["asyncio", "trio"]),
    default="asyncio",
    show_default=True,
    help="The event loop the clients run on.",
)
@click.option(
    "--auth-token",
    envvar="OPENENV_AUTH_TOKEN",
    help="The server's bearer token, for its /schema and every session. Also read from OPENENV_AUTH_TOKEN.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout instead of a table.")
@click.option(
    "--no-progress",
    is_flag=True,
    help="No progress bar (there is none anyway with --json, or when stderr is not a terminal).",
)
def bench(
    urls: tuple[str, ...],
    steps: int | None,
    seconds: float | None,
    sessions: int,
    action: dict[str, Any] | None,
    warmup: int,
    timeout: float,
    backend: str,
    auth_token: str | None,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Measure environment servers: steps per second and step latency, one row per URL.

    Each URL is measured in turn; its scheme picks the transport (ws://, http://,
    http+poll://, inproc://module:Factory, ...). SESSIONS clients connect, reset
    and warm up, then step together until STEPS steps are taken in all or
    SECONDS have passed; each step's latency is the wall time of its call. A
    step that says done is followed by a reset, which is not measured.

    Exits non-zero if a URL cannot be measured (no server, no action, no
    capacity), or if not one of its steps succeeded.
    """
    import anyio
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from transports.bench import DEFAULT_STEPS, BenchmarkError, BenchResult, json_document, print_table, run_benchmark

    if steps is not None and seconds is not None:
        raise click.UsageError("give --steps or --seconds, not both")
    if backend == "trio":
        require_installed("trio")

    stderr = Console(stderr=True)
    counter = MofNCompleteColumn() if seconds is None else TextColumn("{task.completed:.1f}/{task.total:g} s")
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        counter,
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        # rich would only print the last frame to a file; show nothing there instead.
        disable=no_progress or as_json or not stderr.is_terminal,
    )

    results: list[BenchResult] = []
    failures: list[str] = []

    async def measure_all() -> None:
        with progress:
            for url in urls:
                task = progress.add_task(url, total=seconds if seconds is not None else steps or DEFAULT_STEPS)

                def show(taken: int, elapsed: float, task: Any = task) -> None:
                    progress.update(task, completed=taken if seconds is None else min(elapsed, seconds))

                try:
                    result = await run_benchmark(
                        url,
                        action=action,
                        sessions=sessions,
                        steps=steps,
                        seconds=seconds,
                        warmup=warmup,
                        timeout=timeout,
                        auth_token=auth_token,
                        on_progress=None if progress.disable else show,
                    )
                except BenchmarkError as exc:  # the other URLs are still measured and reported
                    failures.append(str(exc))
                    progress.remove_task(task)
                    continue
                results.append(result)

    # inproc://module:Factory imports from the current directory, as `openenv serve` does.
    sys.path.insert(0, os.getcwd())
    # In-process environments run here: their errors are counted and shown, not logged with tracebacks.
    quiet = logging.NullHandler()
    server_logger = logging.getLogger("openenv.server")
    server_logger.addHandler(quiet)
    try:
        anyio.run(measure_all, backend=backend)
    finally:
        server_logger.removeHandler(quiet)
    if as_json:
        click.echo(json.dumps(json_document(results, backend=backend), indent=2))
    elif results:
        print_table(results, Console())
    failed = [result.url for result in results if result.steps == 0]
    if failed:
        hint = "" if action is not None else " with the action built from its schema: pass one with --action"
        failures.append(f"not one step succeeded at {', '.join(failed)}{hint}")
    if failures:
        raise click.ClickException("; ".join(failures))
