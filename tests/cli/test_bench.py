"""`openenv bench` and `transports.bench`: percentiles, actions built from schemas, measurements, the command.

Measurements run against real servers (embedded, loopback, port 0) and in-process
environments; nothing asserts on speed, only on what was counted.
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import msgspec
import pytest
from anyio.from_thread import start_blocking_portal
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

import openenv
from openenv.examples.echo import EchoEnvironment
from openenv.server import environment_schemas
from tests.envs import (
    AsyncCounterEnv,
    BenchRichAction,
    BenchRichEnv,
    DictEnv,
    EveryStepFailsEnv,
    EveryThirdStepFailsEnv,
    MessageEchoEnv,
    OncePerEpisodeEnv,
)
from tests.serving import TRANSPORTS, factory_path, serving
from transports.bench import (
    JSON_RESULT_KEYS,
    BenchmarkError,
    BenchResult,
    LatencySummary,
    SchemaActionError,
    SchemaUnavailable,
    fetch_action_schema,
    json_document,
    minimal_action,
    minimal_instance,
    percentile,
    print_table,
    run_benchmark,
    schema_url,
    summarize_latencies,
)
from transports.cli._commands import main

# -- percentiles ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([7.0], 0, 7.0),
        ([7.0], 50, 7.0),
        ([7.0], 100, 7.0),
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([10.0, 20.0, 30.0, 40.0, 50.0], 25, 20.0),
        ([10.0, 20.0, 30.0, 40.0, 50.0], 90, 46.0),
        ([10.0, 20.0, 30.0, 40.0, 50.0], 99, 49.6),
        ([0.0, 100.0], 99, 99.0),
        ([5.0, 5.0, 5.0], 37, 5.0),
    ],
)
def test_percentile_known_values(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


@pytest.mark.parametrize("q", [-1, 100.5])
def test_percentile_rejects_q_outside_0_to_100(q: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 100"):
        percentile([1.0, 2.0], q)


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


latency_lists = st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), min_size=2, max_size=200)


@given(values=latency_lists, q=st.integers(min_value=1, max_value=99))
def test_percentile_is_linear_interpolation_as_statistics_quantiles_computes_it(values: list[float], q: int) -> None:
    ordered = sorted(values)
    oracle = statistics.quantiles(ordered, n=100, method="inclusive")[q - 1]
    assert math.isclose(percentile(ordered, q), oracle, rel_tol=1e-9, abs_tol=1e-9)


@given(values=latency_lists, low=st.floats(0, 100), high=st.floats(0, 100))
def test_percentile_lies_within_the_values_and_grows_with_q(values: list[float], low: float, high: float) -> None:
    ordered = sorted(values)
    low, high = min(low, high), max(low, high)
    assert ordered[0] <= percentile(ordered, low) <= percentile(ordered, high) <= ordered[-1]
    assert percentile(ordered, 0) == ordered[0]
    assert percentile(ordered, 100) == ordered[-1]


def test_summary_is_in_milliseconds() -> None:
    summary = summarize_latencies([0.003, 0.001, 0.002])
    assert summary.mean == pytest.approx(2.0)
    assert summary.p50 == pytest.approx(2.0)
    assert summary.p90 == pytest.approx(2.8)
    assert summary.max == pytest.approx(3.0)


def test_summary_of_no_steps_is_empty() -> None:
    assert summarize_latencies([]) == LatencySummary(mean=None, p50=None, p90=None, p99=None, max=None)


# -- actions built from schemas -------------------------------------------------------


def test_echo_environment_action_is_its_first_example_tool() -> None:
    assert minimal_action(environment_schemas(EchoEnvironment)["action"]) == {"tool_name": "echo_message"}


def test_an_inprocess_schema_is_fetched_without_the_asgi_app() -> None:
    code = (
        "import sys, anyio; from transports.bench import fetch_action_schema; "
        "schema = anyio.run(fetch_action_schema, 'inproc://tests.envs:MessageEchoEnv'); "
        "print(sorted(schema['properties']), [m for m in ('transports.server.app', 'starlette') if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.stdout.strip() == "['message', 'metadata'] []"


def test_actions_of_the_test_environments() -> None:
    assert minimal_action(environment_schemas(MessageEchoEnv)["action"]) == {"message": ""}
    assert minimal_action(environment_schemas(AsyncCounterEnv)["action"]) == {}  # every field has a default
    assert minimal_action(environment_schemas(DictEnv)["action"]) == {}  # untyped: anything goes


def test_reference_style_pydantic_schema() -> None:
    # What OpenEnv's reference server answers for its echo action (pydantic's model_json_schema).
    schema = {
        "additionalProperties": False,
        "properties": {
            "metadata": {"additionalProperties": True, "description": "Additional metadata", "type": "object"},
            "message": {"title": "Message", "type": "string"},
        },
        "required": ["message"],
        "title": "EchoAction",
        "type": "object",
    }
    assert minimal_action(schema) == {"message": ""}


def test_a_rich_msgspec_schema_gives_an_action_msgspec_accepts() -> None:
    schema = environment_schemas(BenchRichEnv)["action"]
    action = minimal_action(schema)
    assert action["kind"] in ("look", "move")
    assert len(action["path"]) == 2
    assert msgspec.convert(action, BenchRichAction).count == 3


class Point(msgspec.Struct):
    x: float
    y: float = 0.0


class Shape(msgspec.Struct, tag=True):
    corners: Annotated[list[Point], msgspec.Meta(min_length=3)]


class Circle(msgspec.Struct, tag=True):
    radius: Annotated[float, msgspec.Meta(ge=1)]


class Drawing(msgspec.Struct):
    shape: Shape | Circle
    mode: Literal["fill", "stroke"]
    layers: dict[str, Point]
    origin: Point | None
    scale: Annotated[int, msgspec.Meta(gt=0, multiple_of=4)]
    colour: Annotated[str, msgspec.Meta(min_length=1, max_length=8)]
    note: str = "none"


def test_msgspec_schemas_with_unions_tags_and_bounds() -> None:
    instance = minimal_instance(msgspec.json.schema(Drawing))
    drawing = msgspec.convert(instance, Drawing)
    assert drawing.scale == 4
    assert "note" not in instance  # not required: left out


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"const": 42}, 42),
        ({"type": "string", "default": "hi"}, "hi"),
        ({"enum": ["b", "a"]}, "b"),
        ({"type": "integer", "examples": [5]}, 5),
        ({"type": ["null", "string"]}, None),
        ({"type": "boolean"}, False),
        ({"type": "string", "minLength": 2}, "xx"),
        ({"type": "string", "format": "date-time"}, "1970-01-01T00:00:00Z"),
        ({"type": "string", "format": "uuid"}, "00000000-0000-0000-0000-000000000000"),
        ({"type": "integer", "minimum": 3}, 3),
        ({"type": "integer", "exclusiveMinimum": 3}, 4),
        ({"type": "integer", "maximum": -2}, -2),
        ({"type": "integer", "exclusiveMaximum": 0}, -1),
        ({"type": "integer", "minimum": 5, "multipleOf": 4}, 8),
        ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, 0.5),
        ({"type": "number", "minimum": 0}, 0.0),
        ({"type": "number", "minimum": 2, "exclusiveMinimum": True}, 3.0),  # draft 4
        ({"type": "array", "items": {"type": "integer"}}, []),
        ({"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 2}, [1, 1]),
        ({"type": "array", "items": [{"type": "string"}, {"type": "boolean"}]}, ["", False]),  # draft 7 tuple
        ({"prefixItems": [{"const": 1}], "minItems": 1}, [1]),
        ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, 0),
        ({"oneOf": [{"type": "string", "minLength": 1}, {"type": "null"}]}, "x"),
        ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}, {}),
        ({"required": ["a"], "additionalProperties": {"type": "integer"}}, {"a": 0}),
        ({"required": ["a"]}, {"a": None}),
        (
            {"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"required": ["b"]}]},
            {"a": 0, "b": None},
        ),
        ({"$ref": "#/definitions/T", "definitions": {"T": {"const": "t"}}}, "t"),
        ({"$ref": "#/$defs/T", "description": "d", "$defs": {"T": {"type": "integer"}}}, 0),
        (
            {
                "type": "object",
                "required": ["inner"],
                "properties": {"inner": {"allOf": [{"$ref": "#/$defs/In"}], "description": "pydantic v1 style"}},
                "$defs": {"In": {"type": "object", "required": ["v"], "properties": {"v": {"enum": [3, 4]}}}},
            },
            {"inner": {"v": 3}},
        ),
        ({}, None),
        (True, None),
    ],
)
def test_minimal_instance(schema: Any, expected: Any) -> None:
    assert minimal_instance(schema) == expected


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (False, "admits no value"),
        ({"$ref": "https://example.com/schema.json"}, "only '#/...' references"),
        ({"$ref": "#/$defs/Missing", "$defs": {}}, "points nowhere"),
        (
            {"$ref": "#/$defs/Node", "$defs": {"Node": {"required": ["next"], "properties": {"next": {"$ref": "#"}}}}},
            "without end",
        ),
    ],
)
def test_schemas_that_give_no_instance(schema: Any, message: str) -> None:
    with pytest.raises(SchemaActionError, match=message):
        minimal_instance(schema)


def test_an_action_must_be_an_object() -> None:
    with pytest.raises(SchemaActionError, match="not an object"):
        minimal_action({"type": "string"})
    assert minimal_action({"anyOf": [{"type": "null"}, {"type": "object"}]}) == {}


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("ws://127.0.0.1:8000", "http://127.0.0.1:8000/schema"),
        ("wss://host/env/", "https://host/env/schema"),
        ("http://host:1/x?token=a#frag", "http://host:1/x/schema?token=a"),
        ("https://host", "https://host/schema"),
        ("ws://127.0.0.1:8000/ws", "http://127.0.0.1:8000/schema"),  # the endpoint's URL, as OpenEnv users write it
        ("https://host/env/ws/", "https://host/env/schema"),
        ("http+poll://host:8000/prefix", "http://host:8000/prefix/schema"),
        ("http+poll://host:8000/ws", "http://host:8000/ws/schema"),  # long-polling appends nothing
        ("HTTPS+POLL://host", "https://host/schema"),
        ("inproc://tests.envs:DictEnv", None),
        ("grpc://host:1", None),
        ("no-scheme", None),
    ],
)
def test_schema_url(url: str, expected: str | None) -> None:
    assert schema_url(url) == expected


@pytest.mark.anyio
@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_fetch_action_schema_over_each_transport(kind: str) -> None:
    with anyio.fail_after(30):
        async with serving(kind, MessageEchoEnv) as url:
            schema = await fetch_action_schema(url, timeout=10)
    assert schema == environment_schemas(MessageEchoEnv)["action"]


@pytest.mark.anyio
async def test_fetch_action_schema_of_an_unknown_scheme() -> None:
    with pytest.raises(SchemaUnavailable, match="grpc://"):
        await fetch_action_schema("grpc://host:1", timeout=1)


# -- measurements -----------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _check_consistent(result: BenchResult) -> None:
    latency = result.latency_ms
    assert latency.p50 is not None
    assert latency.p90 is not None
    assert latency.p99 is not None
    assert latency.mean is not None
    assert latency.max is not None
    assert 0 < latency.p50 <= latency.p90 <= latency.p99 <= latency.max
    assert result.seconds > 0
    assert result.steps_per_second == pytest.approx(result.steps / result.seconds)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_steps_over_each_transport_with_three_sessions(kind: str) -> None:
    progress: list[tuple[int, float]] = []
    with anyio.fail_after(60):
        async with serving(kind, MessageEchoEnv) as url:
            result = await run_benchmark(
                url, action={"message": "hi"}, sessions=3, steps=60, warmup=2, on_progress=lambda *a: progress.append(a)
            )
    assert (result.url, result.transport, result.sessions) == (url, kind, 3)
    assert (result.steps, result.errors, result.resets, result.error_examples) == (60, 0, 0, [])
    _check_consistent(result)
    assert progress[-1][0] == 60  # the last report, at the end, has every step


@pytest.mark.anyio
@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_seconds_over_each_transport_with_the_action_from_the_schema(kind: str) -> None:
    with anyio.fail_after(60):
        async with serving(kind, MessageEchoEnv) as url:
            result = await run_benchmark(url, sessions=3, seconds=0.3, warmup=0)
    assert result.steps > 0
    assert result.errors == 0
    assert result.seconds >= 0.3  # the clock runs out before the sessions stop
    _check_consistent(result)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["inproc", "ws"])
async def test_the_generated_action_passes_the_servers_validation(kind: str) -> None:
    with anyio.fail_after(60):
        async with serving(kind, BenchRichEnv) as url:
            result = await run_benchmark(url, steps=5)
    assert (result.steps, result.errors) == (5, 0)


@pytest.mark.anyio
async def test_done_steps_are_followed_by_a_counted_reset() -> None:
    # The counter says done at 10: with steps of 5, every second step.
    url = f"inproc://{factory_path(AsyncCounterEnv)}"
    result = await run_benchmark(url, action={"by": 5}, steps=20, warmup=0)
    assert (result.steps, result.resets, result.errors) == (20, 10, 0)


@pytest.mark.anyio
async def test_failing_steps_are_counted_and_the_session_goes_on() -> None:
    with anyio.fail_after(60):
        async with serving("ws", EveryThirdStepFailsEnv) as url:
            result = await run_benchmark(url, action={}, steps=30, warmup=0)
    assert (result.steps, result.errors) == (20, 10)
    assert len(result.error_examples) == 5  # distinct messages, a few of them
    assert result.error_examples[0].startswith("ExecutionError: ")
    assert "step 3 fails" in result.error_examples[0]


@pytest.mark.anyio
async def test_when_every_step_fails() -> None:
    url = f"inproc://{factory_path(MessageEchoEnv)}"
    result = await run_benchmark(url, action={"message": "raise"}, sessions=2, steps=10)
    assert (result.steps, result.errors, result.steps_per_second) == (0, 10, 0.0)
    assert result.latency_ms == LatencySummary()
    assert len(result.error_examples) == 1


@pytest.mark.anyio
async def test_an_unreachable_server_fails_up_front() -> None:
    url = f"ws://127.0.0.1:{_closed_port()}"
    with anyio.fail_after(30), pytest.raises(BenchmarkError, match=f"^{url}: .*cannot connect"):
        await run_benchmark(url, action={"message": "hi"}, sessions=2)


@pytest.mark.anyio
async def test_an_unreachable_server_fails_up_front_when_asked_for_its_schema() -> None:
    url = f"http+poll://127.0.0.1:{_closed_port()}"
    with anyio.fail_after(30), pytest.raises(BenchmarkError, match="cannot reach"):
        await run_benchmark(url)


@pytest.mark.anyio
async def test_an_unknown_scheme_fails_up_front() -> None:
    with pytest.raises(BenchmarkError, match="no transport for the URL scheme 'grpc'"):
        await run_benchmark("grpc://127.0.0.1:1", action={})
    with pytest.raises(BenchmarkError, match="give one explicitly"):
        await run_benchmark("grpc://127.0.0.1:1")


@pytest.mark.anyio
async def test_a_url_without_a_scheme_fails_up_front_saying_which_to_write() -> None:
    for action in (None, {}):
        with pytest.raises(BenchmarkError, match=r"write ws://127\.0\.0\.1:1 \(WebSocket\) or http\+poll://"):
            await run_benchmark("127.0.0.1:1", action=action)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["ws", "http+poll"])
async def test_a_server_that_wants_a_token(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENENV_AUTH_TOKEN", raising=False)
    with anyio.fail_after(60):
        async with serving(kind, MessageEchoEnv, auth_token="s3cret") as url:
            # Without one, the schema's fetch says so, and how to give one (not that the schema is missing).
            with pytest.raises(BenchmarkError, match=r"wants a token and none was sent.*--auth-token"):
                await run_benchmark(url, steps=2)
            with pytest.raises(BenchmarkError, match="wants a token and none was sent"):
                await run_benchmark(url, action={"message": "hi"}, steps=2)
            with pytest.raises(BenchmarkError, match="refused the token"):
                await run_benchmark(url, steps=2, auth_token="wrong")
            result = await run_benchmark(url, steps=4, sessions=2, auth_token="s3cret")
            assert (result.steps, result.errors) == (4, 0)
            monkeypatch.setenv("OPENENV_AUTH_TOKEN", "s3cret")  # as the clients take it
            assert (await run_benchmark(url, steps=2)).steps == 2


@pytest.mark.anyio
async def test_a_token_given_for_an_inprocess_environment_is_ignored() -> None:
    url = f"inproc://{factory_path(MessageEchoEnv)}"
    assert (await run_benchmark(url, steps=2, auth_token="unused")).steps == 2


@pytest.mark.anyio
async def test_a_websocket_url_that_names_the_endpoint_is_measured() -> None:
    with anyio.fail_after(60):
        async with serving("ws", MessageEchoEnv) as url:
            result = await run_benchmark(f"{url}/ws", steps=3)
    assert (result.steps, result.errors) == (3, 0)


@pytest.mark.anyio
async def test_more_sessions_than_the_server_takes_fail_up_front() -> None:
    with anyio.fail_after(60):
        async with serving("ws", MessageEchoEnv, max_sessions=2) as url:
            with pytest.raises(BenchmarkError, match="try fewer sessions"):
                await run_benchmark(url, action={"message": "hi"}, sessions=3)
            # The sessions that did connect were closed: the server takes two again.
            result = await run_benchmark(url, action={"message": "hi"}, sessions=2, steps=4)
    assert result.steps == 4


@pytest.mark.anyio
@pytest.mark.parametrize(
    "options",
    [{"steps": 10, "seconds": 1.0}, {"sessions": 0}, {"steps": 0}, {"seconds": 0.0}, {"warmup": -1}],
)
async def test_bad_arguments(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message is the argument's own
        await run_benchmark(f"inproc://{factory_path(DictEnv)}", action={}, **options)


# -- the report and the command ------------------------------------------------------------


def _result(url: str = "ws://127.0.0.1:8000", **changes: Any) -> BenchResult:
    fields: dict[str, Any] = {
        "url": url,
        "transport": url.partition("://")[0],
        "sessions": 2,
        "steps": 100,
        "errors": 1,
        "resets": 0,
        "seconds": 0.5,
        "steps_per_second": 200.0,
        "latency_ms": summarize_latencies([0.001, 0.002]),
        "error_examples": ["ExecutionError: [boom]"],
    }
    return BenchResult(**{**fields, **changes})


def test_json_document_has_exactly_the_agreed_keys() -> None:
    document = json_document([_result()], backend="trio")
    assert set(document) == {"openenv_version", "backend", "results"}
    assert (document["openenv_version"], document["backend"]) == (openenv.__version__, "trio")
    (row,) = document["results"]
    assert tuple(row) == JSON_RESULT_KEYS
    assert set(row["latency_ms"]) == {"mean", "p50", "p90", "p99", "max"}
    json.dumps(document)  # plain JSON


@pytest.mark.parametrize("width", [200, 60])
def test_table_has_one_row_per_url_or_one_column_on_narrow_screens(width: int) -> None:
    from rich.console import Console

    console = Console(width=width, record=True)
    print_table([_result(), _result("http+poll://127.0.0.1:8000", steps=0, latency_ms=LatencySummary())], console)
    text = console.export_text()
    assert "ws://127.0.0.1:8000" in text
    assert "http+poll://127.0.0.1:8000" in text
    assert "steps/s" in text
    assert "p99" in text
    assert "ExecutionError: [boom]" in text  # not taken for markup


@contextmanager
def _served(factory: Any, **options: Any) -> Iterator[str]:
    """Serve ``factory`` from a background event loop, for the command (which runs its own)."""
    with (
        start_blocking_portal("asyncio") as portal,
        portal.wrap_async_context_manager(openenv.serve(factory, port=0, **options)) as server,
    ):
        yield server.url


def test_command_json_for_two_urls() -> None:
    inproc = f"inproc://{factory_path(MessageEchoEnv)}"
    with _served(MessageEchoEnv) as base_url:
        ws = base_url.replace("http://", "ws://")
        result = CliRunner().invoke(
            main, ["bench", inproc, ws, "--steps", "30", "--sessions", "2", "--json"], catch_exceptions=False
        )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["backend"] == "asyncio"
    assert [row["url"] for row in document["results"]] == [inproc, ws]
    for row in document["results"]:
        assert tuple(row) == JSON_RESULT_KEYS
        assert (row["steps"], row["errors"], row["sessions"]) == (30, 0, 2)
    assert document["results"][1]["transport"] == "ws"


def test_command_table_on_trio_with_an_action_file(tmp_path: Path) -> None:
    action_file = tmp_path / "action.json"
    action_file.write_text('{"message": "from a file"}')
    url = f"inproc://{factory_path(MessageEchoEnv)}"
    result = CliRunner().invoke(
        main,
        ["bench", url, "--seconds", "0.2", "--action", f"@{action_file}", "--backend", "trio", "--no-progress"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert url in result.stdout
    assert "steps/s" in result.stdout
    assert result.stderr == ""  # no progress bar when stderr is not a terminal


def test_command_unreachable_server_is_one_line_and_fails() -> None:
    url = f"ws://127.0.0.1:{_closed_port()}"
    result = CliRunner().invoke(main, ["bench", url, "--action", "{}", "--timeout", "5"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"Error: {url}: ")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


def test_command_takes_the_token_as_an_option_or_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENENV_AUTH_TOKEN", raising=False)
    with _served(MessageEchoEnv, auth_token="s3cret") as base_url:
        url = base_url.replace("http://", "ws://")
        refused = CliRunner().invoke(main, ["bench", url, "--steps", "3"])
        given = CliRunner().invoke(main, ["bench", url, "--steps", "3", "--json", "--auth-token", "s3cret"])
        monkeypatch.setenv("OPENENV_AUTH_TOKEN", "s3cret")
        from_env = CliRunner().invoke(main, ["bench", url, "--steps", "3", "--json"])
    assert refused.exit_code == 1
    assert "none was sent" in refused.stderr
    assert refused.stderr.count("\n") == 1
    for result in (given, from_env):
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["results"][0]["steps"] == 3


def test_command_fails_when_not_one_step_succeeds() -> None:
    url = f"inproc://{factory_path(EveryStepFailsEnv)}"
    result = CliRunner().invoke(main, ["bench", url, "--steps", "5", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["results"][0]["errors"] == 5
    assert "pass one with --action" in result.stderr
    assert "Traceback" not in result.stderr  # the in-process environment's errors are counted, not logged


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--action", "{not json"], "not valid JSON"),
        (["--action", "[1, 2]"], "must be a JSON object"),
        (["--action", "@/no/such/file.json"], "cannot read"),
        (["--steps", "10", "--seconds", "1"], "not both"),
        (["--sessions", "0"], "x>=1"),
    ],
)
def test_command_usage_errors(arguments: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["bench", f"inproc://{factory_path(DictEnv)}", *arguments])
    assert result.exit_code == 2
    assert message in result.stderr


@pytest.mark.anyio
async def test_an_action_legal_once_per_episode_is_measured_with_a_reset_after_each_error() -> None:
    result = await run_benchmark(f"inproc://{factory_path(OncePerEpisodeEnv)}", action={}, steps=20, warmup=3)
    # Legal, refused, (reset), legal, refused, (reset), ...: half the steps succeed.
    assert (result.steps, result.errors, result.resets) == (10, 10, 10)
    assert result.error_examples == ["ExecutionError: [EXECUTION_ERROR] ValueError: that square is taken"]


def test_command_keeps_the_results_of_urls_measured_before_one_that_fails() -> None:
    good = f"inproc://{factory_path(MessageEchoEnv)}"
    bad = f"ws://127.0.0.1:{_closed_port()}"
    for as_json in (False, True):
        arguments = ["bench", good, bad, good, "--steps", "10", "--timeout", "5", *(["--json"] if as_json else [])]
        result = CliRunner().invoke(main, arguments)
        assert result.exit_code == 1
        assert result.stderr.startswith(f"Error: {bad}: ")
        assert result.stderr.count("\n") == 1
        if as_json:
            assert [row["url"] for row in json.loads(result.stdout)["results"]] == [good, good]
        else:
            assert "inproc://tests.envs:M" in result.stdout  # the table (narrow here: one column per URL)
            assert "steps/s" in result.stdout


def test_command_imports_an_inproc_environment_from_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "my_bench_env.py").write_text("from tests.envs import MessageEchoEnv as Env\n")
    code = "import sys; from transports.cli._commands import main; main(prog_name='openenv')"
    command = [sys.executable, "-c", code, "bench", "inproc://my_bench_env:Env", "--steps", "10", "--json"]
    repository = str(Path(__file__).resolve().parents[2])
    environment = {**os.environ, "PYTHONPATH": repository}
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=environment)
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["results"]
    assert (row["steps"], row["errors"], row["resets"]) == (10, 0, 0)
