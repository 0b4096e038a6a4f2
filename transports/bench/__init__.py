"""Measure an environment server's throughput and step latency, as ``openenv bench`` does.

The command line is a thin layer over `run_benchmark`; scripts can call it too::

    import anyio
    from functools import partial
    from transports.bench import run_benchmark

    result = anyio.run(partial(run_benchmark, "ws://127.0.0.1:8000", sessions=8, seconds=10))
    print(result.steps_per_second, result.latency_ms.p99)

- `run_benchmark` runs concurrent sessions and times each step (`BenchResult`);
- `summarize_latencies` and `percentile` turn latencies into a `LatencySummary`;
- `fetch_action_schema` and `minimal_action` build an action when none is given;
- `json_document`, `results_table` and `print_table` show the results.
"""

from transports.bench._report import JSON_RESULT_KEYS, json_document, print_table, results_table
from transports.bench._runner import (
    DEFAULT_STEPS,
    BenchmarkError,
    BenchResult,
    ProgressCallback,
    resolve_action,
    run_benchmark,
)
from transports.bench._schema_action import SchemaActionError, minimal_action, minimal_instance
from transports.bench._schema_fetch import SchemaUnavailable, fetch_action_schema, schema_url
from transports.bench._stats import LatencySummary, percentile, summarize_latencies

__all__ = [
    "DEFAULT_STEPS",
    "JSON_RESULT_KEYS",
    "BenchResult",
    "BenchmarkError",
    "LatencySummary",
    "ProgressCallback",
    "SchemaActionError",
    "SchemaUnavailable",
    "fetch_action_schema",
    "json_document",
    "minimal_action",
    "minimal_instance",
    "percentile",
    "print_table",
    "resolve_action",
    "results_table",
    "run_benchmark",
    "schema_url",
    "summarize_latencies",
]
