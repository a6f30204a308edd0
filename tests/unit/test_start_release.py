"""`start` releases the init through the start socket; a program that runs and is reaped at once is still a
successful start (found as a flaky drop-in test under containerd: "the container init is gone")."""
from __future__ import annotations

import os
import subprocess
import threading

from runtime import lifecycle, state as st, sync


def test_start_does_not_lose_a_program_that_exits_at_once(tmp_path, monkeypatch) -> None:
    sock = tmp_path / "exec.sock"
    listen_fd = sync.start_listener(str(sock))
    init = subprocess.Popen(["sleep", "30"])
    try:
        stat = st.proc_stat(init.pid)
        rec = st.Record(id="c1", pid=init.pid, pid_start=stat[1], bundle="/b", rootfs="/b/rootfs", created="",
                        cgroup_path="/x", config={})

        def init_side() -> None:  # what the blocked init does once start connects: "0", then execve
            fd = sync.start_accept(listen_fd)
            os.write(fd, b"0")
            os.close(fd)
        t = threading.Thread(target=init_side)
        t.start()
        opened = []
        real_connect, real_pidfd_open = sync.start_connect, os.pidfd_open

        def tracking_connect(path):
            opened.append(path)
            return real_connect(path)

        def pidfd_open(pid, *a):
            # a program that exits at once is reaped by the subreaper right after start connects
            if opened:
                raise ProcessLookupError(3, "No such process")
            return real_pidfd_open(pid, *a)
        monkeypatch.setattr(sync, "start_connect", tracking_connect)
        monkeypatch.setattr(os, "pidfd_open", pidfd_open)
        assert lifecycle._release(str(sock), rec) is None
        t.join(10)
    finally:
        init.kill()
        init.wait()


def test_start_socket_cannot_be_opened_or_connected_through_proc(tmp_path) -> None:
    """What the container could reach of its waiting init with CAP_SYS_PTRACE: /proc/<init>/fd/N. A fifo there
    opens (and releases the init); the listening socket neither opens nor accepts a connection by that path."""
    import errno
    import socket
    listen_fd = sync.start_listener(str(tmp_path / "exec.sock"))
    try:
        path = f"/proc/self/fd/{listen_fd}"
        for flags in (os.O_RDONLY, os.O_WRONLY, os.O_RDWR):
            try:
                os.close(os.open(path, flags | os.O_NONBLOCK))
                raise AssertionError(f"opened {path} with flags {flags:#x}")
            except OSError as e:
                assert e.errno == errno.ENXIO, e
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(path)
                raise AssertionError(f"connected to {path}")
            except OSError as e:
                assert e.errno in (errno.ECONNREFUSED, errno.ENOENT), e
        assert (os.stat(tmp_path / "exec.sock").st_mode & 0o777) == 0o600
    finally:
        os.close(listen_fd)


def test_start_socket_reached_through_a_long_state_dir(tmp_path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "exec.sock")
    assert len(path) > 108
    listen_fd = sync.start_listener(path)
    try:
        conn = sync.start_connect(path)
        got = sync.start_accept(listen_fd)
        os.write(got, b"0")
        assert os.read(conn, 10) == b"0"
        os.close(got)
        assert os.read(conn, 10) == b""
        os.close(conn)
    finally:
        try:
            os.close(listen_fd)
        except OSError:
            pass  # start_accept closed it


def test_a_container_created_by_an_older_husk_still_starts(tmp_path) -> None:
    """An older husk's init blocks opening exec.fifo for writing. After an upgrade, `status` must still say
    created (not running) and `start` must release it by opening the fifo, not refuse it."""
    cdir = tmp_path / "c1"
    cdir.mkdir()
    fifo = cdir / st.LEGACY_FIFO
    os.mkfifo(fifo, 0o600)
    # the old init: open for writing (blocks until start opens for reading), "0", close, then its program runs
    init = subprocess.Popen(["sh", "-c", f'printf 0 > "{fifo}"; exec sleep 30'])
    try:
        stat = st.proc_stat(init.pid)
        rec = st.Record(id="c1", pid=init.pid, pid_start=stat[1], bundle="/b", rootfs="/b/rootfs", created="",
                        cgroup_path="/x", config={})
        st.save(str(cdir), rec)
        assert st.status(str(tmp_path), rec) == "created"
        lifecycle.start(str(tmp_path), "c1")
        assert not fifo.exists()
        assert st.status(str(tmp_path), rec) == "running"
    finally:
        init.kill()
        init.wait()
