"""Timings of create's stages (namespaces, cgroups, seccomp, rootfs, hooks) for whoever asked for them.

A caller asks by creating an empty `<bundle>/.husk-stages` before `create` (husk-cri does); the runtime then
fills it with one line per stage: "<name> <start ns, wall clock> <duration ns>". Nobody asking costs one failed
open(2). The forked stages send theirs to the runtime process on the sync channel as "name:start:dur,...".
Owns only the format; no imports beyond `os` and `time` (create's hot path).
"""
from __future__ import annotations

import os
import time

FILE = ".husk-stages"

now = time.time_ns


def since(stages: list, name: str, start: int) -> None:
    """Records the stage `name` that began at `start` (a `now()` value) and ends now."""
    stages.append((name, start, time.time_ns() - start))


def encode(stages: list) -> str:
    return ",".join(f"{n}:{s}:{d}" for n, s, d in stages)


def decode(text: str) -> list:
    out = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def write(bundle: str, stages: list) -> None:
    """Fills `<bundle>/.husk-stages` if the caller created it; otherwise (nobody asked) does nothing."""
    try:
        fd = os.open(os.path.join(bundle, FILE), os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        os.write(fd, "".join(f"{n} {s} {d}\n" for n, s, d in stages).encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def read(bundle: str) -> list:
    """The stages written to `<bundle>/.husk-stages` ([] if the runtime wrote none). The file stays (it goes
    with the bundle; unlinking it would cost another journal write on a disk-backed state dir)."""
    try:
        with open(os.path.join(bundle, FILE)) as f:
            text = f.read()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def request(bundle: str) -> None:
    """Asks the next create in `bundle` for its stage timings (creates the empty file)."""
    fd = os.open(os.path.join(bundle, FILE), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    os.close(fd)
