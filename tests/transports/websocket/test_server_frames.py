"""The client's quick read of a server's frames (`_quick_frames`): whole data frames only, as the parser reads them.

websockets' own client protocol is the reference: what the quick read takes,
the parser turns into the same messages; anything else is left to the parser.
"""

from __future__ import annotations

import pytest
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State

from transports.websocket._quick_frames import whole_data_frames


def quick(data: bytes, max_size: int | None = 2**20) -> list[tuple[bool, bytes]] | None:
    """The client's quick read of ``data``."""
    return whole_data_frames(data, max_size, masked=False)


def server_frame(opcode: Opcode, payload: bytes, *, fin: bool = True) -> bytes:
    """A frame as a server sends it: unmasked."""
    return Frame(opcode, payload, fin=fin).serialize(mask=False, extensions=[])


def parsed(data: bytes, max_size: int | None = 2**20) -> list[tuple[bool, bytes]]:
    """The messages websockets' client protocol makes of ``data`` on an open connection without extensions."""
    protocol = Protocol(Side.CLIENT, state=State.OPEN, max_size=max_size)
    protocol.receive_data(data)
    assert protocol.parser_exc is None
    assert not protocol.reader.buffer
    frames = protocol.events_received()
    assert all(isinstance(frame, Frame) and frame.fin for frame in frames)
    return [(frame.opcode is Opcode.TEXT, bytes(frame.data)) for frame in frames if isinstance(frame, Frame)]


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536])
@pytest.mark.parametrize("opcode", [Opcode.TEXT, Opcode.BINARY])
def test_a_whole_frame_of_any_length_is_read_as_the_parser_reads_it(size: int, opcode: Opcode) -> None:
    payload = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    data = server_frame(opcode, payload)
    assert quick(data) == parsed(data) == [(opcode is Opcode.TEXT, payload)]


def test_frames_in_one_read_are_read_in_order() -> None:
    text = '{"type":"step","data":{"message":"héllo"}}'.encode()
    big = bytes(range(256)) * 300  # a 64-bit length
    data = server_frame(Opcode.TEXT, text) + server_frame(Opcode.BINARY, big) + server_frame(Opcode.TEXT, b"")
    assert quick(data) == parsed(data) == [(True, text), (False, big), (True, b"")]


def test_a_text_frame_of_bad_utf8_is_left_to_the_parser() -> None:
    # Which hands it on as bytes, unchecked: the codec then says what is wrong.
    data = server_frame(Opcode.TEXT, b"\xff\xfe not UTF-8")
    assert quick(data) is None
    assert parsed(data) == [(True, b"\xff\xfe not UTF-8")]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(server_frame(Opcode.TEXT, b"a", fin=False), id="a first fragment"),
        pytest.param(server_frame(Opcode.CONT, b"a"), id="a continuation"),
        pytest.param(server_frame(Opcode.PING, b"hi"), id="a ping"),
        pytest.param(server_frame(Opcode.PONG, b"hi"), id="a pong"),
        pytest.param(server_frame(Opcode.CLOSE, b"\x03\xe8"), id="a close"),
        pytest.param(server_frame(Opcode.TEXT, b"abc")[:-1], id="a partial payload"),
        pytest.param(server_frame(Opcode.TEXT, b"abc")[:1], id="a partial header"),
        pytest.param(server_frame(Opcode.BINARY, bytes(300))[:3], id="a partial 16-bit length"),
        pytest.param(server_frame(Opcode.BINARY, bytes(70_000))[:9], id="a partial 64-bit length"),
        pytest.param(Frame(Opcode.TEXT, b"abc").serialize(mask=True, extensions=[]), id="masked"),
        pytest.param(bytes([0xC1]) + server_frame(Opcode.TEXT, b"abc")[1:], id="RSV1 (compressed)"),
        pytest.param(bytes([0xA1]) + server_frame(Opcode.TEXT, b"abc")[1:], id="RSV2"),
        pytest.param(bytes([0x83, 0]), id="a reserved opcode"),
        pytest.param(server_frame(Opcode.TEXT, b"ok") + server_frame(Opcode.PING, b""), id="a data frame, then a ping"),
        pytest.param(server_frame(Opcode.PING, b"") + server_frame(Opcode.TEXT, b"ok"), id="a ping, then a data frame"),
        pytest.param(server_frame(Opcode.TEXT, b"ok") + server_frame(Opcode.TEXT, b"abc")[:-1], id="a frame, a part"),
    ],
)
def test_anything_but_whole_data_frames_is_left_to_the_parser(data: bytes) -> None:
    assert quick(data) is None


def test_a_frame_over_the_limit_is_left_to_the_parser() -> None:
    assert quick(server_frame(Opcode.TEXT, b"12345"), 4) is None
    assert quick(server_frame(Opcode.TEXT, b"1234"), 4) == parsed(server_frame(Opcode.TEXT, b"1234"), 4)
    assert quick(server_frame(Opcode.BINARY, bytes(70_000)), None) == [(False, bytes(70_000))]
