"""Kubernetes (CRI) container log writer: `<RFC3339Nano> <stdout|stderr> <P|F> <text>` records, one per line.

Owns line splitting (lines over 16 KiB become P records), the partial last line at end of stream, and
reopening the file after kubelet renames it. Single-threaded: each record is one os.write on an O_APPEND fd,
so records of the two streams never interleave inside a line.
"""
from __future__ import annotations

import os
import time
from shim.log import get as get_logger

log = get_logger(__name__)

MAX_LINE = 16 * 1024      # containerd's default max_container_log_line_size
STREAMS = ("stdout", "stderr")


def timestamp(ns: int | None = None) -> str:
    """RFC 3339 with nanoseconds in UTC, fixed width so that records sort as text."""
    if ns is None:
        ns = time.time_ns()
    sec, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{frac:09d}Z"


class CriLogWriter:
    def __init__(self, path: str, max_line: int = MAX_LINE) -> None:
        self.path = path
        self.max_line = max_line
        self._fd = -1
        self._partial: dict[str, bytearray] = {s: bytearray() for s in STREAMS}
        self.open()

    def open(self) -> None:
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)

    def reopen(self) -> None:
        """Opens `path` anew (kubelet renamed the old file); nothing buffered is lost."""
        old = self._fd
        self.open()
        if old >= 0:
            os.close(old)

    def write(self, stream: str, data: bytes) -> None:
        """Appends output of `stream`; complete lines become F records, over-long ones P records."""
        buf = self._partial[stream]
        buf += data
        out = bytearray()
        ts = timestamp().encode()
        head_p = ts + b" " + stream.encode() + b" P "
        head_f = ts + b" " + stream.encode() + b" F "
        start = 0
        n = len(buf)
        while start < n:
            nl = buf.find(b"\n", start, start + self.max_line + 1)
            if nl >= 0:
                line_end = nl
                if line_end > start and buf[line_end - 1] == 0x0D:   # strip \r of \r\n as containerd does
                    line_end -= 1
                out += head_f + buf[start:line_end] + b"\n"
                start = nl + 1
            elif n - start >= self.max_line:
                out += head_p + buf[start:start + self.max_line] + b"\n"
                start += self.max_line
            else:
                break
        del buf[:start]
        if out:
            self._write(out)

    def flush_partial(self, stream: str) -> None:
        """End of `stream`: a last line without a newline is written as a P record (it had no newline)."""
        buf = self._partial[stream]
        if buf:
            self._write(timestamp().encode() + b" " + stream.encode() + b" P " + bytes(buf) + b"\n")
            buf.clear()

    def _write(self, data: bytes | bytearray) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except InterruptedError:
                continue
            except OSError as err:
                # A full disk must not stop the container; the records are dropped and logged once.
                log.error("CRI log %s: write failed: %s", self.path, err)
                return
            view = view[n:]

    def close(self) -> None:
        for s in STREAMS:
            self.flush_partial(s)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
