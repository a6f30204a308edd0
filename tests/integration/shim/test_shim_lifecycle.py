"""husk-shim driven over ttrpc by the project's client: lifecycle, stdio, exec, exits, errors (root)."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from shim import exitfile
from shim import ttrpc_wire as w
from shim.attach import AttachClient
from shim.pb import google, task_types
from tests.shim_fixtures import cleanup_shim, lifecycle_runtimes, make_bundle, runtime_id, start_shim, unique, wait_for

pytestmark = pytest.mark.root
S = task_types.Status


@pytest.fixture(params=lifecycle_runtimes(), ids=runtime_id)
def runtime(request):
    return request.param


@pytest.fixture
def shim(tmp_path, runtime):
    s = start_shim(str(tmp_path), runtime)
    yield s
    cleanup_shim(s)


def proc_spec(args, terminal=False):
    return google.Any(type_url="types.containerd.io/opencontainers/runtime-spec/1/Process",
                      value=json.dumps({"args": args, "cwd": "/", "env": ["PATH=/bin"], "terminal": terminal,
                                        "user": {"uid": 0, "gid": 0}}).encode())


def test_create_start_wait_delete_shutdown(tmp_path, shim):
    out = tmp_path / "out.txt"
    bundle = make_bundle(str(tmp_path), shim.cid, ["sh", "-c", "echo hello; echo oops >&2; exit 3"])
    with shim.client() as c:
        pid = c.Create(id=shim.cid, bundle=bundle, stdout=f"file://{out}", stderr=f"file://{out}").pid
        assert pid > 0
        st = c.State(id=shim.cid)
        assert st.status == S.CREATED and st.pid == pid and st.bundle == bundle
        assert c.Connect(id=shim.cid).task_pid == pid
        assert c.Start(id=shim.cid).pid == pid
        r = c.Wait(id=shim.cid, timeout=30)
        assert r.exit_status == 3 and r.exited_at.seconds > 0
        st = c.State(id=shim.cid)
        assert st.status == S.STOPPED and st.exit_status == 3
        rec = exitfile.read(shim.state_dir)
        assert rec is not None and rec.exit_status == 3 and rec.pid == pid
        # Wait after the exit answers at once, to every waiter
        assert c.Wait(id=shim.cid).exit_status == 3
        d = c.Delete(id=shim.cid)
        assert (d.pid, d.exit_status) == (pid, 3)
        # the task is gone once deleted, as containerd-shim-runc-v2 answers
        for call in (lambda: c.State(id=shim.cid), lambda: c.Delete(id=shim.cid), lambda: c.Pids(id=shim.cid)):
            with pytest.raises(w.TtrpcError) as e:
                call()
            assert e.value.code == w.NOT_FOUND
        c.Shutdown(id=shim.cid)
    shim.proc.wait(10)
    assert shim.proc.returncode == 0
    assert sorted(out.read_text().split()) == ["hello", "oops"]
    assert not os.path.exists(shim.address)
    assert not os.path.exists(shim.state_dir), os.listdir(shim.state_dir)


def test_kill_and_signal_exit_status(tmp_path, shim):
    bundle = make_bundle(str(tmp_path), shim.cid, ["sleep", "1000"])
    with shim.client() as c:
        c.Create(id=shim.cid, bundle=bundle)
        c.Start(id=shim.cid)
        assert c.State(id=shim.cid).status == S.RUNNING
        c.Kill(id=shim.cid, signal=signal.SIGKILL)
        assert c.Wait(id=shim.cid, timeout=30).exit_status == 137
        with pytest.raises(w.TtrpcError) as e:
            c.Kill(id=shim.cid, signal=signal.SIGKILL)
        assert e.value.code == w.NOT_FOUND
        c.Delete(id=shim.cid)


def test_exec_with_attach_and_exit(tmp_path, shim):
    bundle = make_bundle(str(tmp_path), shim.cid, ["sleep", "1000"])
    with shim.client() as c:
        c.Create(id=shim.cid, bundle=bundle)
        c.Start(id=shim.cid)
        c.Exec(id=shim.cid, exec_id="e1", stdin="attach:", stdout="attach:", stderr="attach:",
               spec=proc_spec(["sh", "-c", "read x; echo got-$x; echo err >&2; exit 7"]))
        with pytest.raises(w.TtrpcError) as e:
            c.Exec(id=shim.cid, exec_id="e1", spec=proc_spec(["true"]))
        assert e.value.code == w.ALREADY_EXISTS
        assert c.State(id=shim.cid, exec_id="e1").status == S.CREATED
        path = c.AttachInfo(id=shim.cid, exec_id="e1").path
        a = AttachClient(path)
        epid = c.Start(id=shim.cid, exec_id="e1").pid
        assert epid > 0
        pids = [p.pid for p in c.Pids(id=shim.cid).processes]
        assert epid in pids or c.State(id=shim.cid, exec_id="e1").status == S.STOPPED
        a.write_stdin(b"abc\n")
        out, err, status = a.read_all()
        a.close()
        assert out == b"got-abc\n" and err == b"err\n" and status == 7
        assert c.Wait(id=shim.cid, exec_id="e1", timeout=30).exit_status == 7
        assert exitfile.read(shim.state_dir, "e1").exit_status == 7
        c.Delete(id=shim.cid, exec_id="e1")
        with pytest.raises(w.TtrpcError) as e:
            c.State(id=shim.cid, exec_id="e1")
        assert e.value.code == w.NOT_FOUND
        c.Kill(id=shim.cid, signal=9)
        c.Wait(id=shim.cid, timeout=30)
        c.Delete(id=shim.cid)


def test_exec_kill_and_fifo_stdio(tmp_path, shim):
    bundle = make_bundle(str(tmp_path), shim.cid, ["sleep", "1000"])
    fin, fout = str(tmp_path / "in"), str(tmp_path / "out")
    os.mkfifo(fin)
    os.mkfifo(fout)
    rfd = os.open(fout, os.O_RDONLY | os.O_NONBLOCK)
    wfd = os.open(fin, os.O_RDWR)
    with shim.client() as c:
        c.Create(id=shim.cid, bundle=bundle)
        c.Start(id=shim.cid)
        c.Exec(id=shim.cid, exec_id="cat", stdin=fin, stdout=fout, spec=proc_spec(["cat"]))
        c.Start(id=shim.cid, exec_id="cat")
        os.write(wfd, b"through the fifo\n")
        got = wait_for(lambda: _read_nb(rfd), what="fifo output")
        assert got == b"through the fifo\n"
        c.CloseIO(id=shim.cid, exec_id="cat", stdin=True)
        assert c.Wait(id=shim.cid, exec_id="cat", timeout=30).exit_status == 0
        c.Exec(id=shim.cid, exec_id="sl", spec=proc_spec(["sleep", "1000"]))
        c.Start(id=shim.cid, exec_id="sl")
        c.Kill(id=shim.cid, exec_id="sl", signal=15)
        assert c.Wait(id=shim.cid, exec_id="sl", timeout=30).exit_status == 128 + 15
        c.Kill(id=shim.cid, signal=9)
        c.Wait(id=shim.cid, timeout=30)
        c.Delete(id=shim.cid)
    os.close(rfd)
    os.close(wfd)


def _unread(fd: int) -> int:
    """Bytes waiting in the pipe or fifo `fd` reads from (FIONREAD)."""
    import fcntl
    import termios
    buf = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return int.from_bytes(buf, "little")


def _read_nb(fd):
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


def test_pause_resume_stats_update(tmp_path, shim):
    bundle = make_bundle(str(tmp_path), shim.cid, ["sleep", "1000"])
    with shim.client() as c:
        c.Create(id=shim.cid, bundle=bundle)
        c.Start(id=shim.cid)
        c.Pause(id=shim.cid)
        assert c.State(id=shim.cid).status == S.PAUSED
        c.Resume(id=shim.cid)
        assert c.State(id=shim.cid).status == S.RUNNING
        from shim.pb import cgroups_v1
        st = c.Stats(id=shim.cid).stats
        assert st.type_url == "io.containerd.cgroups.v1.Metrics"
        m = cgroups_v1.Metrics.decode(st.value)
        assert m.pids.current >= 1 and m.memory.usage.usage > 0
        # both drivers: runc through its command line, husk in-process through runtime.lifecycle.update
        limit = 64 << 20
        c.Update(id=shim.cid, resources=google.Any(
            type_url="types.containerd.io/opencontainers/runtime-spec/1/LinuxResources",
            value=json.dumps({"memory": {"limit": limit}, "pids": {"limit": 42}, "cpu": {"shares": 0}}).encode()))
        m = cgroups_v1.Metrics.decode(c.Stats(id=shim.cid).stats.value)
        assert m.memory.usage.limit == limit and m.pids.limit == 42
        bad = google.Any(type_url="types.containerd.io/opencontainers/runtime-spec/1/LinuxResources",
                         value=json.dumps({"memory": {"limit": "lots"}}).encode())
        if shim.runtime == "crun":
            # crun 1.8.1's `update -r` takes a non-numeric limit without an error (exit 0) and changes nothing
            c.Update(id=shim.cid, resources=bad)
            assert cgroups_v1.Metrics.decode(c.Stats(id=shim.cid).stats.value).memory.usage.limit == limit
        else:
            with pytest.raises(w.TtrpcError) as e:
                c.Update(id=shim.cid, resources=bad)
            assert "limit" in str(e.value)
        with pytest.raises(w.TtrpcError) as e:
            c.Checkpoint(id=shim.cid, path="/nowhere")
        assert e.value.code == w.UNIMPLEMENTED
        c.Kill(id=shim.cid, signal=9)
        c.Wait(id=shim.cid, timeout=30)
        c.Delete(id=shim.cid)


def test_errors_leave_shim_usable(tmp_path, shim):
    with shim.client() as c:
        with pytest.raises(w.TtrpcError) as e:
            c.State(id=shim.cid)
        assert e.value.code == w.NOT_FOUND
        with pytest.raises(w.TtrpcError) as e:
            c.Create(id=shim.cid, bundle=str(tmp_path / "nope"))
        assert e.value.code == w.INVALID_ARGUMENT
        with pytest.raises(w.TtrpcError) as e:
            c.Create(id="other", bundle=str(tmp_path))
        assert e.value.code == w.INVALID_ARGUMENT
        bad = make_bundle(str(tmp_path), shim.cid, ["/no/such/binary"])
        with pytest.raises(w.TtrpcError) as e:
            c.Create(id=shim.cid, bundle=bad)
        assert e.value.code == w.UNKNOWN and "/no/such/binary" in e.value.message
        with pytest.raises(w.TtrpcError) as e:
            c.State(id=shim.cid)
        assert e.value.code == w.NOT_FOUND
        # the failed create left nothing behind: the same id can be created again
        good = make_bundle(str(tmp_path / "again"), shim.cid, ["true"])
        c.Create(id=shim.cid, bundle=good)
        c.Start(id=shim.cid)
        assert c.Wait(id=shim.cid, timeout=30).exit_status == 0
        c.Delete(id=shim.cid)
        c.Shutdown(id=shim.cid)
    shim.proc.wait(10)


def test_container_dies_shim_reports(tmp_path, shim):
    """The container's init is killed behind the shim's back: the shim reports the exit, does not hang."""
    bundle = make_bundle(str(tmp_path), shim.cid, ["sleep", "1000"])
    with shim.client() as c:
        pid = c.Create(id=shim.cid, bundle=bundle).pid
        c.Start(id=shim.cid)
        os.kill(pid, signal.SIGKILL)
        assert c.Wait(id=shim.cid, timeout=30).exit_status == 137
        assert c.State(id=shim.cid).status == S.STOPPED
        c.Delete(id=shim.cid)


def test_client_disconnect_does_not_stop_shim(tmp_path, shim):
    bundle = make_bundle(str(tmp_path), shim.cid, ["sleep", "1000"])
    c = shim.client()
    c.Create(id=shim.cid, bundle=bundle)
    c.Start(id=shim.cid)
    c.close()
    shim.proc.send_signal(signal.SIGTERM)   # ignored while the container runs
    time.sleep(0.2)                         # deliberate: the shim must still be there a moment later
    assert shim.proc.poll() is None
    with shim.client() as c:
        assert c.State(id=shim.cid).status == S.RUNNING
        c.Shutdown(id=shim.cid)              # not now, task alive: keeps running
        assert c.State(id=shim.cid).status == S.RUNNING
        c.Kill(id=shim.cid, signal=9)
        c.Wait(id=shim.cid, timeout=30)
        c.Delete(id=shim.cid)
        c.Shutdown(id=shim.cid)
    shim.proc.wait(10)


def test_terminal_and_resize(tmp_path, shim):
    bundle = make_bundle(str(tmp_path), shim.cid, ["sh"], terminal=True)
    with shim.client() as c:
        c.Create(id=shim.cid, bundle=bundle, terminal=True, stdin="attach:", stdout="attach:")
        a = AttachClient(c.AttachInfo(id=shim.cid).path)
        c.Start(id=shim.cid)
        c.ResizePty(id=shim.cid, width=123, height=45)
        a.write_stdin(b"stty size; exit 5\n")
        out, _, status = a.read_all()
        assert b"45 123" in out, out
        assert status == 5
        assert c.Wait(id=shim.cid, timeout=30).exit_status == 5
        c.Delete(id=shim.cid)


def test_exec_with_terminal(tmp_path, shim):
    bundle = make_bundle(str(tmp_path), shim.cid, ["sleep", "1000"])
    with shim.client() as c:
        c.Create(id=shim.cid, bundle=bundle)
        c.Start(id=shim.cid)
        c.Exec(id=shim.cid, exec_id="tty", terminal=True, stdin="attach:", stdout="attach:",
               spec=proc_spec(["sh"], terminal=True))
        a = AttachClient(c.AttachInfo(id=shim.cid, exec_id="tty").path)
        c.Start(id=shim.cid, exec_id="tty")
        a.resize(100, 30)
        a.write_stdin(b"stty size; tty; exit 2\n")
        out, _, status = a.read_all()
        assert b"30 100" in out and b"/dev/pts/" in out, out
        assert status == 2
        assert c.Wait(id=shim.cid, exec_id="tty", timeout=30).exit_status == 2
        c.Kill(id=shim.cid, signal=9)
        c.Wait(id=shim.cid, timeout=30)
        c.Delete(id=shim.cid)


def test_shutdown_now_with_live_task(tmp_path, shim):
    bundle = make_bundle(str(tmp_path), shim.cid, ["sleep", "1000"])
    with shim.client() as c:
        c.Create(id=shim.cid, bundle=bundle)
        c.Start(id=shim.cid)
        c.Shutdown(id=shim.cid, now=True)
    shim.proc.wait(10)
    assert shim.proc.returncode == 0


def test_containerd_delete_subcommand_after_dead_shim(tmp_path, shim):
    """The shim is SIGKILLed with its container running: `containerd-shim-husk-v2 delete` cleans up."""
    import subprocess
    import sys

    from shim.pb import task as taskpb
    from tests.shim_fixtures import TOP
    bundle = make_bundle(str(tmp_path), shim.cid, ["sleep", "1000"])
    with shim.client() as c:
        pid = c.Create(id=shim.cid, bundle=bundle).pid
        c.Start(id=shim.cid)
    shim.proc.kill()
    shim.proc.wait(10)
    with open(os.path.join(bundle, "runtime.json"), "w") as f:
        json.dump({"runtime": "runc" if shim.runtime == "runc" else shim.runtime, "runtime_root": shim.runtime_root}, f)
    r = subprocess.run([sys.executable, "-c", "import sys; from shim.main import containerd_main; "
                        "sys.exit(containerd_main())", "-namespace", "default", "-id", shim.cid,
                        "-bundle", bundle, "delete"], capture_output=True, cwd=TOP, timeout=60)
    assert r.returncode == 0, r.stderr
    resp = taskpb.DeleteResponse.decode(r.stdout)
    assert resp.exit_status == 137 and resp.exited_at.seconds > 0
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z",
             10, "container gone")


def test_random_payloads_to_every_method(tmp_path, shim):
    """Garbage request bodies for every task method: each gets an answer and the shim stays up."""
    import random

    from shim.client import TtrpcClient
    from shim.pb import task as taskpb
    from shim.protobuf import Message
    rng = random.Random(1234)

    class Raw(Message):
        __slots__ = ("blob",)
        FULL_NAME = ""
        FIELDS = ()

        def __init__(self, blob=b""):
            object.__setattr__(self, "blob", blob)

        def encode(self):
            return self.blob

    bundle = make_bundle(str(tmp_path), shim.cid, ["sleep", "1000"])
    with shim.client() as c:
        c.Create(id=shim.cid, bundle=bundle)
        c.Start(id=shim.cid)
    with TtrpcClient(shim.address) as raw:
        for method in taskpb.SERVICES["containerd.task.v2.Task"]:
            if method in ("Shutdown", "Kill", "Delete", "Wait"):
                continue
            for _ in range(30):
                blob = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
                try:
                    raw.call("containerd.task.v2.Task", method, Raw(blob), google.Empty, timeout=10)
                except w.TtrpcError as err:
                    assert err.code not in (w.DEADLINE_EXCEEDED, w.INTERNAL), (method, err)
                except Exception as err:  # a decode error of the (typed) response is fine too
                    assert not isinstance(err, ConnectionError), (method, err)
    assert shim.proc.poll() is None
    with shim.client() as c:
        assert c.State(id=shim.cid).status == S.RUNNING
        c.Kill(id=shim.cid, signal=9)
        c.Wait(id=shim.cid, timeout=30)
        c.Delete(id=shim.cid)


def test_slow_fifo_reader_backpressure(tmp_path, shim):
    """Nobody reads the stdout fifo for a while: the container is held back, the shim stays responsive,
    and once the reader drains the fifo every byte arrives in order."""
    n = 3_000_000
    fout = str(tmp_path / "out")
    os.mkfifo(fout)
    rfd = os.open(fout, os.O_RDONLY | os.O_NONBLOCK)
    bundle = make_bundle(str(tmp_path), shim.cid, ["sh", "-c", f"head -c {n} /dev/zero | tr '\\0' a; echo done"])
    with shim.client() as c:
        c.Create(id=shim.cid, bundle=bundle, stdout=fout)
        c.Start(id=shim.cid)
        wait_for(lambda: _unread(rfd) >= 65536, 30, "the container to fill the fifo")
        assert c.State(id=shim.cid).status == S.RUNNING       # held back by the full fifo, shim answers
        got = bytearray()

        def drained() -> bool:
            while True:
                try:
                    chunk = os.read(rfd, 1 << 16)
                except BlockingIOError:
                    return got.endswith(b"done\n")
                if not chunk:
                    return got.endswith(b"done\n")
                got.extend(chunk)
        wait_for(drained, 60, lambda: f"the output up to 'done' ({len(got)} bytes so far)", interval=0.005)
        assert len(got) == n + 5 and got[:n].count(b"a") == n and got.endswith(b"done\n")
        assert c.Wait(id=shim.cid, timeout=30).exit_status == 0
        c.Delete(id=shim.cid)
    os.close(rfd)
