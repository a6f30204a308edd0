"""The oom_score_adj clamp (containerd's restrict_oom_score_adj) for hosts without CAP_SYS_RESOURCE.

Without CAP_SYS_RESOURCE nobody may lower oom_score_adj below its current value, and kubelet asks for
-997/-998 for sandboxes. This module decides the lowest value allowed and clamps; it changes nothing itself.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)

CAP_SYS_RESOURCE = 24
OOM_SCORE_ADJ_MIN = -1000
OOM_SCORE_ADJ_MAX = 1000


def _read_own_score() -> int:
    with open("/proc/self/oom_score_adj") as f:
        return int(f.read().strip())


def _has_sys_resource() -> bool:
    """True when this process could raise CAP_SYS_RESOURCE for its children (bounding and effective set)."""
    from runtime.linux import syscalls
    effective, _, _ = syscalls.capget()
    return syscalls.capbset_read(CAP_SYS_RESOURCE) and bool(effective >> CAP_SYS_RESOURCE & 1)


@dataclass(frozen=True)
class OomScorePolicy:
    """`minimum` is the lowest oom_score_adj a container may get (-1000 when unrestricted)."""
    minimum: int
    reason: str = ""

    def clamp(self, value: int, object_id: str = "") -> int:
        value = max(OOM_SCORE_ADJ_MIN, min(OOM_SCORE_ADJ_MAX, value))
        if value >= self.minimum:
            return value
        _log_clamp_once(self, value, object_id)
        return self.minimum


_logged: set[int] = set()


def _log_clamp_once(policy: OomScorePolicy, value: int, object_id: str) -> None:
    if policy.minimum in _logged:
        return
    _logged.add(policy.minimum)
    log.warning("oom_score_adj clamped to %d (%s); further clamps are not logged", policy.minimum,
                policy.reason, extra={"requested": value, "id": object_id})


def detect(mode: str = "auto", *, read_score: Callable[[], int] = _read_own_score,
           has_sys_resource: Callable[[], bool] = _has_sys_resource) -> OomScorePolicy:
    """mode: "auto" restricts only when CAP_SYS_RESOURCE is missing; "true" always; "false" never."""
    if mode == "false":
        return OomScorePolicy(OOM_SCORE_ADJ_MIN)
    if mode == "true":
        return OomScorePolicy(read_score(), "runtime.restrict_oom_score_adj = true")
    if mode != "auto":
        raise ValueError(f"restrict_oom_score_adj: unknown mode {mode!r}")
    if has_sys_resource():
        return OomScorePolicy(OOM_SCORE_ADJ_MIN)
    score = read_score()
    return OomScorePolicy(score, f"CAP_SYS_RESOURCE is not in the bounding set: cannot go below husk-cri's "
                                 f"own oom_score_adj {score}")
