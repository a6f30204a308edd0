"""The shim's logger: the few calls of `logging` the shim uses, writing one line per record to stderr.

The stdlib `logging` package costs ~2 MB of private memory per process (it pulls in re, threading,
traceback, string); every container has a shim, so the daemon path uses this instead. Records carry the
container id through the prefix set by setup().
"""
from __future__ import annotations

import os
import sys
import time

DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40
_NAMES = {DEBUG: "DEBUG", INFO: "INFO", WARNING: "WARNING", ERROR: "ERROR"}
_state = {"level": INFO, "prefix": "husk-shim"}


def setup(container_id: str, debug: bool = False) -> None:
    _state["level"] = DEBUG if debug else INFO
    _state["prefix"] = f"husk-shim[{os.getpid()}] {container_id}"


class Logger:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def _emit(self, level: int, msg: str, args: tuple, exc: bool = False) -> None:
        if level < _state["level"]:
            return
        if args:
            try:
                msg = msg % args
            except (TypeError, ValueError):
                msg = f"{msg} {args!r}"
        t = time.time()
        line = (f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t))}.{int(t % 1 * 1000):03d}Z "
                f"{_NAMES[level]} {_state['prefix']}: {msg}\n")
        if exc and sys.exc_info()[0] is not None:
            import traceback
            line += traceback.format_exc()
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass

    def debug(self, msg: str, *args: object) -> None:
        self._emit(DEBUG, msg, args)

    def info(self, msg: str, *args: object) -> None:
        self._emit(INFO, msg, args)

    def warning(self, msg: str, *args: object) -> None:
        self._emit(WARNING, msg, args)

    def error(self, msg: str, *args: object) -> None:
        self._emit(ERROR, msg, args)

    def exception(self, msg: str, *args: object) -> None:
        self._emit(ERROR, msg, args, exc=True)


def get(name: str) -> Logger:
    return Logger(name)
