"""Logging without paying for `import logging` on the hot path: the module is imported on first use.

Every record carries the container id (`extra={"container_id": ...}`), as the code rules ask.
"""
from __future__ import annotations


def _logger(name: str):  # noqa: ANN202 - logging.Logger, imported lazily on purpose
    import logging
    return logging.getLogger(name)


def warning(msg: str, *args: object, container_id: str = "", name: str = "husk") -> None:
    _logger(name).warning(msg, *args, extra={"container_id": container_id})


def debug(msg: str, *args: object, container_id: str = "", name: str = "husk") -> None:
    import sys
    if "logging" not in sys.modules:
        return  # nobody configured logging (no --debug): skip the import entirely
    _logger(name).debug(msg, *args, extra={"container_id": container_id})
