"""containerd 1.6 (the distro's) runs husk-shim as io.containerd.husk.v2: ctr run, exec, kill, and a
restart of containerd while the container keeps running (root, e2e)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.shim_fixtures import build_busybox_oci_archive, runtimes_available, unique, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.root]
REF = "docker.io/library/hshim-busybox:latest"
RUNTIME = "io.containerd.husk.v2"


class Containerd:
    def __init__(self, base: str, env: dict[str, str]) -> None:
        self.base = base
        self.sock = os.path.join(base, "containerd.sock")
        self.config = os.path.join(base, "config.toml")
        self.log = os.path.join(base, "containerd.log")
        self.env = env
        self.proc: subprocess.Popen | None = None
        with open(self.config, "w") as f:
            f.write(f"""version = 2
root = "{base}/root"
state = "{base}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{self.sock}.ttrpc"
[debug]
  level = "debug"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{base}/opt"
""")

    def start(self) -> None:
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen(["containerd", "--config", self.config], stdout=logf, stderr=logf,
                                     stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)
        logf.close()
        wait_for(lambda: self.ctr("version", check=False).returncode == 0, 30, "containerd up")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def ctr(self, *args: str, check: bool = True, timeout: float = 60, input: bytes | None = None):
        r = subprocess.run(["ctr", "--address", self.sock, *args], capture_output=True, timeout=timeout,
                           input=input, stdin=None if input is not None else subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)}: {r.returncode}\n{r.stdout.decode()}\n{r.stderr.decode()}"
                                 f"\ncontainerd log tail:\n{_tail(self.log)}")
        return r


def _tail(path: str, n: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def _shim_bin_dir(tmp: str) -> str:
    """A directory with a containerd-shim-husk-v2 launcher for the checkout under test (`python -IS`, the
    checkout first on sys.path): the installed console script may point at another tree."""
    d = os.path.join(tmp, "bin")
    os.makedirs(d, exist_ok=True)
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = [top] + [p for p in sys.path if p and p != top]
    with open(os.path.join(d, "containerd-shim-husk-v2"), "w") as f:
        f.write(f"#!{sys.executable} -IS\nimport sys; sys.path[:0] = {path!r}\n"
                "from shim.main import containerd_main; sys.exit(containerd_main())\n")
    os.chmod(os.path.join(d, "containerd-shim-husk-v2"), 0o755)
    return d


@pytest.fixture(params=runtimes_available())
def containerd(tmp_path, request):
    """A private containerd whose husk shims drive `request.param` (runc, or husk in-process)."""
    # Not under pytest's tmp_path: containerd's overlay paths must stay short for mount options.
    import tempfile
    base = tempfile.mkdtemp(prefix="hshim-ctd-")
    env = {**os.environ, "PATH": f"{_shim_bin_dir(base)}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
           "HUSK_SHIM_RUNTIME": request.param}
    c = Containerd(base, env)
    c.start()
    archive = os.path.join(base, "busybox.tar")
    build_busybox_oci_archive(archive, REF)
    c.ctr("images", "import", "--all-platforms", archive)
    started: list[str] = []
    c.started = started
    yield c
    if c.proc is None:
        c.start()
    for cid in started:
        c.ctr("task", "kill", "-s", "SIGKILL", cid, check=False)
        try:
            wait_for(lambda: _task_status(c, cid) in ("", "STOPPED"), 10, f"{cid} to stop")
        except AssertionError:
            pass  # delete -f below kills what is left
        c.ctr("task", "delete", "-f", cid, check=False)
        c.ctr("container", "delete", cid, check=False)
    c.ctr("images", "rm", REF, check=False)
    c.stop()
    _unmount_under(base)
    shutil.rmtree(base, ignore_errors=True)


def _unmount_under(base: str) -> None:
    """Unmounts every mount below `base` (rootfs overlays of containers), deepest first."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for mp in sorted((p for p in points if p.startswith(base + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], stderr=subprocess.DEVNULL)


def _task_status(c: Containerd, cid: str) -> str:
    for line in c.ctr("task", "ls").stdout.decode().splitlines()[1:]:
        parts = line.split()
        if parts and parts[0] == cid:
            return parts[-1]
    return ""


def test_ctr_run_foreground_output(containerd):
    cid = unique()
    containerd.started.append(cid)
    r = containerd.ctr("run", "--rm", "--runtime", RUNTIME, REF, cid, "sh", "-c", "echo hello-from-husk; exit 0")
    assert r.stdout.decode().strip() == "hello-from-husk"


def test_ctr_run_exec_kill_and_containerd_restart(containerd):
    cid = unique()
    containerd.started.append(cid)
    containerd.ctr("run", "-d", "--runtime", RUNTIME, REF, cid, "sleep", "1000")
    wait_for(lambda: _task_status(containerd, cid) == "RUNNING", 30, "task running")
    pid = int([l.split()[1] for l in containerd.ctr("task", "ls").stdout.decode().splitlines()
               if l.startswith(cid)][0])
    r = containerd.ctr("task", "exec", "--exec-id", "e1", cid, "sh", "-c", "echo exec-out; echo exec-err >&2")
    assert r.stdout.decode().strip() == "exec-out"
    assert "exec-err" in r.stderr.decode()

    # containerd goes away and comes back: the container and its shim keep running
    containerd.stop()
    os.kill(pid, 0)
    time.sleep(0.5)  # deliberate: half a second without containerd, and the container is still there
    os.kill(pid, 0)
    containerd.start()
    wait_for(lambda: _task_status(containerd, cid) == "RUNNING", 30, "task running after restart")
    r = containerd.ctr("task", "exec", "--exec-id", "e2", cid, "echo", "after-restart")
    assert r.stdout.decode().strip() == "after-restart"
    ps = containerd.ctr("task", "ps", cid).stdout.decode()
    assert str(pid) in ps

    containerd.ctr("task", "kill", "-s", "SIGKILL", cid)
    wait_for(lambda: _task_status(containerd, cid) == "STOPPED", 30, "task stopped")
    containerd.ctr("task", "delete", cid)
    containerd.ctr("container", "delete", cid)
    containerd.started.remove(cid)
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z",
             10, "container gone")
    # the shim left: no process serves this container any more
    out = subprocess.run(["pgrep", "-f", f"husk-shim.*{cid}"], capture_output=True).stdout.decode().split()
    assert out == []


def test_ctr_metrics_and_pause(containerd):
    cid = unique()
    containerd.started.append(cid)
    containerd.ctr("run", "-d", "--runtime", RUNTIME, REF, cid, "sleep", "1000")
    wait_for(lambda: _task_status(containerd, cid) == "RUNNING", 30, "task running")
    m = containerd.ctr("task", "metrics", cid).stdout.decode()
    assert "memory.usage_in_bytes" in m and "cpuacct.usage" in m and "pids.current" in m, m
    containerd.ctr("task", "pause", cid)
    assert _task_status(containerd, cid) == "PAUSED"
    containerd.ctr("task", "resume", cid)
    assert _task_status(containerd, cid) == "RUNNING"


def test_dead_shim_is_cleaned_up_by_containerd(containerd):
    """SIGKILL the shim: containerd notices, runs `containerd-shim-husk-v2 delete` and marks the task gone."""
    cid = unique()
    containerd.started.append(cid)
    containerd.ctr("run", "-d", "--runtime", RUNTIME, REF, cid, "sleep", "1000")
    wait_for(lambda: _task_status(containerd, cid) == "RUNNING", 30, "task running")
    pid = int([l.split()[1] for l in containerd.ctr("task", "ls").stdout.decode().splitlines()
               if l.startswith(cid)][0])
    with open(f"/proc/{pid}/stat") as f:
        shim_pid = int(f.read().rsplit(")", 1)[1].split()[1])
    with open(f"/proc/{shim_pid}/comm") as f:
        assert f.read().strip() == "husk-shim"
    with open(f"/proc/{shim_pid}/cmdline", "rb") as f:             # as ps -o args / pgrep -f show it
        assert f.read().rstrip(b"\0").replace(b"\0", b" ").decode() == f"husk-shim {cid}"
    with open(os.path.join(containerd.base, "state", "io.containerd.runtime.v2.task", "default", cid, "address")) as f:
        sock = f.read().strip()[len("unix://"):]
    assert os.path.exists(sock)
    os.kill(shim_pid, signal.SIGKILL)
    wait_for(lambda: _task_status(containerd, cid) in ("", "STOPPED"), 30, "task cleaned up")
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z",
             30, "container killed")
    containerd.ctr("task", "delete", cid, check=False)
    containerd.ctr("container", "delete", cid)
    containerd.started.remove(cid)
    # containerd ran `containerd-shim-husk-v2 delete`: the dead shim's socket is gone too
    assert not os.path.exists(sock)
