"""OCI hooks: runs one kind's list with the container state JSON on stdin, each with its timeout.

Used by the runtime process (prestart, createRuntime, poststart, poststop) and by the init
(createContainer, startContainer). Uses fork/execve directly, not subprocess, to stay cheap in the init.
"""
from __future__ import annotations

import os
import select
import _signal as signal  # the C module: `signal` builds enums on import (~2 ms)
import time
TYPE_CHECKING = False  # `typing` costs ~4 ms (it imports re): annotations only
if TYPE_CHECKING:
    from typing import Any

from runtime import logutil
from runtime.errors import SetupError
from runtime.linux import syscalls as sc
OUTPUT_LIMIT = 64 * 1024


def run(kind: str, hooks: list[dict[str, Any]], state_json: str, *, container_id: str = "",
        keep_going: bool = False) -> None:
    """Runs every hook of `kind` in order. A failure raises SetupError naming the hook, unless `keep_going`
    (poststop: the spec says warn and continue), in which case it is logged and the next hook runs."""
    for i, h in enumerate(hooks):
        try:
            run_one(h, state_json)
        except SetupError as e:
            msg = f"{kind} hook #{i} ({h['path']}): {e}"
            if keep_going:
                logutil.warning("%s", msg, container_id=container_id, name="husk.hooks")
                continue
            raise SetupError(msg) from None


def run_one(hook: dict[str, Any], state_json: str) -> None:
    path = hook["path"]
    args = hook.get("args") or [path]
    env = hook.get("env") or []
    timeout = hook.get("timeout")
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the hook process
        try:
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            sc.close_range(3, 0xFFFFFFFF, 0)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            os.execve(path, args, dict(e.partition("=")[::2] for e in env))
        except OSError as e:
            os.write(2, f"exec {path}: {e.strerror}".encode())
        os._exit(127)
    os.close(in_r)
    os.close(out_w)
    output = b""
    try:
        data = state_json.encode()
        try:
            os.write(in_w, data) if len(data) < 65536 else _write_all(in_w, data)
        except BrokenPipeError:
            pass  # a hook may ignore its stdin
        os.close(in_w)
        in_w = -1
        deadline = time.monotonic() + timeout if timeout else None
        pidfd = sc.pidfd_open(pid)
        try:
            exited = False
            out_open = True
            while not exited:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                if wait == 0.0:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    raise SetupError(f"timed out after {timeout}s" + _fmt(output))
                fds = [pidfd] + ([out_r] if out_open else [])
                ready, _, _ = select.select(fds, [], [], wait)
                if out_r in ready:
                    chunk = os.read(out_r, 65536)
                    if not chunk:
                        out_open = False
                    elif len(output) < OUTPUT_LIMIT:
                        output += chunk
                if pidfd in ready:
                    exited = True
        finally:
            os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        if out_open:
            # drain what the hook wrote before exiting (its children may keep the pipe open: don't wait)
            os.set_blocking(out_r, False)
            try:
                output += os.read(out_r, OUTPUT_LIMIT)
            except BlockingIOError:
                pass
    finally:
        if in_w >= 0:
            os.close(in_w)
        os.close(out_r)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        why = f"exit status {code}" if code > 0 else f"killed by signal {-code}"
        raise SetupError(why + _fmt(output))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fmt(output: bytes) -> str:
    text = output.decode(errors="replace").strip()
    return f", output: {text}" if text else ""
