"""How benchmark results are shown: a rich table for people, one JSON document for programs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

import openenv
from transports.bench._runner import BenchResult

__all__ = ["JSON_RESULT_KEYS", "json_document", "print_table", "results_table"]

# The keys of each result in the JSON document: a contract with the programs that parse it.
JSON_RESULT_KEYS = (
    "url",
    "transport",
    "sessions",
    "steps",
    "errors",
    "resets",
    "seconds",
    "steps_per_second",
    "latency_ms",
    "error_examples",
)


def json_document(results: Sequence[BenchResult], *, backend: str) -> dict[str, Any]:
    """The JSON document ``openenv bench --json`` prints.

    Args:
        results: One result per URL, in order.
        backend: The event loop the client ran on (``"asyncio"`` or ``"trio"``).

    Returns:
        ``{"openenv_version", "backend", "results": [...]}``, each result with the
        keys of `JSON_RESULT_KEYS`; latencies in milliseconds (``null`` when no
        step succeeded).
    """
    rows = []
    for result in results:
        fields = msgspec.to_builtins(result)
        rows.append({key: fields[key] for key in JSON_RESULT_KEYS})
    return {"openenv_version": openenv.__version__, "backend": backend, "results": rows}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


_HEADERS = ("sessions", "steps", "errors", "resets", "seconds", "steps/s", "mean", "p50", "p90", "p99", "max")


def _cells(result: BenchResult) -> list[str | Text]:
    """The row of a result, after its URL and transport, in the order of `_HEADERS`."""
    latency = result.latency_ms
    return [
        str(result.sessions),
        str(result.steps),
        Text(str(result.errors), style="red") if result.errors else "0",
        str(result.resets),
        f"{result.seconds:.2f}",
        f"{result.steps_per_second:,.0f}",
        *(_ms(value) for value in (latency.mean, latency.p50, latency.p90, latency.p99, latency.max)),
    ]


def results_table(results: Sequence[BenchResult], *, transposed: bool = False) -> Table:
    """A table with one row per URL: throughput, then latencies (mean and percentiles) in milliseconds.

    Args:
        results: One result per URL, in order.
        transposed: One column per URL instead, one row per figure: for narrow screens.

    Returns:
        A `rich.table.Table`, to print on a `rich.console.Console`.
    """
    table = Table(box=box.SIMPLE_HEAD, caption="latencies in milliseconds", caption_justify="left")
    if transposed:
        table.add_column("")
        for result in results:
            table.add_column(Text(result.url), justify="right", overflow="fold")
        columns = [[Text(result.transport), *_cells(result)] for result in results]
        for index, header in enumerate(("transport", *_HEADERS)):
            table.add_row(header, *(column[index] for column in columns))
        return table
    table.add_column("URL", overflow="fold")
    table.add_column("transport")
    for header in _HEADERS:
        table.add_column(header, justify="right", no_wrap=True)
    for result in results:
        table.add_row(Text(result.url), Text(result.transport), *_cells(result))
    return table


def print_table(results: Sequence[BenchResult], console: Console) -> None:
    """Print the results' table, and under it a few error messages of each URL that had errors.

    The table has one row per URL; on a console too narrow for that, one column per URL.

    Args:
        results: One result per URL, in order.
        console: Where to print.
    """
    table = results_table(results)
    if Measurement.get(console, console.options.update_width(10_000), table).maximum > console.width:
        table = results_table(results, transposed=True)
    console.print(table)
    for result in results:
        if result.error_examples:
            console.print(f"[bold]{escape(result.url)}[/bold]: {result.errors} errors, for example:", highlight=False)
            for message in result.error_examples:
                console.print(f"  {message}", markup=False, highlight=False)
