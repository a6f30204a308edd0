"""Log records in runc's formats (logrus text or JSON lines), and logging without paying for `import logging`.

The CLI calls `configure` with the global --log/--log-format/--debug flags; records then go where runc puts
them: the --log file if given, else stderr. Library callers (the shim's in-process driver) never configure it,
and their records go through the stdlib `logging` module instead. Every record carries the container id.
"""
from __future__ import annotations

import os
import sys

LEVELS = ("debug", "info", "warning", "error", "fatal")
_TEXT_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._/@^+")


class Sink:
    """Where the CLI's records go: `path` (the --log file) or stderr; `fmt` is "text" or "json"."""
    __slots__ = ("path", "fmt", "debug", "started")

    def __init__(self, path: str | None, fmt: str = "text", debug: bool = False) -> None:
        self.path = path
        self.fmt = fmt
        self.debug = debug
        import time
        self.started = time.monotonic()


_sink: Sink | None = None


def configure(path: str | None, fmt: str = "text", debug: bool = False) -> Sink:
    global _sink
    _sink = Sink(path, fmt, debug)
    return _sink


def sink() -> Sink | None:
    return _sink


def timestamp(t: float | None = None) -> str:
    """RFC 3339 in local time to the second, as logrus prints it ("2006-01-02T15:04:05Z07:00")."""
    import time
    now = time.time() if t is None else t
    lt = time.localtime(now)
    off = lt.tm_gmtoff or 0
    if off == 0:
        zone = "Z"
    else:
        sign = "+" if off > 0 else "-"
        zone = f"{sign}{abs(off) // 3600:02d}:{abs(off) % 3600 // 60:02d}"
    return time.strftime("%Y-%m-%dT%H:%M:%S", lt) + zone


def _quote(s: str) -> str:
    """logrus quotes a text-format value unless every character is in its safe set."""
    if s and all(ch in _TEXT_SAFE for ch in s):
        return s
    from runtime.state import dumps_json
    return dumps_json(s)


def format_record(level: str, msg: str, fmt: str, t: float | None = None, fields: dict[str, str] | None = None) -> str:
    """One record without the newline. JSON keys are sorted and <, >, & are escaped, as Go's encoder does."""
    ts = timestamp(t)
    if fmt == "json":
        from runtime.state import dumps_json
        rec = dict(fields or {})
        rec.update(level=level, msg=msg, time=ts)
        out = dumps_json({k: rec[k] for k in sorted(rec)})
        return out.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    parts = [f"time={_quote(ts)}", f"level={level}", f"msg={_quote(msg)}"]
    parts += [f"{k}={_quote(v)}" for k, v in sorted((fields or {}).items())]
    return " ".join(parts)


def emit(level: str, msg: str) -> None:
    """Writes one record to the configured sink (the --log file, else stderr). Never raises."""
    s = _sink
    if s is None:
        return
    if s.path:
        line = format_record(level, msg, s.fmt)
        try:
            # O_SYNC as runc: containerd reads the file right after the runtime exits
            fd = os.open(s.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_SYNC, 0o644)
            try:
                os.write(fd, (line + "\n").encode(errors="replace"))
            finally:
                os.close(fd)
        except OSError:
            pass
        return
    if s.fmt == "text" and _isatty(2):
        # logrus on a terminal: "ERRO[0003] message" (seconds since start)
        import time
        line = f"{level[:4].upper()}[{int(time.monotonic() - s.started):04d}] {msg}"
    else:
        line = format_record(level, msg, s.fmt)
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def error(msg: str) -> None:
    """A command's final error, as runc reports it: a record to the sink and, when the sink is a --log file,
    the bare message on stderr too (podman reads stderr, containerd the file)."""
    s = _sink
    if s is None:
        try:
            sys.stderr.write(f"husk: {msg}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        return
    emit("error", msg)
    if s.path:
        try:
            sys.stderr.write(msg + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def _logger(name: str):  # noqa: ANN202 - logging.Logger, imported lazily on purpose
    import logging
    return logging.getLogger(name)


def warning(msg: str, *args: object, container_id: str = "", name: str = "husk") -> None:
    if _sink is not None:
        emit("warning", (msg % args) if args else msg)
        return
    _logger(name).warning(msg, *args, extra={"container_id": container_id})


def debug(msg: str, *args: object, container_id: str = "", name: str = "husk") -> None:
    if _sink is not None:
        if _sink.debug:
            emit("debug", (msg % args) if args else msg)
        return
    if "logging" not in sys.modules:
        return  # nobody configured logging: skip the import entirely
    _logger(name).debug(msg, *args, extra={"container_id": container_id})


class Logger:
    """`log = Logger(__name__)` for library modules: `log.warning`/`log.debug` go through warning()/debug() above,
    so `import logging` waits for the first record. (The shims' spawner imports the cgroup modules; with
    logging imported there, its at-fork hook and threading's ran in every shim: ~0.15 MB private each.)"""
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def warning(self, msg: str, *args: object) -> None:
        warning(msg, *args, name=self.name)

    def debug(self, msg: str, *args: object) -> None:
        debug(msg, *args, name=self.name)


def install_logging_handler() -> None:
    """--debug: routes records of modules that use the stdlib `logging` directly through the sink too."""
    import logging

    class _ToSink(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            level = {"WARNING": "warning", "CRITICAL": "fatal"}.get(record.levelname, record.levelname.lower())
            emit(level if level in LEVELS else "info", record.getMessage())

    root = logging.getLogger()
    root.handlers[:] = [_ToSink()]
    root.setLevel(logging.DEBUG)
