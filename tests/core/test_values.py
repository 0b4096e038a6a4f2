"""Values as OpenEnv treats them: lax numbers by default, rewards as sent, unions of observation types."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest

import openenv
from openenv import Dialect, Observation, ReplyValidationError
from openenv._codec import ClientCodec, RequestError, ServerCodec
from openenv.server import ServerSession
from tests.envs import CountAction, CountObservation, CountState, SyncCounterEnv
from tests.interop.reference_venv import OPENENV_0_10, ensure_reference_python, reference_env

PLAIN = Dialect()
MSGPACK = Dialect(encoding="msgpack", request_ids=True)


# -- lax validation on the server, with a strict option -----------------------------


@pytest.mark.parametrize("by", ["3", 3.0, 3])
def test_numbers_are_coerced_by_default_as_pydantic_does(by: Any) -> None:
    frame = json.dumps({"type": "step", "data": {"by": by, "delay": "0.5", "fail": "false"}}).encode()
    _, action, _ = ServerCodec(PLAIN, action_type=CountAction).decode_request(frame)
    assert action == CountAction(by=3, delay=0.5, fail=False)


@pytest.mark.parametrize("by", ["3", 3.0, 3.5, "three"])
def test_strict_refuses_what_is_not_an_int(by: Any) -> None:
    frame = json.dumps({"type": "step", "data": {"by": by}}).encode()
    with pytest.raises(RequestError) as info:
        ServerCodec(PLAIN, action_type=CountAction, strict=True).decode_request(frame)
    assert info.value.code == "VALIDATION_ERROR"
    [entry] = info.value.extra["errors"]
    assert (entry["loc"], entry["input"]) == (["by"], {"by": by})


def test_lax_mode_still_refuses_what_is_no_number() -> None:
    for by in ("three", 3.5):
        frame = json.dumps({"type": "step", "data": {"by": by}}).encode()
        with pytest.raises(RequestError):
            ServerCodec(PLAIN, action_type=CountAction).decode_request(frame)


# The values pydantic's lax mode takes and msgspec's did not (issue 22), with what they become.
PYDANTIC_ONLY = [
    (int, True, 1),
    (int, False, 0),
    (int, " 3 ", 3),
    (int, "1_000", 1000),
    (float, True, 1.0),
    (bool, "yes", True),
    (bool, "on", True),
    (bool, "no", False),
    (bool, 1.0, True),
]


@pytest.mark.parametrize("dialect", [PLAIN, MSGPACK], ids=["json", "msgpack"])
@pytest.mark.parametrize(("type_", "value", "expected"), PYDANTIC_ONLY)
def test_values_pydantic_takes_are_taken_unless_strict(type_: Any, value: Any, expected: Any, dialect: Dialect) -> None:
    action_type = msgspec.defstruct("Values", [("v", type_)], forbid_unknown_fields=True)
    encode = msgspec.msgpack.encode if dialect.encoding == "msgpack" else msgspec.json.encode
    frame = encode({"type": "step", "data": {"v": value}})
    _, action, _ = ServerCodec(dialect, action_type=action_type).decode_request(frame)
    assert action.v == expected
    assert type(action.v) is type_
    with pytest.raises(RequestError):
        ServerCodec(dialect, action_type=action_type, strict=True).decode_request(frame)


def test_an_int_from_a_float_string_is_refused_as_pydantic_refuses_it() -> None:
    """msgspec's own lax mode took ``"1e3"`` for an int; pydantic does not."""
    action_type = msgspec.defstruct("Values", [("v", int)])
    with pytest.raises(RequestError):
        ServerCodec(PLAIN, action_type=action_type).decode_request(b'{"type": "step", "data": {"v": "1e3"}}')


class Inner(msgspec.Struct):
    flag: bool


class Outer(openenv.Action):
    counts: list[int]
    ratios: dict[str, float]
    inner: Inner
    maybe: int | None = None
    either: int | str = 0


class Jump(openenv.Action, kw_only=True):
    height: int


class Say(openenv.Action, kw_only=True):
    height: str


def test_lax_values_reach_into_containers_unions_and_nested_structs() -> None:
    frame = json.dumps(
        {
            "type": "step",
            "data": {"counts": [" 1 ", True], "ratios": {"a": "1e-1"}, "inner": {"flag": "on"}, "maybe": "2.0"},
        }
    ).encode()
    _, action, _ = ServerCodec(PLAIN, action_type=Outer).decode_request(frame)
    assert action == Outer(counts=[1, 1], ratios={"a": 0.1}, inner=Inner(flag=True), maybe=2)
    # A union keeps a value that is already one of its kinds (pydantic's "smart" unions).
    frame = b'{"type": "step", "data": {"counts": [], "ratios": {}, "inner": {"flag": 1}, "either": "7"}}'
    _, action, _ = ServerCodec(PLAIN, action_type=Outer).decode_request(frame)
    assert (action.inner.flag, action.either) == (True, "7")


def test_a_union_of_actions_tries_every_member_strictly_first() -> None:
    codec = ServerCodec(PLAIN, action_type=Jump | Say)
    assert codec.decode_request(b'{"type": "step", "data": {"height": "3"}}')[1] == Say(height="3")
    # Only when no member takes it as it is does a lax conversion apply, in order.
    codec = ServerCodec(PLAIN, action_type=Say | Jump)
    assert codec.decode_request(b'{"type": "step", "data": {"height": true}}')[1] == Jump(height=1)


# -- the whole table, against pydantic itself -------------------------------------------

TABLE_VALUES: list[Any] = [
    3, 3.0, 3.5, -0.0, 0, 1, 2, 0.0, 1.0, -1, 0.5, 2.0, 1e20, 1e308, 9007199254740993, 9.223372036854775e18, 9.3e18,
    True, False, None, [3], {"a": 1},
    "3", " 3 ", "1_000", "3.0", "3.00", "3.", "3.5", "+3", "-3", " +3 ", "-3.0", "0x10", "0b1", "1e3", "3e0", "0003",
    "00", "3 ", "\t3\n", "\u00a03", "", " ", "three", "\u0661\u0662", "_1", "1__0", "1_", "+-3", "1_000.0",
    "99999999999999999999", "9007199254740993",
    "inf", "nan", "-inf", "+nan", "Infinity", "INF", "1_000.5", " 3.5 ", "1.", ".5", "+.5", "-.5e-1", "1E3", "1e",
    "e3", "1,5",
    "true", "True", "TRUE", "false", "yes", "YES", "no", "on", "ON", "off", "y", "n", "t", "f", "T", "F", "1", "0",
    "2", "01", " 1", " true ", "null", "None",
]  # fmt: skip
TABLE_TYPES: dict[str, Any] = {"int": int, "float": float, "bool": bool, "str": str, "optional_int": int | None}
TABLE = [(name, value) for name in TABLE_TYPES for value in TABLE_VALUES]


def our_verdict(type_name: str, value: Any) -> dict[str, Any]:
    action_type = msgspec.defstruct("Values", [("v", TABLE_TYPES[type_name])], forbid_unknown_fields=True)
    try:
        _, action, _ = ServerCodec(PLAIN, action_type=action_type).decode_request(
            json.dumps({"type": "step", "data": {"v": value}}).encode()
        )
    except RequestError:
        return {"ok": False}
    return {"ok": True, "repr": repr(action.v)}


@pytest.mark.interop
def test_values_are_taken_exactly_as_pydantic_takes_them() -> None:
    """Every (type, value) of the table, both ways: nothing pydantic takes is refused, nothing it refuses is taken."""
    python = ensure_reference_python(reference=OPENENV_0_10)
    script = Path(__file__).resolve().parents[1] / "interop" / "reference_values.py"
    done = subprocess.run(
        [str(python), str(script)],
        input=json.dumps(TABLE),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=script.parent,
        env=reference_env(),
    )
    assert done.returncode == 0, done.stderr
    theirs = json.loads(done.stdout)
    assert len(theirs) == len(TABLE) > 400
    differences = [
        (type_name, value, ours, verdict)
        for (type_name, value), verdict in zip(TABLE, theirs, strict=True)
        if (ours := our_verdict(type_name, value)) != verdict
    ]
    assert differences == []
    taken = sum(verdict["ok"] for verdict in theirs)
    assert 150 < taken < len(TABLE)  # the table holds both kinds


class StrictCounterEnv(SyncCounterEnv):
    strict_validation = True


@pytest.mark.anyio
async def test_an_environment_chooses_strict_validation() -> None:
    frame = b'{"type": "step", "data": {"by": "2"}}'
    lax, strict = ServerSession(SyncCounterEnv()), ServerSession(StrictCounterEnv())
    lax_reply = json.loads(await lax.handle(frame) or b"")
    strict_reply = json.loads(await strict.handle(frame) or b"")
    assert lax_reply["data"]["observation"]["count"] == 2
    assert strict_reply["data"]["code"] == "VALIDATION_ERROR"
    # A session's own option wins over the class's.
    relaxed = ServerSession(StrictCounterEnv(), strict=False)
    assert json.loads(await relaxed.handle(frame) or b"")["type"] == "observation"
    for session in (lax, strict, relaxed):
        await session.aclose()


@pytest.mark.parametrize(
    "frame",
    [
        b'{"type": "step"}',
        b'{"type": "step", "data": {"by": "x"}}',
        b'{"type": "step", "data": "hi"}',
        b'{"type": "mcp"}',
        b'{"type": "mcp", "data": [1]}',
        b'{"type": "reset", "data": [1]}',
        b'{"data": {}}',
        b'{"type": 3}',
    ],
)
def test_every_validation_failure_carries_an_errors_list(frame: bytes) -> None:
    with pytest.raises(RequestError) as info:
        ServerCodec(PLAIN, action_type=CountAction).decode_request(frame)
    assert info.value.code == "VALIDATION_ERROR"
    errors = info.value.extra["errors"]
    assert errors
    assert all({"type", "loc", "msg"} <= set(entry) for entry in errors)


def test_a_step_without_data_is_reported_as_the_reference_does() -> None:
    with pytest.raises(RequestError) as info:
        ServerCodec(PLAIN, action_type=CountAction).decode_request(b'{"type": "step"}')
    assert info.value.extra["errors"] == [
        {"type": "missing", "loc": ["data"], "msg": "Field required", "input": {"type": "step"}}
    ]


# -- rewards keep their wire type ---------------------------------------------------


@pytest.mark.parametrize(("wire", "expected"), [("1", 1), ("1.5", 1.5), ("true", True), ("null", None)])
@pytest.mark.parametrize("observation_type", [dict, CountObservation])
def test_rewards_keep_their_wire_type(wire: str, expected: Any, observation_type: Any) -> None:
    codec: ClientCodec[Any, Any, Any] = ClientCodec(PLAIN, observation_type=observation_type, state_type=dict)
    frame = f'{{"type":"observation","data":{{"observation":{{"count":1}},"reward":{wire},"done":false}}}}'.encode()
    reply = codec.decode_reply(frame)
    assert isinstance(reply, openenv._messages.ObservationReply)
    assert reply.data.reward == expected
    assert type(reply.data.reward) is type(expected)


def test_a_string_reward_is_still_a_protocol_error() -> None:
    codec: ClientCodec[Any, Any, Any] = ClientCodec(PLAIN, observation_type=dict, state_type=dict)
    with pytest.raises(openenv.ProtocolError):
        codec.decode_reply(b'{"type":"observation","data":{"observation":{},"reward":"1","done":false}}')


@pytest.mark.anyio
async def test_an_int_and_a_bool_reward_reach_the_client_as_sent() -> None:
    class IntRewardEnv(openenv.Environment[CountAction, CountObservation, CountState]):
        async def reset(self) -> CountObservation:
            return CountObservation(reward=True)

        async def step(self, action: CountAction) -> CountObservation:
            return CountObservation(count=action.by, reward=action.by)

        @property
        def state(self) -> CountState:
            return CountState()

    async with openenv.EnvClient(f"inproc://{__name__}:IntRewardEnv", factory=IntRewardEnv) as untyped:
        assert (await untyped.reset()).reward is True
        result = await untyped.step({"by": 2})
        assert result.reward == 2
        assert type(result.reward) is int
    async with openenv.EnvClient[CountAction, CountObservation, CountState]("inproc://", factory=IntRewardEnv) as typed:
        result = await typed.step(CountAction(by=4))
        assert type(result.reward) is int
        assert type(result.observation.reward) is int


# -- a union of observation types ---------------------------------------------------


class Moved(Observation, kw_only=True):
    position: int


class Looked(Observation, kw_only=True):
    seen: list[str]
    position: int = 0


class Idle(Observation, kw_only=True):
    note: str = ""


class FrozenLooked(Observation, kw_only=True, frozen=True):
    seen: list[str]


def union_codec(observation_type: Any, dialect: Dialect = PLAIN) -> ClientCodec[Any, Any, Any]:
    return ClientCodec(dialect, observation_type=observation_type, state_type=dict)


def observation_frame(observation: dict[str, Any], dialect: Dialect = PLAIN) -> bytes:
    reply = {"type": "observation", "data": {"observation": observation, "reward": 1, "done": True}}
    return msgspec.msgpack.encode(reply) if dialect.encoding == "msgpack" else msgspec.json.encode(reply)


@pytest.mark.parametrize("dialect", [PLAIN, MSGPACK])
def test_each_observation_decodes_into_the_member_it_fits(dialect: Dialect) -> None:
    codec = union_codec(Idle | Moved | Looked, dialect)

    def decode(observation: dict[str, Any]) -> Any:
        reply = codec.decode_reply(observation_frame(observation, dialect))
        assert isinstance(reply, openenv._messages.ObservationReply)
        return reply.data.observation

    # Idle fits an empty observation, with no field left over.
    assert decode({}) == Idle(reward=1, done=True)
    assert decode({"position": 3}) == Moved(position=3, reward=1, done=True)
    # Moved would take it but leave "seen" over: Looked fits it whole.
    assert decode({"position": 3, "seen": ["tree"]}) == Looked(seen=["tree"], position=3, reward=1, done=True)
    # Nobody's fields cover "extra": the first member that validates takes it.
    assert decode({"position": 1, "extra": True}) == Moved(position=1, reward=1, done=True)


def test_a_frozen_member_gets_reward_and_done_too() -> None:
    reply = union_codec(Moved | FrozenLooked).decode_reply(observation_frame({"seen": []}))
    assert isinstance(reply, openenv._messages.ObservationReply)
    assert reply.data.observation == FrozenLooked(seen=[], reward=1, done=True)


def test_an_observation_no_member_fits_is_a_reply_validation_error() -> None:
    with pytest.raises(ReplyValidationError, match="position"):
        union_codec(Moved | Looked).decode_reply(observation_frame({"position": "far"}))


@pytest.mark.anyio
async def test_a_typed_client_with_a_union_over_a_real_session() -> None:
    from openenv.examples.echo import CallToolAction, EchoEnvironment, EchoObservation, ListToolsObservation

    async with openenv.EnvClient[CallToolAction, EchoObservation | ListToolsObservation, dict](
        "inproc://openenv.examples.echo:EchoEnvironment"
    ) as env:
        reset = await env.reset()
        assert isinstance(reset.observation, EchoObservation)
        listed = await env.step({"type": "list_tools"})  # type: ignore[arg-type]
        assert isinstance(listed.observation, ListToolsObservation)
        called = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "u"}))
        assert isinstance(called.observation, EchoObservation)
        assert (called.observation.reward, called.reward) == (pytest.approx(0.1), pytest.approx(0.1))
    assert EchoEnvironment.action_type == CallToolAction | openenv.ListToolsAction


class Push(openenv.Action, kw_only=True):
    force: int


class Pull(openenv.Action, kw_only=True):
    grip: float = 1.0


def test_the_server_decodes_a_union_of_actions_into_the_one_that_fits() -> None:
    codec: ServerCodec[Any] = ServerCodec(PLAIN, action_type=Push | Pull)
    assert codec.decode_request(b'{"type":"step","data":{"force":"2"}}')[1] == Push(force=2)
    assert codec.decode_request(b'{"type":"step","data":{}}')[1] == Pull()
    assert codec.decode_request(b'{"type":"step","data":{"grip":0.5}}')[1] == Pull(grip=0.5)
    with pytest.raises(RequestError) as info:
        codec.decode_request(b'{"type":"step","data":{"force":1,"grip":2}}')
    assert info.value.extra["errors"][0]["type"] == "extra_forbidden"
