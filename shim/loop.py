"""The shim's single-threaded event loop: fd readiness (selectors/epoll), timers and POSIX signals.

Owns dispatch only; it knows nothing about ttrpc or containers. No threads and no asyncio (the shim
forks for the in-process runtime path, and asyncio costs ~6 MB per shim).
"""
from __future__ import annotations

# typing costs ~1.7 MB per process; it is needed by type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

import heapq
import os
import selectors
import signal
import time
from shim.log import get as get_logger

log = get_logger(__name__)

READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE


class Loop:
    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._handlers: dict[int, dict[int, Callable[[], None]]] = {}
        self._signal_handlers: dict[int, Callable[[], None]] = {}
        self._sig_r = -1
        self.running = False

    # --- fds -----------------------------------------------------------------------------
    def add_reader(self, fd: int, cb: Callable[[], None]) -> None:
        self._set(fd, READ, cb)

    def add_writer(self, fd: int, cb: Callable[[], None]) -> None:
        self._set(fd, WRITE, cb)

    def remove_reader(self, fd: int) -> None:
        self._unset(fd, READ)

    def remove_writer(self, fd: int) -> None:
        self._unset(fd, WRITE)

    def remove(self, fd: int) -> None:
        if fd in self._handlers:
            del self._handlers[fd]
            self._sel.unregister(fd)

    def _set(self, fd: int, ev: int, cb: Callable[[], None]) -> None:
        cur = self._handlers.get(fd)
        if cur is None:
            self._handlers[fd] = {ev: cb}
            self._sel.register(fd, ev)
        else:
            cur[ev] = cb
            self._sel.modify(fd, _mask(cur))

    def _unset(self, fd: int, ev: int) -> None:
        cur = self._handlers.get(fd)
        if cur is None or ev not in cur:
            return
        del cur[ev]
        if cur:
            self._sel.modify(fd, _mask(cur))
        else:
            del self._handlers[fd]
            self._sel.unregister(fd)

    # --- timers --------------------------------------------------------------------------
    def call_later(self, delay: float, cb: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (time.monotonic() + delay, self._seq, cb))

    # --- signals -------------------------------------------------------------------------
    def add_signal(self, signum: int, cb: Callable[[], None]) -> None:
        """Runs `cb` from the loop (not from the signal handler) after `signum` arrives."""
        if self._sig_r < 0:
            r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._sig_r = r
            signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            self.add_reader(r, self._on_signal_fd)
        self._signal_handlers[signum] = cb
        # A Python-level handler must exist for the wakeup fd to be written; the work happens in the loop.
        signal.signal(signum, _noop_handler)

    def _on_signal_fd(self) -> None:
        try:
            data = os.read(self._sig_r, 512)
        except BlockingIOError:
            return
        for signum in dict.fromkeys(data):
            cb = self._signal_handlers.get(signum)
            if cb is not None:
                cb()

    # --- running -------------------------------------------------------------------------
    def run(self) -> None:
        self.running = True
        while self.running:
            self.run_once()

    def stop(self) -> None:
        self.running = False

    def run_once(self, max_wait: float | None = None) -> None:
        timeout = max_wait
        if self._timers:
            delay = max(0.0, self._timers[0][0] - time.monotonic())
            timeout = delay if timeout is None else min(timeout, delay)
        for key, ev in self._sel.select(timeout):
            handlers = self._handlers.get(key.fd)
            if handlers is None:
                continue
            # Read before write: a peer that closed is noticed before we try to write to it.
            for bit in (READ, WRITE):
                if ev & bit:
                    cb = handlers.get(bit)
                    if cb is not None and self._handlers.get(key.fd) is handlers:
                        self._guard(cb)
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, cb = heapq.heappop(self._timers)
            self._guard(cb)

    @staticmethod
    def _guard(cb: Callable[[], None]) -> None:
        try:
            cb()
        except Exception:  # the loop must outlive any one handler's bug
            log.exception("loop callback %r failed", cb)

    def close(self) -> None:
        self._sel.close()


def _mask(handlers: dict[int, Callable[[], None]]) -> int:
    m = 0
    for ev in handlers:
        m |= ev
    return m


def _noop_handler(signum: int, frame: object) -> None:
    return None
