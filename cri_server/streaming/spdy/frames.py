"""SPDY/3.1 frame encoding and decoding (control frames, data frames, zlib header blocks).

Owns the wire format only: no sockets, no stream state. session.py drives it.
"""
from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass, field

from .dictionary import SPDY3_DICTIONARY

VERSION = 3

# Control frame types.
SYN_STREAM = 1
SYN_REPLY = 2
RST_STREAM = 3
SETTINGS = 4
PING = 6
GOAWAY = 7
HEADERS = 8
WINDOW_UPDATE = 9

# Flags. FIN is shared by control and data frames; UNIDIRECTIONAL only on SYN_STREAM.
FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02
FLAG_SETTINGS_CLEAR_SETTINGS = 0x01

MAX_LENGTH = (1 << 24) - 1  # the 24-bit length field
MAX_STREAM_ID = (1 << 31) - 1
DEFAULT_INITIAL_WINDOW = 64 * 1024

# A decompressed header block larger than this is refused: the streaming protocols send a handful of
# short headers, so anything big is a bug or an attack (zlib makes 1 KB expand to a lot).
MAX_HEADER_BLOCK = 256 * 1024


class RstStatus(enum.IntEnum):
    PROTOCOL_ERROR = 1
    INVALID_STREAM = 2
    REFUSED_STREAM = 3
    UNSUPPORTED_VERSION = 4
    CANCEL = 5
    INTERNAL_ERROR = 6
    FLOW_CONTROL_ERROR = 7
    STREAM_IN_USE = 8
    STREAM_ALREADY_CLOSED = 9
    INVALID_CREDENTIALS = 10
    FRAME_TOO_LARGE = 11


class GoAwayStatus(enum.IntEnum):
    OK = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2


class SettingsId(enum.IntEnum):
    UPLOAD_BANDWIDTH = 1
    DOWNLOAD_BANDWIDTH = 2
    ROUND_TRIP_TIME = 3
    MAX_CONCURRENT_STREAMS = 4
    CURRENT_CWND = 5
    DOWNLOAD_RETRANS_RATE = 6
    INITIAL_WINDOW_SIZE = 7
    CLIENT_CERTIFICATE_VECTOR_SIZE = 8


class SpdyProtocolError(Exception):
    """A frame that breaks the SPDY/3.1 rules; stream_id 0 means the whole session is affected."""

    def __init__(self, reason: str, stream_id: int = 0, status: RstStatus = RstStatus.PROTOCOL_ERROR):
        super().__init__(f"spdy: {reason}" + (f" (stream {stream_id})" if stream_id else ""))
        self.reason = reason
        self.stream_id = stream_id
        self.status = status


Headers = dict[str, list[str]]


@dataclass(frozen=True)
class DataFrame:
    stream_id: int
    flags: int
    data: bytes

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


@dataclass(frozen=True)
class SynStreamFrame:
    stream_id: int
    associated_id: int
    priority: int
    slot: int
    flags: int
    headers: Headers = field(default_factory=dict)

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)

    @property
    def unidirectional(self) -> bool:
        return bool(self.flags & FLAG_UNIDIRECTIONAL)


@dataclass(frozen=True)
class SynReplyFrame:
    stream_id: int
    flags: int
    headers: Headers = field(default_factory=dict)

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


@dataclass(frozen=True)
class RstStreamFrame:
    stream_id: int
    status: int


@dataclass(frozen=True)
class SettingsFrame:
    flags: int
    entries: tuple[tuple[int, int, int], ...]  # (flags, id, value)


@dataclass(frozen=True)
class PingFrame:
    ping_id: int


@dataclass(frozen=True)
class GoAwayFrame:
    last_good_stream_id: int
    status: int


@dataclass(frozen=True)
class HeadersFrame:
    stream_id: int
    flags: int
    headers: Headers = field(default_factory=dict)

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


@dataclass(frozen=True)
class WindowUpdateFrame:
    stream_id: int
    delta: int


@dataclass(frozen=True)
class UnknownControlFrame:
    """A control frame of a type SPDY/3.1 does not define; the spec says to ignore it."""

    version: int
    frame_type: int
    flags: int
    payload: bytes


Frame = (DataFrame | SynStreamFrame | SynReplyFrame | RstStreamFrame | SettingsFrame | PingFrame
         | GoAwayFrame | HeadersFrame | WindowUpdateFrame | UnknownControlFrame)


@dataclass(frozen=True)
class FrameHeader:
    """The common 8 bytes in front of every frame."""

    control: bool
    version: int  # control frames only
    frame_type: int  # control frames only
    stream_id: int  # data frames only
    flags: int
    length: int


def parse_frame_header(head: bytes) -> FrameHeader:
    if len(head) != 8:
        raise ValueError("a SPDY frame header is 8 bytes")
    first, flags_len = struct.unpack(">II", head)
    flags, length = flags_len >> 24, flags_len & 0xFFFFFF
    if first & 0x80000000:
        return FrameHeader(True, (first >> 16) & 0x7FFF, first & 0xFFFF, 0, flags, length)
    return FrameHeader(False, 0, 0, first & 0x7FFFFFFF, flags, length)


def _control_header(frame_type: int, flags: int, length: int) -> bytes:
    if length > MAX_LENGTH:
        raise ValueError(f"spdy: control frame payload of {length} bytes exceeds the 24-bit length")
    return struct.pack(">HHI", 0x8000 | VERSION, frame_type, (flags << 24) | length)


def encode_data(stream_id: int, data: bytes, fin: bool = False) -> bytes:
    if not 0 < stream_id <= MAX_STREAM_ID:
        raise ValueError(f"spdy: invalid stream id {stream_id}")
    if len(data) > MAX_LENGTH:
        raise ValueError(f"spdy: data frame of {len(data)} bytes exceeds the 24-bit length")
    return struct.pack(">II", stream_id, ((FLAG_FIN if fin else 0) << 24) | len(data)) + data


def encode_rst_stream(stream_id: int, status: int) -> bytes:
    return _control_header(RST_STREAM, 0, 8) + struct.pack(">II", stream_id & MAX_STREAM_ID, status)


def encode_settings(entries: list[tuple[int, int, int]], flags: int = 0) -> bytes:
    body = struct.pack(">I", len(entries)) + b"".join(
        struct.pack(">II", ((f & 0xFF) << 24) | (i & 0xFFFFFF), v) for f, i, v in entries)
    return _control_header(SETTINGS, flags, len(body)) + body


def encode_ping(ping_id: int) -> bytes:
    return _control_header(PING, 0, 4) + struct.pack(">I", ping_id)


def encode_goaway(last_good_stream_id: int, status: int = GoAwayStatus.OK) -> bytes:
    return _control_header(GOAWAY, 0, 8) + struct.pack(">II", last_good_stream_id & MAX_STREAM_ID, status)


def encode_window_update(stream_id: int, delta: int) -> bytes:
    if not 0 < delta <= MAX_STREAM_ID:
        raise ValueError(f"spdy: invalid window delta {delta}")
    return _control_header(WINDOW_UPDATE, 0, 8) + struct.pack(">II", stream_id & MAX_STREAM_ID, delta)


def pack_header_block(headers: Headers) -> bytes:
    """The uncompressed name/value block: u32 count, then u32-length-prefixed names and values.

    Several values of one name travel as one value joined by NUL, as the spec requires."""
    out = [struct.pack(">I", len(headers))]
    for name, values in headers.items():
        n = name.lower().encode("utf-8")
        v = "\0".join(values).encode("utf-8")
        out.append(struct.pack(">I", len(n)) + n + struct.pack(">I", len(v)) + v)
    return b"".join(out)


def unpack_header_block(raw: bytes, stream_id: int) -> Headers:
    def take(pos: int, n: int) -> tuple[bytes, int]:
        if pos + n > len(raw):
            raise SpdyProtocolError("truncated header block", stream_id)
        return raw[pos:pos + n], pos + n

    count_b, pos = take(0, 4)
    (count,) = struct.unpack(">I", count_b)
    headers: Headers = {}
    for _ in range(count):
        ln, pos = take(pos, 4)
        name_b, pos = take(pos, struct.unpack(">I", ln)[0])
        lv, pos = take(pos, 4)
        value_b, pos = take(pos, struct.unpack(">I", lv)[0])
        if not name_b:
            raise SpdyProtocolError("empty header name", stream_id)
        try:
            name, value = name_b.decode("utf-8"), value_b.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpdyProtocolError(f"header is not UTF-8: {exc}", stream_id) from exc
        # Peers must send lower-case names; spdystream (kubelet's library) lower-cases and carries on,
        # and so does this decoder rather than failing a session over letter case.
        headers.setdefault(name.lower(), []).extend(value.split("\0"))
    if pos != len(raw):
        raise SpdyProtocolError("trailing bytes after header block", stream_id)
    return headers


class HeaderCompressor:
    """One zlib stream per direction for the whole session, flushed with SYNC_FLUSH after each block."""

    def __init__(self) -> None:
        self._z = zlib.compressobj(zlib.Z_BEST_COMPRESSION, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY,
                                   SPDY3_DICTIONARY)

    def compress(self, headers: Headers) -> bytes:
        return self._z.compress(pack_header_block(headers)) + self._z.flush(zlib.Z_SYNC_FLUSH)


class HeaderDecompressor:
    def __init__(self) -> None:
        self._z = zlib.decompressobj(15, zdict=SPDY3_DICTIONARY)

    def decompress(self, block: bytes, stream_id: int) -> Headers:
        try:
            raw = self._z.decompress(block, MAX_HEADER_BLOCK)
        except zlib.error as exc:
            # A wrong dictionary shows up here ("invalid dictionary"), as does garbage.
            raise SpdyProtocolError(f"header block does not decompress: {exc}", stream_id) from exc
        if self._z.unconsumed_tail:
            raise SpdyProtocolError(f"header block larger than {MAX_HEADER_BLOCK} bytes", stream_id)
        return unpack_header_block(raw, stream_id)


class FrameEncoder:
    """Encodes frames that carry header blocks; owns the outbound compression context."""

    def __init__(self) -> None:
        self._compressor = HeaderCompressor()

    def syn_reply(self, stream_id: int, headers: Headers | None = None, fin: bool = False) -> bytes:
        block = self._compressor.compress(headers or {})
        return (_control_header(SYN_REPLY, FLAG_FIN if fin else 0, 4 + len(block))
                + struct.pack(">I", stream_id & MAX_STREAM_ID) + block)

    def syn_stream(self, stream_id: int, headers: Headers, *, associated_id: int = 0, priority: int = 0,
                   fin: bool = False, unidirectional: bool = False) -> bytes:
        block = self._compressor.compress(headers)
        flags = (FLAG_FIN if fin else 0) | (FLAG_UNIDIRECTIONAL if unidirectional else 0)
        return (_control_header(SYN_STREAM, flags, 10 + len(block))
                + struct.pack(">IIBB", stream_id & MAX_STREAM_ID, associated_id & MAX_STREAM_ID,
                              (priority & 0x7) << 5, 0) + block)

    def headers(self, stream_id: int, headers: Headers, fin: bool = False) -> bytes:
        block = self._compressor.compress(headers)
        return (_control_header(HEADERS, FLAG_FIN if fin else 0, 4 + len(block))
                + struct.pack(">I", stream_id & MAX_STREAM_ID) + block)


class FrameDecoder:
    """Turns (header, payload) into frames; owns the inbound decompression context."""

    def __init__(self) -> None:
        self._decompressor = HeaderDecompressor()

    def decode(self, head: FrameHeader, payload: bytes) -> Frame:
        if len(payload) != head.length:
            raise ValueError("payload length does not match the frame header")
        if not head.control:
            return DataFrame(head.stream_id, head.flags, payload)
        if head.version != VERSION:
            raise SpdyProtocolError(f"unsupported SPDY version {head.version}",
                                    status=RstStatus.UNSUPPORTED_VERSION)
        t, flags, p = head.frame_type, head.flags, payload
        if t == SYN_STREAM:
            self._need(p, 10, "SYN_STREAM")
            sid, assoc, pri, slot = struct.unpack(">IIBB", p[:10])
            sid &= MAX_STREAM_ID
            # The block must be inflated even if the stream is then refused: the zlib context is shared.
            headers = self._decompressor.decompress(p[10:], sid)
            if sid == 0:
                raise SpdyProtocolError("SYN_STREAM with stream id 0")
            return SynStreamFrame(sid, assoc & MAX_STREAM_ID, pri >> 5, slot, flags, headers)
        if t == SYN_REPLY:
            self._need(p, 4, "SYN_REPLY")
            sid = struct.unpack(">I", p[:4])[0] & MAX_STREAM_ID
            return SynReplyFrame(sid, flags, self._decompressor.decompress(p[4:], sid))
        if t == HEADERS:
            self._need(p, 4, "HEADERS")
            sid = struct.unpack(">I", p[:4])[0] & MAX_STREAM_ID
            return HeadersFrame(sid, flags, self._decompressor.decompress(p[4:], sid))
        if t == RST_STREAM:
            self._exact(p, 8, "RST_STREAM")
            sid, status = struct.unpack(">II", p)
            return RstStreamFrame(sid & MAX_STREAM_ID, status)
        if t == SETTINGS:
            self._need(p, 4, "SETTINGS")
            (n,) = struct.unpack(">I", p[:4])
            if len(p) != 4 + 8 * n:
                raise SpdyProtocolError(f"SETTINGS length {len(p)} does not fit {n} entries")
            entries = []
            for i in range(n):
                fid, value = struct.unpack(">II", p[4 + 8 * i:12 + 8 * i])
                entries.append((fid >> 24, fid & 0xFFFFFF, value))
            return SettingsFrame(flags, tuple(entries))
        if t == PING:
            self._exact(p, 4, "PING")
            return PingFrame(struct.unpack(">I", p)[0])
        if t == GOAWAY:
            # SPDY/2 had no status word; SPDY/3 always carries it.
            self._exact(p, 8, "GOAWAY")
            last, status = struct.unpack(">II", p)
            return GoAwayFrame(last & MAX_STREAM_ID, status)
        if t == WINDOW_UPDATE:
            self._exact(p, 8, "WINDOW_UPDATE")
            sid, delta = struct.unpack(">II", p)
            return WindowUpdateFrame(sid & MAX_STREAM_ID, delta & MAX_STREAM_ID)
        return UnknownControlFrame(head.version, t, flags, p)

    @staticmethod
    def _need(p: bytes, n: int, what: str) -> None:
        if len(p) < n:
            raise SpdyProtocolError(f"{what} frame too short ({len(p)} bytes)")

    @staticmethod
    def _exact(p: bytes, n: int, what: str) -> None:
        if len(p) != n:
            raise SpdyProtocolError(f"{what} frame must be {n} bytes, got {len(p)}")
