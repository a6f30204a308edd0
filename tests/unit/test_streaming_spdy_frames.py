"""SPDY/3.1 wire format: the dictionary, frame headers, header blocks, cross-checked against the
test client's independent codec."""
from __future__ import annotations

import struct
import zlib

import pytest

from cri_server.streaming.spdy import frames as f
from cri_server.streaming.spdy.dictionary import SPDY3_DICTIONARY
from tests.streaming_support import spdy_client as client


def test_dictionary_is_byte_exact():
    # Length and Adler-32 of the SPDY/3 dictionary: the Adler-32 is the DICTID every SPDY/3 peer
    # (spdystream in kubelet and client-go included) puts in its zlib header and checks on ours.
    assert len(SPDY3_DICTIONARY) == 1423
    assert zlib.adler32(SPDY3_DICTIONARY) == 0xE3C6A7C2
    assert SPDY3_DICTIONARY == client.SPDY3_DICT  # built from words here, from raw bytes there
    assert SPDY3_DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert SPDY3_DICTIONARY.endswith(b",*,enq=0.")


def test_first_header_block_announces_the_dictionary():
    block = f.HeaderCompressor().compress({"streamtype": ["error"]})
    cmf, flg = block[0], block[1]
    assert cmf & 0x0F == 8  # deflate
    assert (cmf << 8 | flg) % 31 == 0
    assert flg & 0x20, "FDICT bit"
    assert struct.unpack(">I", block[2:6])[0] == 0xE3C6A7C2
    assert block.endswith(b"\x00\x00\xff\xff"), "SYNC_FLUSH ends every block"


def test_one_compression_context_per_direction():
    comp = f.HeaderCompressor()
    first = comp.compress({"streamtype": ["stdin"]})
    second = comp.compress({"streamtype": ["stdout"]})
    # The second block is not a zlib stream by itself: only a decompressor that saw the first works.
    with pytest.raises(zlib.error):
        zlib.decompressobj(zdict=SPDY3_DICTIONARY).decompress(second)
    dec = f.HeaderDecompressor()
    assert dec.decompress(first, 1) == {"streamtype": ["stdin"]}
    assert dec.decompress(second, 3) == {"streamtype": ["stdout"]}


def test_control_frame_header_layout():
    ping = f.encode_ping(7)
    assert ping == bytes([0x80, 0x03, 0x00, 0x06, 0x00, 0x00, 0x00, 0x04, 0, 0, 0, 7])
    rst = f.encode_rst_stream(5, f.RstStatus.CANCEL)
    assert rst[:8] == bytes([0x80, 3, 0, 3, 0, 0, 0, 8]) and struct.unpack(">II", rst[8:]) == (5, 5)
    goaway = f.encode_goaway(9, f.GoAwayStatus.OK)
    assert goaway[:8] == bytes([0x80, 3, 0, 7, 0, 0, 0, 8]) and struct.unpack(">II", goaway[8:]) == (9, 0)
    wu = f.encode_window_update(3, 1000)
    assert wu[:8] == bytes([0x80, 3, 0, 9, 0, 0, 0, 8]) and struct.unpack(">II", wu[8:]) == (3, 1000)
    head = f.parse_frame_header(f.FrameEncoder().syn_reply(3, {}, fin=True)[:8])
    assert head.control and head.version == 3 and head.frame_type == f.SYN_REPLY and head.flags == f.FLAG_FIN


def test_data_frame_layout_and_24_bit_length():
    frame = f.encode_data(0x7FFFFFFF, b"x" * 300, fin=True)
    assert frame[:4] == b"\x7f\xff\xff\xff" and frame[4] == 1 and int.from_bytes(frame[5:8], "big") == 300
    h = f.parse_frame_header(frame[:8])
    assert not h.control and h.stream_id == 0x7FFFFFFF and h.flags == 1 and h.length == 300
    with pytest.raises(ValueError):
        f.encode_data(0, b"")
    with pytest.raises(ValueError):
        f.encode_data(1, b"\0" * (1 << 24))


def test_rst_and_goaway_codes_match_the_spec():
    assert [s.value for s in f.RstStatus] == list(range(1, 12))
    assert f.RstStatus.CANCEL == 5 and f.RstStatus.REFUSED_STREAM == 3 and f.RstStatus.FRAME_TOO_LARGE == 11
    assert (f.GoAwayStatus.OK, f.GoAwayStatus.PROTOCOL_ERROR, f.GoAwayStatus.INTERNAL_ERROR) == (0, 1, 2)


def _decode(dec: f.FrameDecoder, frame: bytes) -> f.Frame:
    return dec.decode(f.parse_frame_header(frame[:8]), frame[8:])


def test_client_syn_stream_decodes_with_priority_slot_flags():
    # Built by the test client's own encoder, with a priority and slot the server must unpack.
    deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, client.SPDY3_DICT)
    block = deflate.compress(client._nv_block({"streamType": "stdin", "port": "80"})) + deflate.flush(zlib.Z_SYNC_FLUSH)
    body = (5).to_bytes(4, "big") + (1).to_bytes(4, "big") + bytes([0b101_00000, 9]) + block
    frame = client._ctrl(client.CTRL_SYN_STREAM, f.FLAG_FIN | f.FLAG_UNIDIRECTIONAL, body)
    got = _decode(f.FrameDecoder(), frame)
    assert isinstance(got, f.SynStreamFrame)
    assert (got.stream_id, got.associated_id, got.priority, got.slot) == (5, 1, 5, 9)
    assert got.fin and got.unidirectional
    assert got.headers == {"streamtype": ["stdin"], "port": ["80"]}


def test_server_syn_reply_decodes_in_the_client():
    enc = f.FrameEncoder()
    inflate = zlib.decompressobj(zdict=client.SPDY3_DICT)
    for sid in (1, 3, 5):
        frame = enc.syn_reply(sid, {"x-a": ["1", "2"]} if sid == 3 else {})
        assert frame[:4] == bytes([0x80, 3, 0, 2])
        assert int.from_bytes(frame[5:8], "big") == len(frame) - 8
        assert int.from_bytes(frame[8:12], "big") == sid
        headers = client._parse_nv(inflate.decompress(frame[12:]))
        assert headers == ({"x-a": "1\x002"} if sid == 3 else {})  # several values NUL-joined


def test_settings_window_update_ping_goaway_decode():
    dec = f.FrameDecoder()
    settings = f.encode_settings([(1, f.SettingsId.INITIAL_WINDOW_SIZE, 1 << 20), (0, 4, 100)], flags=1)
    got = _decode(dec, settings)
    assert isinstance(got, f.SettingsFrame) and got.flags == 1
    assert got.entries == ((1, 7, 1 << 20), (0, 4, 100))
    assert _decode(dec, f.encode_window_update(0, 5)) == f.WindowUpdateFrame(0, 5)
    assert _decode(dec, f.encode_ping(3)) == f.PingFrame(3)
    assert _decode(dec, f.encode_goaway(7, 2)) == f.GoAwayFrame(7, 2)


def test_unknown_control_type_is_kept_not_fatal():
    frame = client._ctrl(0x0A, 0, b"abcd")
    got = _decode(f.FrameDecoder(), frame)
    assert isinstance(got, f.UnknownControlFrame) and got.frame_type == 0x0A and got.payload == b"abcd"


def test_wrong_version_is_rejected():
    frame = bytes([0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1])
    with pytest.raises(f.SpdyProtocolError) as exc:
        _decode(f.FrameDecoder(), frame)
    assert exc.value.status == f.RstStatus.UNSUPPORTED_VERSION


@pytest.mark.parametrize("frame", [
    f.encode_ping(1)[:8].replace(b"\x00\x04", b"\x00\x05") + b"\0\0\0\1\0",  # PING of 5 bytes
    bytes([0x80, 3, 0, 3, 0, 0, 0, 4, 0, 0, 0, 1]),  # RST_STREAM of 4 bytes
    bytes([0x80, 3, 0, 1, 0, 0, 0, 4, 0, 0, 0, 1]),  # SYN_STREAM without priority/slot
    bytes([0x80, 3, 0, 4, 0, 0, 0, 8, 0, 0, 0, 2, 0, 0, 0, 0]),  # SETTINGS: 2 entries announced, 0 sent
])
def test_malformed_control_frames(frame):
    with pytest.raises(f.SpdyProtocolError):
        _decode(f.FrameDecoder(), frame)


def test_header_block_compressed_with_another_dictionary_is_refused():
    z = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, b"not the spdy dictionary")
    block = z.compress(client._nv_block({"a": "b"})) + z.flush(zlib.Z_SYNC_FLUSH)
    with pytest.raises(f.SpdyProtocolError, match="decompress"):
        f.HeaderDecompressor().decompress(block, 1)


def test_header_bomb_is_refused():
    z = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, SPDY3_DICTIONARY)
    raw = client._nv_block({"a": "b" * (f.MAX_HEADER_BLOCK + 10)})
    block = z.compress(raw) + z.flush(zlib.Z_SYNC_FLUSH)
    assert len(block) < 2000
    with pytest.raises(f.SpdyProtocolError, match="larger"):
        f.HeaderDecompressor().decompress(block, 1)


def test_truncated_and_trailing_header_blocks():
    with pytest.raises(f.SpdyProtocolError, match="truncated"):
        f.unpack_header_block(b"\0\0\0\1\0\0\0\5ab", 1)
    with pytest.raises(f.SpdyProtocolError, match="trailing"):
        f.unpack_header_block(f.pack_header_block({"a": ["b"]}) + b"x", 1)
    # Upper-case names are lower-cased (spdystream does the same rather than failing).
    assert f.unpack_header_block(client._nv_block({"StreamType": "data"}).replace(b"streamtype", b"StreamType"), 1) \
        == {"streamtype": ["data"]}
