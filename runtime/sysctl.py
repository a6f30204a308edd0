"""linux.sysctl: writing the container's namespaced kernel parameters under /proc/sys.

Runs in the container init after pivot_root (the /proc it writes to is the container's). It does not judge
which keys are namespaced: the kernel refuses the others and the error names the key.
"""
from __future__ import annotations

from runtime.errors import SetupError


def write(key: str, value: str) -> None:
    """Sets `key` (dotted, as linux.sysctl spells it) to `value`."""
    path = "/proc/sys/" + key.replace(".", "/")
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as e:
        raise SetupError(f"linux.sysctl.{key}: write {path}: {e.strerror}") from None
