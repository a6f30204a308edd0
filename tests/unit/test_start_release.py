"""`start` releases the init through the exec fifo; a program that runs and is reaped at once is still a
successful start (found as a flaky drop-in test under containerd: "the container init is gone")."""
from __future__ import annotations

import os
import subprocess
import threading

from runtime import lifecycle, state as st


def test_start_does_not_lose_a_program_that_exits_at_once(tmp_path, monkeypatch) -> None:
    fifo = tmp_path / "exec.fifo"
    os.mkfifo(fifo)
    init = subprocess.Popen(["sleep", "30"])
    try:
        stat = st.proc_stat(init.pid)
        rec = st.Record(id="c1", pid=init.pid, pid_start=stat[1], bundle="/b", rootfs="/b/rootfs", created="",
                        cgroup_path="/x", config={})

        def init_side() -> None:  # what the blocked init does once start opens the fifo: "0", then execve
            fd = os.open(fifo, os.O_WRONLY)
            os.write(fd, b"0")
            os.close(fd)
        t = threading.Thread(target=init_side)
        t.start()
        opened = []
        real_open, real_pidfd_open = os.open, os.pidfd_open

        def tracking_open(path, flags, *a):
            if str(path) == str(fifo):
                opened.append(path)
            return real_open(path, flags, *a)

        def pidfd_open(pid, *a):
            # a program that exits at once is reaped by the subreaper right after the fifo opens
            if opened:
                raise ProcessLookupError(3, "No such process")
            return real_pidfd_open(pid, *a)
        monkeypatch.setattr(os, "open", tracking_open)
        monkeypatch.setattr(os, "pidfd_open", pidfd_open)
        assert lifecycle._release(str(fifo), rec) is None
        t.join(10)
    finally:
        init.kill()
        init.wait()
