"""The codec and messages on bytes alone: no transport, no event loop."""

from __future__ import annotations

import contextlib
import json
from typing import Annotated, Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from openenv import Dialect, ProtocolError, ReplyValidationError, State
from openenv import _codec as codecs
from openenv._codec import ClientCodec, RequestError, ServerCodec, validation_errors
from openenv._mcp_types import ListToolsAction, ListToolsObservation
from openenv._messages import ErrorReply, ObservationData, ObservationReply, StateReply
from openenv.examples.echo import CallToolAction, EchoObservation, EchoState
from tests.envs import CountAction, CountObservation, CountState

PLAIN = Dialect()
WITH_IDS = Dialect(request_ids=True)
MSGPACK = Dialect(encoding="msgpack", request_ids=True)


def client_codec(dialect: Dialect = PLAIN) -> ClientCodec[Any, Any, Any]:
    return ClientCodec(dialect, observation_type=EchoObservation, state_type=EchoState)


def test_requests_are_openenv_frames() -> None:
    codec = client_codec()
    assert json.loads(codec.reset({"seed": 42, "episode_id": "ep-1"}, 1)) == {
        "type": "reset",
        "data": {"seed": 42, "episode_id": "ep-1"},
    }
    action = CallToolAction(tool_name="echo_message", arguments={"message": "hi"})
    assert json.loads(codec.step(action, 2)) == {
        "type": "step",
        "data": {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hi"}, "metadata": {}},
    }
    assert json.loads(codec.state(3)) == {"type": "state"}
    assert json.loads(codec.close()) == {"type": "close"}


def test_request_ids_only_when_negotiated() -> None:
    assert json.loads(client_codec(WITH_IDS).state(7)) == {"type": "state", "id": 7}
    assert "id" not in json.loads(client_codec(PLAIN).state(7))


def test_reference_replies_decode_into_types() -> None:
    codec = ClientCodec(PLAIN, observation_type=CountObservation, state_type=CountState)
    reply = codec.decode_reply(
        b'{"type":"observation","data":{"observation":{"count":3,"note":"x"},"reward":5.0,"done":false}}'
    )
    assert isinstance(reply, ObservationReply)
    assert reply.data.observation == CountObservation(count=3, note="x")
    assert (reply.data.reward, reply.data.done) == (5.0, False)
    state = codec.decode_reply(b'{"type":"state","data":{"episode_id":"ep-1","step_count":1,"count":3}}')
    assert isinstance(state, StateReply)
    assert state.data == CountState(episode_id="ep-1", step_count=1, count=3)
    error = codec.decode_reply(
        b'{"type":"error","data":{"message":"Unknown message type: bogus","code":"UNKNOWN_TYPE"}}'
    )
    assert isinstance(error, ErrorReply)
    assert error.data["code"] == "UNKNOWN_TYPE"


def test_untyped_client_gets_dicts() -> None:
    codec = ClientCodec(PLAIN, observation_type=dict, state_type=dict)
    reply = codec.decode_reply(b'{"type":"observation","data":{"observation":{"a":[1,2]},"reward":null,"done":true}}')
    assert isinstance(reply, ObservationReply)
    assert reply.data.observation == {"a": [1, 2]}
    assert reply.data.done is True


def test_reply_of_wrong_shape_is_a_typed_error() -> None:
    codec = ClientCodec(PLAIN, observation_type=CountObservation, state_type=CountState)
    with pytest.raises(ReplyValidationError, match="count"):
        codec.decode_reply(b'{"type":"observation","data":{"observation":{"count":"x"},"done":false}}')
    with pytest.raises(ProtocolError):
        codec.decode_reply(b"not json")
    with pytest.raises(ProtocolError):
        codec.decode_reply(b'{"type":"surprise","data":{}}')


def server_codec(dialect: Dialect = PLAIN) -> ServerCodec[Any]:
    return ServerCodec(dialect, action_type=CountAction)


def test_server_reads_requests() -> None:
    codec = server_codec()
    assert codec.decode_request(b'{"type": "step", "data": {"by": 2}}') == ("step", CountAction(by=2), None)
    assert codec.decode_request(b'{"type": "reset", "data": {"seed": 1}}') == ("reset", {"seed": 1}, None)
    assert codec.decode_request(b'{"type": "reset"}') == ("reset", {}, None)
    assert codec.decode_request(b'{"type": "state"}') == ("state", None, None)
    assert codec.decode_request(b'{"type": "close"}') == ("close", None, None)


def test_server_ignores_ids_unless_negotiated() -> None:
    assert server_codec(PLAIN).decode_request(b'{"type":"state","id":4}')[2] is None
    assert server_codec(WITH_IDS).decode_request(b'{"type":"state","id":4}')[2] == 4


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (b"not json", "INVALID_JSON"),
        (b'{"type": "bogus"}', "UNKNOWN_TYPE"),
        (b'{"type": "step", "data": {"by": "two"}}', "VALIDATION_ERROR"),
        (b'{"type": "step", "data": {"bye": 2}}', "VALIDATION_ERROR"),
        (b'{"type": "step"}', "VALIDATION_ERROR"),
        (b'{"type": "reset", "data": [1]}', "VALIDATION_ERROR"),
        (b'{"data": {}}', "VALIDATION_ERROR"),
        (b"[1, 2]", "VALIDATION_ERROR"),
    ],
)
def test_bad_requests_get_reference_codes(frame: bytes, code: str) -> None:
    with pytest.raises(RequestError) as info:
        server_codec().decode_request(frame)
    assert info.value.code == code


def test_validation_errors_are_pydantic_shaped() -> None:
    with pytest.raises(RequestError) as info:
        server_codec().decode_request(b'{"type": "step", "data": {"bye": 2}}')
    [entry] = info.value.extra["errors"]
    assert entry["type"] == "extra_forbidden"
    assert entry["loc"] == ["bye"]
    assert entry["input"] == {"bye": 2}

    class Needs(msgspec.Struct):
        message: str

    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.json.decode(b"{}", type=Needs)
    [entry] = validation_errors(info.value)
    assert entry["type"] == "missing"
    assert entry["loc"] == ["message"]


def test_server_writes_reference_replies() -> None:
    codec = server_codec()
    # As OpenEnv 0.10 writes them: metadata inside the observation, always, and beside it when not empty.
    frame = codec.observation(CountObservation(count=3, reward=5.0, metadata={"note": 1}), None)
    assert json.loads(frame) == {
        "type": "observation",
        "data": {
            "observation": {"count": 3, "note": "", "metadata": {"note": 1}},
            "reward": 5.0,
            "done": False,
            "metadata": {"note": 1},
        },
    }
    assert json.loads(codec.observation(CountObservation(count=3), None)) == {
        "type": "observation",
        "data": {"observation": {"count": 3, "note": "", "metadata": {}}, "reward": None, "done": False},
    }
    assert json.loads(codec.state(State(episode_id="ep-1", step_count=1), None)) == {
        "type": "state",
        "data": {"episode_id": "ep-1", "step_count": 1},
    }
    assert json.loads(codec.error("UNKNOWN_TYPE", "Unknown message type: bogus")) == {
        "type": "error",
        "data": {"message": "Unknown message type: bogus", "code": "UNKNOWN_TYPE"},
    }
    assert json.loads(codec.observation({"x": 1, "done": True}, 9)) == {
        "type": "observation",
        "id": 9,
        "data": {"observation": {"x": 1}, "reward": None, "done": True},
    }


@pytest.mark.parametrize("dialect", [PLAIN, MSGPACK], ids=["json", "msgpack"])
def test_metadata_reaches_the_client_both_ways(dialect: Dialect) -> None:
    server = server_codec(dialect)
    typed = ClientCodec(dialect, observation_type=CountObservation, state_type=CountState)
    untyped = ClientCodec(dialect, observation_type=dict, state_type=dict)
    frame = server.observation(CountObservation(count=1, metadata={"source": "env"}), None)
    reply = typed.decode_reply(frame)
    assert isinstance(reply, ObservationReply)
    assert reply.data.observation.metadata == reply.data.metadata == {"source": "env"}
    reply = untyped.decode_reply(frame)
    assert isinstance(reply, ObservationReply)
    assert reply.data.observation["metadata"] == reply.data.metadata == {"source": "env"}
    # An older server (openenv-core 0.3) sends none at all.
    old = typed.decode_reply(server.encode_value(ObservationReply(data=ObservationData({"count": 2}, None, False))))
    assert isinstance(old, ObservationReply)
    assert (old.data.observation.metadata, old.data.metadata) == ({}, msgspec.UNSET)


def test_msgpack_dialect_round_trip() -> None:
    client = ClientCodec(MSGPACK, observation_type=CountObservation, state_type=CountState)
    server = server_codec(MSGPACK)
    kind, action, request_id = server.decode_request(client.step(CountAction(by=4), 11))
    assert (kind, action, request_id) == ("step", CountAction(by=4), 11)
    reply = client.decode_reply(server.observation(CountObservation(count=4, done=True), request_id))
    assert isinstance(reply, ObservationReply)
    assert reply.id == 11
    assert reply.data.observation.count == 4
    assert reply.data.done is True


@given(by=st.integers(-(2**53), 2**53), delay=st.floats(0, 1e6, allow_nan=False), fail=st.booleans())
def test_any_action_survives_the_wire(by: int, delay: float, fail: bool) -> None:
    action = CountAction(by=by, delay=delay, fail=fail)
    for dialect in (PLAIN, WITH_IDS, MSGPACK):
        client = ClientCodec(dialect, observation_type=CountObservation, state_type=CountState)
        assert server_codec(dialect).decode_request(client.step(action, 1))[1] == action


@given(st.binary(max_size=64))
def test_garbage_never_escapes_as_a_foreign_exception(frame: bytes) -> None:
    try:
        server_codec().decode_request(frame)
    except RequestError as exc:
        assert exc.code in {"INVALID_JSON", "UNKNOWN_TYPE", "VALIDATION_ERROR"}  # noqa: PT017 - garbage may or may not raise
    client = ClientCodec(PLAIN, observation_type=CountObservation, state_type=CountState)
    with contextlib.suppress(ProtocolError, ReplyValidationError):
        client.decode_reply(frame)


def test_codecs_are_shared_by_sessions_of_one_kind() -> None:
    """A codec holds nothing of its session: the sessions of one kind share one (a fleet builds one)."""
    json_ids = Dialect(request_ids=True)
    assert codecs.client_codec(json_ids, dict, dict) is codecs.client_codec(json_ids, dict, dict)
    assert codecs.client_codec(json_ids, dict, dict) is not codecs.client_codec(Dialect(), dict, dict)
    assert codecs.client_codec(json_ids, dict, dict) is not codecs.client_codec(json_ids, CountObservation, dict)
    assert codecs.server_codec(json_ids, dict, False) is codecs.server_codec(json_ids, dict, False)
    assert codecs.server_codec(json_ids, dict, False) is not codecs.server_codec(json_ids, dict, True)
    unhashable = Annotated[dict[str, Any], {"a note": "a dict cannot be a key"}]
    alone = codecs.server_codec(json_ids, unhashable, False)
    assert alone is not codecs.server_codec(json_ids, unhashable, False)
    assert alone.decode_request(b'{"type":"step","data":{"a":1},"id":1}')[1] == {"a": 1}


def test_a_batch_refuses_what_a_request_refuses_for_its_nesting() -> None:
    """A batch's action nested as deep as a request may hold goes in the batch; one level more, the batch does not."""
    server = ServerCodec(Dialect(), action_type=dict[str, Any])
    short = b'{"by":1}'
    for depth in range(codecs.MAX_NESTING - 4, codecs.MAX_NESTING + 2):
        action = b'{"a":' + b"[" * depth + b"1" + b"]" * depth + b"}"
        frame = b'{"type":"step","data":' + action + b"}"
        code = None
        try:
            server.decode_request(frame)
        except RequestError as exc:
            code = exc.code
        assert code in (None, "INVALID_JSON")
        refused = code is not None
        batch = server.decode_step_batch(b"[" + b",".join([short, action, short]) + b"]")
        assert (batch is None) is refused, depth
        if batch is not None:
            assert batch[1] == msgspec.json.decode(action)
    assert refused  # the last depth is over the limit


def test_a_batch_of_a_union_of_actions_decodes_each_into_its_member() -> None:
    server = ServerCodec(Dialect(), action_type=CallToolAction | ListToolsAction)
    batch = server.decode_step_batch(b'[{"type":"list_tools"},{"type":"call_tool","tool_name":"t","arguments":{}}]')
    assert batch is not None
    assert [type(action) for action in batch] == [ListToolsAction, CallToolAction]
    assert server.decode_step_batch(b'[{"type":"list_tools"},{"tool_name":3}]') is None  # one fits no member
    client = ClientCodec(Dialect(), observation_type=EchoObservation | ListToolsObservation, state_type=EchoState)
    replies, invalid = client.decode_step_batch(
        b'{"observations":[{"tools":[]},null,{"echoed_message":"hi","reward":0.2}],"errors":{"1":{"code":"X","message":"m"}}}'
    )
    assert not invalid
    first, none, third = replies.observations
    assert isinstance(first, ListToolsObservation)
    assert none is None
    assert isinstance(third, EchoObservation)
    assert (third.echoed_message, third.reward) == ("hi", 0.2)
    assert replies.errors == {1: {"code": "X", "message": "m"}}
