"""Applies an OCI `process.capabilities` object to the calling process (all five sets, ambient included).

Called in the container init and in exec'd processes just before the user switch and execve; it only
calls runtime.linux.syscalls.
"""
from __future__ import annotations

import errno
TYPE_CHECKING = False  # `typing` costs ~4 ms (it imports re): annotations only
if TYPE_CHECKING:
    from typing import Any

from runtime.config import CAP_NUMBER, known_cap_mask
from runtime.errors import SetupError
from runtime.linux import syscalls as sc


def drop_bounding(caps: dict[str, Any]) -> None:
    """Drops every capability not in `caps.bounding` from the bounding set (needs CAP_SETPCAP, so run first)."""
    keep = known_cap_mask(caps.get("bounding") or [])
    for n in range(sc.last_cap() + 1):
        if not keep & (1 << n) and sc.capbset_read(n):
            sc.capbset_drop(n)


def apply(caps: dict[str, Any]) -> None:
    """Sets effective/permitted/inheritable, then raises ambient (after the user switch, with keepcaps)."""
    eff = known_cap_mask(caps.get("effective") or [])
    perm = known_cap_mask(caps.get("permitted") or [])
    inh = known_cap_mask(caps.get("inheritable") or [])
    try:
        sc.capset(eff, perm, inh)
    except OSError as e:
        _, have_perm, _ = sc.capget()
        missing = [name for name, n in CAP_NUMBER.items() if (perm | eff) & (1 << n) and not have_perm & (1 << n)]
        hint = f" (not in this process's permitted/bounding set: {', '.join(missing)})" if missing else ""
        raise SetupError(f"capset: {e.strerror}{hint}") from None
    sc.ambient_clear_all()
    for name in caps.get("ambient") or []:
        n = CAP_NUMBER[name]
        if n > sc.last_cap():
            continue
        try:
            sc.ambient_raise(n)
        except OSError as e:
            # the kernel refuses ambient caps that are not both permitted and inheritable; runc ignores these
            if e.errno != errno.EPERM:
                raise SetupError(f"raise ambient capability {name}: {e.strerror}") from None
