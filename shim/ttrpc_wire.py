"""ttrpc framing: the 10-byte frame header, message types and flags, status codes and the error type.

Shared by the shim's server and the clients; pure functions over bytes, no sockets and no threads.
"""
from __future__ import annotations

import struct

HEADER = struct.Struct(">IIBB")      # data length, stream id, message type, flags
HEADER_SIZE = HEADER.size           # 10
MAX_MESSAGE = 4 << 20               # ttrpc's default message size limit (4 MiB)

TYPE_REQUEST = 0x01
TYPE_RESPONSE = 0x02
TYPE_DATA = 0x03

FLAG_REMOTE_CLOSED = 0x01
FLAG_REMOTE_OPEN = 0x02
FLAG_NO_DATA = 0x04

# google.rpc.Code values, as ttrpc's status carries them.
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16

CODE_NAMES = {OK: "OK", CANCELLED: "Canceled", UNKNOWN: "Unknown", INVALID_ARGUMENT: "InvalidArgument",
              DEADLINE_EXCEEDED: "DeadlineExceeded", NOT_FOUND: "NotFound", ALREADY_EXISTS: "AlreadyExists",
              PERMISSION_DENIED: "PermissionDenied", RESOURCE_EXHAUSTED: "ResourceExhausted",
              FAILED_PRECONDITION: "FailedPrecondition", ABORTED: "Aborted", OUT_OF_RANGE: "OutOfRange",
              UNIMPLEMENTED: "Unimplemented", INTERNAL: "Internal", UNAVAILABLE: "Unavailable",
              DATA_LOSS: "DataLoss", UNAUTHENTICATED: "Unauthenticated"}

# containerd's ttrpc clients send the namespace as this metadata key.
NAMESPACE_KEY = "containerd-namespace-ttrpc"


class TtrpcError(Exception):
    """A non-OK ttrpc status: raised by handlers to answer with `code`, raised by clients on such answers."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{CODE_NAMES.get(code, code)}: {message}")
        self.code = code
        self.message = message


class FrameError(Exception):
    """The byte stream cannot be framed any more (the connection must be closed)."""


def pack_header(length: int, stream_id: int, mtype: int, flags: int = 0) -> bytes:
    return HEADER.pack(length, stream_id, mtype, flags)


def frame(stream_id: int, mtype: int, payload: bytes, flags: int = 0) -> bytes:
    return HEADER.pack(len(payload), stream_id, mtype, flags) + payload


class FrameReader:
    """Incremental frame parser. feed() bytes, then frames() yields (stream_id, type, flags, payload | None).

    A payload of None means the frame was larger than `max_message`: its bytes were skipped (ttrpc answers
    such a request with RESOURCE_EXHAUSTED and keeps the connection).
    """

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self.max_message = max_message
        self._buf = bytearray()
        self._skip = 0                      # bytes of an oversize frame still to drop
        self._pending: tuple[int, int, int, int] | None = None

    def feed(self, data: bytes) -> None:
        self._buf += data

    def frames(self):  # -> Iterator[tuple[int, int, int, bytes | None]]
        buf = self._buf
        while True:
            if self._skip:
                n = min(self._skip, len(buf))
                del buf[:n]
                self._skip -= n
                if self._skip:
                    return
                assert self._pending is not None
                sid, mtype, flags, _ = self._pending
                self._pending = None
                yield sid, mtype, flags, None
                continue
            if len(buf) < HEADER_SIZE:
                return
            length, sid, mtype, flags = HEADER.unpack_from(buf, 0)
            if length > self.max_message:
                del buf[:HEADER_SIZE]
                self._skip = length
                self._pending = (sid, mtype, flags, length)
                continue
            if len(buf) < HEADER_SIZE + length:
                return
            payload = bytes(buf[HEADER_SIZE:HEADER_SIZE + length])
            del buf[:HEADER_SIZE + length]
            yield sid, mtype, flags, payload

    @property
    def buffered(self) -> int:
        return len(self._buf)
