"""Process names: what `ps`, `pgrep` and `/proc/<pid>/{comm,cmdline}` show for husk's long-lived processes.

`set_title("husk-shim <id>")` sets the comm (PR_SET_NAME: the first word, at most 15 bytes, what `pgrep -x`
and `ps -o comm` match) and the command line (`ps -o args`, `pgrep -f`, /proc/<pid>/cmdline), rewritten in
the original argv area found through /proc/self/stat (arg_start, arg_end, env_start, env_end):
- when the title fits there, its words become NUL-separated arguments (argv[0] "husk-shim", argv[1] the id);
- when it does not (husk-cri started as a bare `husk-cri`: its argv area, which every forked shim inherits, is
  shorter than "husk-shim " + a 64-character id), the title runs on into the environment strings, as
  setproctitle(3) does: the kernel then shows one string up to its NUL. libc's environ entries are first
  moved to copies on the heap (getenv keeps working); /proc/<pid>/environ then shows the title's tail.
  A title longer than both areas together is cut.

Hand-written with ctypes rather than the setproctitle package: ctypes is loaded in every shim anyway
(runtime/linux/syscalls.py), so this costs no import (setproctitle: ~15 ms and ~1.5 MB private per process,
and it sets comm to the whole title cut to 15 bytes, "husk-shim fffff", which `pgrep -x husk-shim` misses).
Only the calling thread's comm changes: call it before threads start.
"""
from __future__ import annotations

import ctypes

from runtime.linux import syscalls as sc


def _areas() -> tuple[int, int, int, int]:
    """(arg_start, arg_end, env_start, env_end): fields 48-51 of /proc/self/stat (Linux >= 3.5)."""
    with open("/proc/self/stat", "rb") as f:
        rest = f.read().rpartition(b")")[2].split()
    # rest[0] is field 3 (state): field N is rest[N - 3]
    return int(rest[45]), int(rest[46]), int(rest[47]), int(rest[48])


def set_title(title: str) -> None:
    """Sets comm to the first word of `title` (cut to 15 bytes) and the command line to `title`.

    Best effort: a process name is cosmetic, so failures (no /proc, a refused prctl) are ignored."""
    words = title.split()
    try:
        sc.set_name(words[0] if words else title)
    except OSError:
        pass
    try:
        arg_start, arg_end, env_start, env_end = _areas()
    except (OSError, ValueError, IndexError):
        return
    size = arg_end - arg_start
    if size <= 0:
        return
    argv = b"\0".join(w.encode() for w in words)
    if len(argv) < size:
        ctypes.memset(arg_start, 0, size)
        ctypes.memmove(arg_start, argv, len(argv))
        return
    line = " ".join(words).encode()
    if env_start == arg_end and env_end > env_start:   # the kernel reads past arg_end only into the environment
        try:
            sc.environ_to_heap(env_start, env_end)
        except (OSError, ValueError):
            env_end = env_start
        else:
            size = env_end - arg_start
    # the last byte of the argv area stays non-NUL when the line overflows it: /proc/<pid>/cmdline then reads on
    line = line[:size - 1]
    ctypes.memset(arg_start, 0, size)
    ctypes.memmove(arg_start, line, len(line))
