"""Structured logging for husk-cri: one JSON object (or one text line) per record on stderr.

Records carry ids through `extra` (pod_id, container_id, rpc, ...); this module only formats them and
must not decide what is logged.
"""
from __future__ import annotations

import json
import logging
import sys
import time

# Attributes every LogRecord has; anything else came from `extra` and is printed as a field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                    + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = (f"{time.strftime('%H:%M:%S', time.localtime(record.created))}.{int(record.msecs):03d} "
                f"{record.levelname.lower():7} {record.name}: {record.getMessage()}"
                + (f" {extra}" if extra else ""))
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


# The level names husk-cri takes: Python's, plus the spellings containerd and CRI-O configs use.
LEVELS = {"trace": "DEBUG", "debug": "DEBUG", "info": "INFO", "warn": "WARNING", "warning": "WARNING",
          "error": "ERROR", "fatal": "CRITICAL", "panic": "CRITICAL"}


def setup(level: str, fmt: str = "json", stream: object = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(LEVELS[level.lower()])
