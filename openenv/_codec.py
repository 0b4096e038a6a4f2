"""Encoding and decoding frames, for the client and for the server session.

Encoders and typed decoders are built once, per client or per session, and
reused for every frame: building a msgspec decoder is far costlier than using one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, Generic, Union

import msgspec

from ._exceptions import ProtocolError, ReplyValidationError
from ._lax import lax_convert
from ._messages import (
    CloseRequest,
    Dialect,
    ErrorReply,
    IncomingRequest,
    MCPMessage,
    ObservationData,
    ObservationReply,
    ResetRequest,
    StateReply,
    StateRequest,
    StepBatchReply,
    StepRequest,
)
from ._types import ActT, ObsT, StateT
from ._unions import StructUnionDecoder, struct_union_members

__all__ = [
    "MAX_ECHOED_INPUT",
    "MAX_NESTING",
    "ClientCodec",
    "RequestError",
    "ServerCodec",
    "client_codec",
    "error_data",
    "server_codec",
    "validation_errors",
]

MAX_NESTING = 128
"""The deepest nesting of arrays and objects a server accepts in a JSON request frame.

Deeper frames get ``INVALID_JSON``: an environment (or the reply that echoes
its input) would otherwise meet Python's recursion limit, far from the input.
MessagePack frames are bounded by the decoder's own recursion guard.
"""

MAX_ECHOED_INPUT = 4096
"""The largest request data (bytes, encoded) a ``VALIDATION_ERROR`` reply echoes back as ``input``."""

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")


def nested_deeper_than(frame: bytes, limit: int) -> bool:
    """Whether a valid JSON document nests arrays and objects deeper than ``limit`` (a slow, exact look)."""
    structure = _JSON_STRING.sub(b"", frame).translate(None, _NOT_BRACKETS)
    for _ in range(limit):  # each pass removes the innermost level
        shorter = structure.replace(b"[]", b"").replace(b"{}", b"")
        if not shorter:
            return False
        structure = shorter
    return True


def _out_of_range(exc: msgspec.ValidationError) -> bool:
    """Whether msgspec refused a number too large for any type (``1e999``): a malformed frame, not bad data."""
    return str(exc).startswith("Number out of range")


def lift_observation_fields(fields: dict[str, Any]) -> tuple[dict[str, Any], float | None, bool, Any]:
    """Take out of an observation's fields what travels beside it on the wire.

    The one place that decides it, as OpenEnv 0.10 does: ``reward`` and
    ``done`` travel beside the observation (``{"observation", "reward",
    "done"}``); ``metadata`` stays inside it and, when it is not empty, is also
    written beside it (``data.metadata``).

    Args:
        fields: The observation's fields; ``reward`` and ``done`` are removed from it.

    Returns:
        The remaining fields, the reward (``None`` if none), done, and the
        metadata to write beside the observation (``msgspec.UNSET`` for none).
    """
    reward = fields.pop("reward", None)
    done = bool(fields.pop("done", False))
    metadata = fields.get("metadata")
    return fields, reward, done, metadata if metadata else msgspec.UNSET


def _encoder(dialect: Dialect) -> msgspec.json.Encoder | msgspec.msgpack.Encoder:
    if dialect.encoding == "msgpack":
        return msgspec.msgpack.Encoder()
    return msgspec.json.Encoder()


def _decoder(dialect: Dialect, type_: Any, *, strict: bool = True) -> Any:
    if dialect.encoding == "msgpack":
        return msgspec.msgpack.Decoder(type_, strict=strict)
    return msgspec.json.Decoder(type_, strict=strict)


class _TypedStep(msgspec.Struct, Generic[ActT], tag_field="type", tag="step"):
    """A step request read with its action in one call (`ServerCodec.decode_step`)."""

    data: ActT
    id: int | None = None


class _RawStepBatchReply(msgspec.Struct):
    """A `StepBatchReply` with its observations left encoded, to decode each on its own."""

    observations: list[msgspec.Raw]
    errors: dict[int, dict[str, Any]] = msgspec.field(default_factory=dict)


_NULL = {"json": b"null", "msgpack": b"\xc0"}  # an encoded None: a place in a batch with no observation

Reply = Union[ObservationReply[Any], StateReply[Any], ErrorReply, MCPMessage]  # noqa: UP007 - a runtime type for msgspec


class ClientCodec(Generic[ActT, ObsT, StateT]):
    """Writes a client's requests and reads the server's replies into its types.

    Args:
        dialect: The dialect the transport negotiated.
        observation_type: The type observations are decoded into (``dict`` for
            none); a union of Structs (``A | B``) decodes each observation into
            the member it fits (see `openenv._unions.StructUnionDecoder`).
        state_type: The type states are decoded into (``dict`` for none).
    """

    def __init__(self, dialect: Dialect, *, observation_type: Any, state_type: Any) -> None:
        self.dialect = dialect
        self._request_ids = dialect.request_ids
        self._encode = _encoder(dialect).encode
        members = struct_union_members(observation_type)
        # A union of Structs is decoded in two steps: the reply with its observation
        # left raw, then the observation into the member it fits.
        self._observation_union = (
            StructUnionDecoder(members, encoding=dialect.encoding) if members is not None else None
        )
        wire_observation: Any = msgspec.Raw if members is not None else observation_type
        reply_type = Union[  # noqa: UP007
            ObservationReply[wire_observation], StateReply[state_type], ErrorReply, MCPMessage
        ]
        self._decode = _decoder(dialect, reply_type).decode
        # A reply that fails to validate is decoded again, loosely, to tell a
        # malformed frame (a protocol error) from one that does not fit our types.
        self._decode_loose = _decoder(dialect, Reply).decode
        # A batch's observations are decoded in one call into one type; a union's, each on its own.
        self._decode_batch = (
            _decoder(dialect, StepBatchReply[observation_type]).decode if self._observation_union is None else None
        )
        # A batch whose observations do not all fit is read again, each observation on its own.
        self._decode_batch_raw = _decoder(dialect, _RawStepBatchReply).decode
        self._decode_observation = (
            _decoder(dialect, observation_type).decode
            if self._observation_union is None
            else self._observation_union.decode
        )

    def _id(self, request_id: int) -> int | None:
        return request_id if self._request_ids else None

    def reset(self, kwargs: dict[str, Any], request_id: int) -> bytes:
        """Encode a reset request carrying ``kwargs``.

        Args:
            kwargs: The keyword arguments of ``reset``.
            request_id: The request's id, written only if the dialect has ids.

        Returns:
            The frame.

        Raises:
            TypeError: A value of a type msgspec cannot encode.
            msgspec.EncodeError: A value msgspec cannot encode (an integer out of range, ...).
        """
        return self._encode(ResetRequest(data=kwargs, id=self._id(request_id)))

    def step(self, action: Any, request_id: int) -> bytes:
        """Encode a step request carrying ``action``.

        Args:
            action: The action (a Struct or a dict).
            request_id: The request's id, written only if the dialect has ids.

        Returns:
            The frame.

        Raises:
            TypeError: A value of a type msgspec cannot encode.
            msgspec.EncodeError: A value msgspec cannot encode (an integer out of range, ...).
        """
        return self._encode(StepRequest(data=action, id=self._id(request_id)))

    def state(self, request_id: int) -> bytes:
        """Encode a state request.

        Args:
            request_id: The request's id, written only if the dialect has ids.

        Returns:
            The frame.
        """
        return self._encode(StateRequest(id=self._id(request_id)))

    def close(self) -> bytes:
        """Encode a close request (it gets no reply).

        Returns:
            The frame.
        """
        return self._encode(CloseRequest())

    def mcp(self, message: dict[str, Any], request_id: int) -> bytes:
        """Encode an ``mcp`` request carrying a JSON-RPC 2.0 request.

        Args:
            message: The JSON-RPC request (``jsonrpc``, ``method``, ``params``, ``id``).
            request_id: The request's id, written only if the dialect has ids.

        Returns:
            The frame.

        Raises:
            TypeError: A value of a type msgspec cannot encode.
            msgspec.EncodeError: A value msgspec cannot encode.
        """
        return self._encode(MCPMessage(data=message, id=self._id(request_id)))

    def step_batch(self, actions: list[Any]) -> bytes:
        """Encode the actions of a batch of steps as one message (see `StepBatchReply`).

        Args:
            actions: One action per session of the batch, in its order.

        Returns:
            The message.

        Raises:
            TypeError: A value of a type msgspec cannot encode.
            msgspec.EncodeError: A value msgspec cannot encode.
        """
        return self._encode(actions)

    def decode_step_batch(self, message: bytes) -> tuple[StepBatchReply[Any], dict[int, ReplyValidationError]]:
        """Decode the replies to a batch of steps.

        Args:
            message: What the batch's host answered.

        Returns:
            The replies, their observations decoded into the client's type; and
            the error of each observation that does not fit it, by position (its
            place in the replies is then empty), as its own reply would have failed.

        Raises:
            ProtocolError: The message is not a batch's replies.
        """
        decode = self._decode_batch
        if decode is not None:
            try:
                return decode(message), {}
            except msgspec.ValidationError:
                pass  # some observation does not fit: find which
            except msgspec.DecodeError as exc:
                raise ProtocolError(f"malformed batch of replies: {exc}") from exc
        try:
            raw = self._decode_batch_raw(message)
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"malformed batch of replies: {exc}") from exc
        observations: list[Any] = []
        invalid: dict[int, ReplyValidationError] = {}
        for position, encoded in enumerate(raw.observations):
            observation = None
            if bytes(encoded) != _NULL[self.dialect.encoding]:
                try:
                    observation = self._decode_observation(encoded)
                except msgspec.DecodeError as exc:
                    invalid[position] = ReplyValidationError(f"reply does not match the client's types: {exc}")
            observations.append(observation)
        return StepBatchReply(observations, raw.errors), invalid

    def decode_reply(self, frame: bytes) -> ObservationReply[ObsT] | StateReply[StateT] | ErrorReply | MCPMessage:
        """Decode one reply frame.

        Args:
            frame: The frame, as the transport received it.

        Returns:
            The reply, its data decoded into the client's types.

        Raises:
            ProtocolError: The frame is not a reply of the protocol at all.
            ReplyValidationError: It is one, but its data does not fit the client's types.
        """
        try:
            reply = self._decode(frame)
            if self._observation_union is not None and isinstance(reply, ObservationReply):
                data = reply.data
                observation = self._observation_union.decode(data.observation)
                # The client sets reward and done only on a single Struct type; do it here.
                if observation.__struct_config__.frozen:
                    observation = msgspec.structs.replace(observation, reward=data.reward, done=data.done)
                else:
                    observation.reward = data.reward
                    observation.done = data.done
                data.observation = observation
            return reply  # type: ignore[no-any-return]
        except msgspec.ValidationError as exc:
            try:
                self._decode_loose(frame)
            except msgspec.DecodeError:
                raise ProtocolError(f"malformed reply frame: {exc}") from exc
            raise ReplyValidationError(f"reply does not match the client's types: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"malformed reply frame: {exc}") from exc

    def reply_id(self, frame: bytes) -> int | None:
        """Read just the request id of a reply that failed to decode, if it has one.

        Args:
            frame: The frame.

        Returns:
            Its ``id``, or ``None`` if it has none or cannot be read at all.
        """
        try:
            return self._decode_loose(frame).id  # type: ignore[no-any-return]
        except msgspec.DecodeError:
            return None


class RequestError(Exception):
    """A request the server session cannot take; becomes an error reply.

    The codec raises it for a frame that does not decode or fit; an
    environment's method may raise it too, to refuse a request with a code of
    its own (``openenv.core`` answers a pydantic action that does not validate
    with ``VALIDATION_ERROR`` this way).

    Args:
        code: The OpenEnv error code.
        message: The human-readable message.
        extra: More fields for the error frame's ``data``.
        request_id: The request's id, when it could be read.

    Attributes:
        code: The OpenEnv error code.
        message: The human-readable message.
        extra: More fields for the error frame's ``data`` (``errors``, ...).
        request_id: The request's id, when it could be read.
    """

    def __init__(
        self, code: str, message: str, *, extra: dict[str, Any] | None = None, request_id: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra or {}
        self.request_id = request_id


_PATH_RE = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_PATH_PART_RE = re.compile(r"\.([^.\[]+)|\[(\d+)\]")
_FIELD_RE = re.compile(r"field `([^`]+)`")


def validation_errors(exc: msgspec.ValidationError, value: Any = None) -> list[dict[str, Any]]:
    """Describe a msgspec validation error as OpenEnv's (pydantic-shaped) ``errors`` list.

    msgspec reports the first problem it finds; this turns it into one entry with
    ``type``, ``loc`` and ``msg`` like the reference server's.

    Args:
        exc: The validation error.
        value: The input that was being validated, echoed as ``input``.

    Returns:
        A list with one dict per problem.
    """
    text = str(exc)
    loc: list[str | int] = []
    match = _PATH_RE.search(text)
    message = text[: match.start()] if match else text
    if match:
        for name, index in _PATH_PART_RE.findall(match.group("path")):
            loc.append(int(index) if index else name)
    kind = "value_error"
    if message.startswith("Object missing required field"):
        kind = "missing"
    elif message.startswith("Object contains unknown field"):
        kind = "extra_forbidden"
    elif message.startswith("Expected"):
        kind = "type_error"
    field = _FIELD_RE.search(message)
    if field and kind in ("missing", "extra_forbidden"):
        loc.append(field.group(1))
    entry: dict[str, Any] = {"type": kind, "loc": loc, "msg": message}
    if value is not None:
        entry["input"] = value
    return [entry]


def _decode_lax(decode: Callable[[Any], Any], decode_any: Callable[[Any], Any], type_: Any, raw: Any) -> Any:
    """Decode strictly (the fast path); data that does not fit as it is gets pydantic's lax conversions."""
    try:
        return decode(raw)
    except msgspec.ValidationError as exc:
        if _out_of_range(exc):
            raise
        return lax_convert(decode_any(raw), type_)


class ServerCodec(Generic[ActT]):
    """Reads requests and writes replies for one server session.

    Args:
        dialect: The dialect the transport negotiated.
        action_type: The type step data is decoded into (``dict`` for none); a
            union of Structs (``A | B``) decodes each action into the member it fits.
        strict: Validate actions strictly. By default (``False``) an action
            that does not fit as it is gets pydantic's lax conversions (a
            number as a numeric string, an ``int`` as an integral float or a
            bool, a bool as ``"yes"`` or ``1.0``: see `openenv._lax`), as
            OpenEnv's pydantic models accept them.

    Attributes:
        dialect: The dialect it reads and writes.
        encode_value: The dialect's encoder: a Struct, a dict or a builtin in, its
            bytes out, with no check; for a caller that encodes many observations
            in one loop (the in-process batch of steps).
    """

    def __init__(self, dialect: Dialect, *, action_type: Any, strict: bool = False) -> None:
        self.dialect = dialect
        self._request_ids = dialect.request_ids
        self.encode_value = _encoder(dialect).encode
        self._decode_request = _decoder(dialect, IncomingRequest).decode
        self._decode_kwargs = _decoder(dialect, dict[str, Any]).decode
        self._decode_any = _decoder(dialect, Any).decode
        members = struct_union_members(action_type)
        if members is not None:
            self._decode_action = StructUnionDecoder(members, encoding=dialect.encoding, strict=strict).decode
        elif strict:
            self._decode_action = _decoder(dialect, action_type).decode
        else:
            self._decode_action = functools.partial(
                _decode_lax, _decoder(dialect, action_type).decode, self._decode_any, action_type
            )
        self._json = dialect.encoding != "msgpack"
        # A batch's actions are decoded in one call, strictly: one that does not fit as it is sends
        # the batch's requests on their own (the lax conversions, and each one's own error, are there).
        # A union's are split in one call, then each decoded into the member it fits.
        self._decode_actions = _decoder(dialect, list[action_type]).decode if members is None else None
        self._split_actions = _decoder(dialect, list[msgspec.Raw]).decode
        self._decode_member = (
            StructUnionDecoder(members, encoding=dialect.encoding, strict=True).decode if members is not None else None
        )
        # A step whose action fits as it is is read in one call, without the request's data left raw first.
        self._decode_step = _decoder(dialect, _TypedStep[action_type]).decode if members is None else None

    def _invalid(self, exc: msgspec.ValidationError, raw: Any, request_id: int | None) -> RequestError:
        if _out_of_range(exc):  # 1e999: no value of any type, so the frame is malformed
            return RequestError("INVALID_JSON", f"Invalid JSON: {exc}", request_id=request_id)
        try:
            value = self._decode_any(raw) if raw else None
        except (msgspec.DecodeError, RecursionError):
            value = None
        # The input is echoed as the reference does, but only while small.
        echoed = len(raw) <= MAX_ECHOED_INPUT if raw else True
        if isinstance(value, dict):
            errors = validation_errors(exc, value if echoed else None)
        else:  # The frame's data itself is no object: say so as the reference does.
            entry: dict[str, Any] = {"type": "dict_type", "loc": ["data"], "msg": "Input should be a valid dictionary"}
            if echoed:
                entry["input"] = value
            errors = [entry]
        return RequestError("VALIDATION_ERROR", "Invalid message", extra={"errors": errors}, request_id=request_id)

    def decode_request(self, frame: bytes) -> tuple[str, Any, int | None]:
        """Decode one request frame.

        Args:
            frame: The frame, as the client encoded it.

        Returns:
            ``(type, data, id)``: ``data`` is the action for a step, the keyword
            arguments for a reset, the JSON-RPC request (a dict) for an ``mcp``
            request, ``None`` otherwise; ``id`` is ``None`` unless the dialect
            carries request ids.

        Raises:
            RequestError: With the code OpenEnv gives: ``INVALID_JSON`` for a frame
                that does not parse, ``UNKNOWN_TYPE``, or ``VALIDATION_ERROR`` for
                bad data (always with an ``errors`` list).
        """
        try:
            request = self._decode_request(frame)
        except msgspec.ValidationError as exc:
            if _out_of_range(exc):
                raise RequestError("INVALID_JSON", f"Invalid JSON: {exc}") from exc
            raise RequestError("VALIDATION_ERROR", "Invalid message", extra={"errors": validation_errors(exc)}) from exc
        except msgspec.DecodeError as exc:
            raise RequestError("INVALID_JSON", f"Invalid JSON: {exc}") from exc
        except RecursionError as exc:
            raise RequestError("INVALID_JSON", f"Invalid JSON: nested deeper than {MAX_NESTING} levels") from exc
        request_id = request.id if self._request_ids else None
        # The bracket count bounds the depth: the precise look is only for frames with many.
        if (
            self._json
            and frame.count(b"[") + frame.count(b"{") > MAX_NESTING
            and nested_deeper_than(frame, MAX_NESTING)
        ):
            raise RequestError(
                "INVALID_JSON", f"Invalid JSON: nested deeper than {MAX_NESTING} levels", request_id=request_id
            )
        kind = request.type
        raw = request.data
        if kind == "step":
            if not raw:
                missing = {"type": "missing", "loc": ["data"], "msg": "Field required", "input": {"type": "step"}}
                raise RequestError(
                    "VALIDATION_ERROR", "Invalid message", extra={"errors": [missing]}, request_id=request_id
                )
            try:
                return kind, self._decode_action(raw), request_id
            except msgspec.ValidationError as exc:
                raise self._invalid(exc, raw, request_id) from exc
        if kind in ("reset", "mcp"):
            if not raw:
                if kind == "reset":
                    return kind, {}, request_id
                missing = {"type": "missing", "loc": ["data"], "msg": "Field required", "input": {"type": "mcp"}}
                raise RequestError(
                    "VALIDATION_ERROR", "Invalid message", extra={"errors": [missing]}, request_id=request_id
                )
            try:
                return kind, self._decode_kwargs(raw), request_id
            except msgspec.ValidationError as exc:
                raise self._invalid(exc, raw, request_id) from exc
        if kind in ("state", "close"):
            return kind, None, request_id
        raise RequestError("UNKNOWN_TYPE", f"Unknown message type: {kind}", request_id=request_id)

    def decode_step(self, frame: bytes) -> tuple[Any, int | None] | None:
        """Read a step request whose action fits the action type as it is, in one call.

        The quick way for the frames most sessions send; any other frame (not a
        step, an action that needs the lax conversions or fits nothing, a
        malformed frame) gives ``None``, and `decode_request` reads it, with its
        error if it has one.

        Args:
            frame: The frame, as the client encoded it.

        Returns:
            ``(action, id)``, ``id`` being ``None`` unless the dialect carries
            request ids; or ``None``.
        """
        decode = self._decode_step
        if decode is None or (self._json and frame.count(b"[") + frame.count(b"{") > MAX_NESTING):
            return None
        try:
            step = decode(frame)
        except (msgspec.DecodeError, RecursionError):
            return None
        return step.data, step.id if self._request_ids else None

    def decode_step_batch(self, message: bytes) -> list[Any] | None:
        """Decode the actions of a batch of steps (`ClientCodec.step_batch`), in one call (a union's: one each).

        Args:
            message: The batch's actions, as one message: from a pool in this
                process, or off a link (a ``steps`` entry's).

        Returns:
            The actions; or ``None`` when one does not fit the action type as it
            is, or nests deeper than a request may: the batch's requests then go
            on their own (with the lax conversions, or each one's error).
        """
        try:
            split = None
            # Read off a link too: one nested deeper than a request may be sends the steps on their own (and
            # is refused there). In a request, an action sits one level down; only a long one can be that deep.
            if self._json and message.count(b"[") + message.count(b"{") > MAX_NESTING:
                split = self._split_actions(message)
                if max(map(len, split), default=0) > 2 * MAX_NESTING:  # a long one: look closer (rare)
                    for action in split:
                        if len(action) > 2 * MAX_NESTING and nested_deeper_than(bytes(action), MAX_NESTING - 1):
                            return None
            if self._decode_member is not None:
                decode = self._decode_member
                return [decode(action) for action in (split or self._split_actions(message))]
            assert self._decode_actions is not None
            return self._decode_actions(message)  # type: ignore[no-any-return]
        except (msgspec.DecodeError, RecursionError):
            return None

    def step_batch_reply(self, replies: StepBatchReply[msgspec.Raw]) -> bytes:
        """Encode the replies to a batch of steps as one message.

        Args:
            replies: Each step's observation (`batch_observation`) or error data.

        Returns:
            The message.
        """
        return self.encode_value(replies)

    def batch_observation(self, observation: Any) -> msgspec.Raw:
        """One step's observation in a batch's reply: encoded as it is, at once (see `StepBatchReply`).

        Args:
            observation: What the environment returned: a Struct, a dict, or
                anything msgspec turns into a dict.

        Returns:
            The encoded observation.

        Raises:
            TypeError: The observation is not a Struct or a dict, or cannot be encoded.
            msgspec.EncodeError: It holds a value msgspec cannot encode.
        """
        if not isinstance(observation, (msgspec.Struct, dict)):
            observation = msgspec.to_builtins(observation)
            if not isinstance(observation, dict):
                raise TypeError(f"an observation must be a Struct or a dict, not {type(observation).__name__}")
        return msgspec.Raw(self.encode_value(observation))

    def batch_reply_frame(self, reply: msgspec.Raw | dict[str, Any], request_id: int | None) -> bytes:
        """The frame a reply in a batch stands for: the observation reply, or the error reply, of its own.

        Args:
            reply: Its observation as the batch carries it (`batch_observation`), or its error's data.
            request_id: The request's id, or ``None``.

        Returns:
            The frame.
        """
        if isinstance(reply, dict):
            return self.encode_error(reply, request_id)
        return self.observation(self._decode_any(reply), request_id)

    def observation(self, observation: Any, request_id: int | None) -> bytes:
        """Encode an observation reply, lifting ``done`` and ``reward`` (and non-empty ``metadata``) beside it.

        Args:
            observation: What the environment returned: a Struct, a dict, or
                anything msgspec turns into a dict.
            request_id: The request's id, or ``None``.

        Returns:
            The frame.

        Raises:
            TypeError: The observation is not a Struct or a dict, or cannot be encoded.
        """
        if isinstance(observation, msgspec.Struct):
            fields = msgspec.structs.asdict(observation)
        elif isinstance(observation, dict):
            fields = dict(observation)
        else:
            fields = msgspec.to_builtins(observation)
            if not isinstance(fields, dict):
                raise TypeError(f"an observation must be a Struct or a dict, not {type(observation).__name__}")
        fields, reward, done, metadata = lift_observation_fields(fields)
        reply = ObservationReply(data=ObservationData(fields, reward, done, metadata), id=request_id)
        return self.encode_value(reply)

    def state(self, state: Any, request_id: int | None) -> bytes:
        """Encode a state reply.

        Args:
            state: What the environment's ``state`` gave.
            request_id: The request's id, or ``None``.

        Returns:
            The frame.
        """
        return self.encode_value(StateReply(data=state, id=request_id))

    def mcp(self, response: dict[str, Any], request_id: int | None) -> bytes:
        """Encode an ``mcp`` reply carrying a JSON-RPC 2.0 response.

        Args:
            response: The JSON-RPC response.
            request_id: The request's id, or ``None``.

        Returns:
            The frame.
        """
        return self.encode_value(MCPMessage(data=response, id=request_id))

    def error(
        self, code: str, message: str, *, extra: dict[str, Any] | None = None, request_id: int | None = None
    ) -> bytes:
        """Encode an error reply with ``message``, ``code`` and any ``extra`` fields.

        Args:
            code: The OpenEnv error code.
            message: The human-readable message.
            extra: More fields for the frame's ``data``.
            request_id: The request's id, or ``None``.

        Returns:
            The frame.
        """
        return self.encode_error(error_data(code, message, extra), request_id)

    def encode_error(self, data: dict[str, Any], request_id: int | None) -> bytes:
        """Encode an error reply whose ``data`` is made already (`error_data`).

        Args:
            data: The reply's data.
            request_id: The request's id, or ``None``.

        Returns:
            The frame.
        """
        return self.encode_value(ErrorReply(data=data, id=request_id))


def error_data(code: str, message: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """An error reply's ``data``: ``message``, ``code`` and any ``extra`` fields."""
    data: dict[str, Any] = {"message": message, "code": code}
    if extra:
        data.update(extra)
    return data


# A codec holds nothing of its session (and msgspec's encoders and decoders are thread-safe), while
# its decoders take more memory, and more time to build, than the rest of a session: a fleet of a
# thousand sessions of one kind builds one. A type that cannot be a key gets a codec of its own.


@functools.lru_cache(maxsize=128)
def _shared_client_codec(dialect: Dialect, observation_type: Any, state_type: Any) -> ClientCodec[Any, Any, Any]:
    return ClientCodec(dialect, observation_type=observation_type, state_type=state_type)


@functools.lru_cache(maxsize=128)
def _shared_server_codec(dialect: Dialect, action_type: Any, strict: bool) -> ServerCodec[Any]:
    return ServerCodec(dialect, action_type=action_type, strict=strict)


def client_codec(dialect: Dialect, observation_type: Any, state_type: Any) -> ClientCodec[Any, Any, Any]:
    """A client session's codec, shared by every session with the same dialect and types (see `ClientCodec`)."""
    try:
        return _shared_client_codec(dialect, observation_type, state_type)
    except TypeError:
        return ClientCodec(dialect, observation_type=observation_type, state_type=state_type)


def server_codec(dialect: Dialect, action_type: Any, strict: bool) -> ServerCodec[Any]:
    """A server session's codec, shared by every session with the same dialect, action type and strictness."""
    try:
        return _shared_server_codec(dialect, action_type, strict)
    except TypeError:
        return ServerCodec(dialect, action_type=action_type, strict=strict)
