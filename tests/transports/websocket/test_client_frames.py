"""The quick read of frames (whole data frames only, else the parser), the quick write, and frame boundaries."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from transports.websocket._quick_frames import FrameBoundaries, server_data_frame, whole_data_frames


def quick(data: bytes, max_size: int | None = 2**20) -> list[tuple[bool, bytes]] | None:
    """The server's quick read of ``data``."""
    return whole_data_frames(data, max_size, masked=True)


def client_frame(opcode: Opcode, payload: bytes, *, fin: bool = True) -> bytes:
    """A frame as a client sends it: masked."""
    return Frame(opcode, payload, fin=fin).serialize(mask=True, extensions=[])


def test_whole_text_and_binary_frames_are_read_in_order_and_unmasked() -> None:
    text = '{"type":"step","data":{"message":"héllo"}}'.encode()
    big = bytes(range(256)) * 4  # a 16-bit length
    data = client_frame(Opcode.TEXT, text) + client_frame(Opcode.BINARY, big) + client_frame(Opcode.TEXT, b"")
    assert quick(data) == [(True, text), (False, big), (True, b"")]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(client_frame(Opcode.TEXT, b"a", fin=False), id="a fragment"),
        pytest.param(client_frame(Opcode.CONT, b"a"), id="a continuation"),
        pytest.param(client_frame(Opcode.PING, b""), id="a ping"),
        pytest.param(client_frame(Opcode.CLOSE, b"\x03\xe8"), id="a close"),
        pytest.param(client_frame(Opcode.TEXT, b"abc")[:-1], id="a partial frame"),
        pytest.param(client_frame(Opcode.TEXT, b"abc")[:3], id="a partial header"),
        pytest.param(Frame(Opcode.TEXT, b"abc").serialize(mask=False, extensions=[]), id="unmasked"),
        pytest.param(bytes([0xC1]) + client_frame(Opcode.TEXT, b"abc")[1:], id="an RSV bit"),
        pytest.param(client_frame(Opcode.TEXT, b"ok") + client_frame(Opcode.PING, b""), id="a data frame, then a ping"),
        pytest.param(client_frame(Opcode.TEXT, b"\xc3\x28"), id="a text frame of bad UTF-8"),
    ],
)
def test_anything_but_whole_data_frames_is_left_to_the_parser(data: bytes) -> None:
    assert quick(data) is None


def test_a_frame_over_the_limit_is_left_to_the_parser() -> None:
    assert quick(client_frame(Opcode.TEXT, b"12345"), 4) is None
    assert quick(client_frame(Opcode.TEXT, b"1234"), 4) == [(True, b"1234")]
    assert quick(client_frame(Opcode.TEXT, b"12345"), None) == [(True, b"12345")]
    assert quick(client_frame(Opcode.BINARY, bytes(70_000)), None) == [(False, bytes(70_000))]  # a 64-bit length


def parsed(data: bytes) -> Frame:
    """The one frame ``data`` holds, read as a client reads a server's frames (websockets' parser)."""
    reader = StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    parser = Frame.parse(reader.read_exact, mask=False)
    try:
        next(parser)
    except StopIteration as done:
        assert not reader.buffer  # nothing after the frame
        frame: Frame = done.value
        return frame
    raise AssertionError("the frame is not complete")


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536])
def test_a_server_frame_is_read_back_whole_by_websockets(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    frame = parsed(server_data_frame(payload, text=False))
    assert (frame.opcode, frame.fin, frame.data) == (Opcode.BINARY, True, payload)
    text = parsed(server_data_frame(b"h\xc3\xa9llo", text=True))
    assert (text.opcode, text.fin, text.data) == (Opcode.TEXT, True, "héllo".encode())


_SERVER_FRAMES = st.one_of(
    st.builds(
        lambda opcode, payload, fin: Frame(opcode, payload, fin=fin).serialize(mask=False, extensions=[]),
        st.sampled_from([Opcode.TEXT, Opcode.BINARY, Opcode.CONT]),
        st.sampled_from([b"", b"x", b"y" * 125, b"z" * 126, b"w" * 65536]),
        st.booleans(),
    ),
    st.builds(
        lambda payload: Frame(Opcode.PING, payload).serialize(mask=False, extensions=[]), st.binary(max_size=125)
    ),
    st.builds(lambda payload: client_frame(Opcode.BINARY, payload), st.binary(max_size=300)),  # masked, too
)


@given(frames=st.lists(_SERVER_FRAMES, min_size=1, max_size=6), data=st.data())
def test_frame_boundaries_are_followed_through_reads_cut_anywhere(frames: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(frames)
    ends = set(itertools.accumulate(len(frame) for frame in frames))
    cuts = sorted(data.draw(st.sets(st.integers(1, len(stream) - 1), max_size=8)) if len(stream) > 1 else set())
    boundaries = FrameBoundaries()
    assert boundaries.at_boundary
    for start, end in itertools.pairwise([0, *cuts, len(stream)]):
        boundaries.feed(stream[start:end])
        assert boundaries.at_boundary is (end in ends), f"after byte {end} of {len(stream)}"
