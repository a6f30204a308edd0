"""A private containerd 1.6 for the drop-in tests: own config, root, state, socket; driven with `ctr`.

Owns starting that containerd (CRI plugin disabled: these tests use the task API through ctr), running ctr
against it, and tearing down everything it made (tasks, shims, mounts, cgroups) by pid and by path.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e import dropin_host as host
from tests.e2e.dropin_runtimes import RuntimeBinary
from tests.support.waiting import wait_for

log = logging.getLogger(__name__)

CONTAINERD = "/usr/bin/containerd"
CTR = "/usr/bin/ctr"
SHIM = "/usr/bin/containerd-shim-runc-v2"


def _config(base: Path) -> str:
    # Every path containerd would otherwise put under /var/lib/containerd, /run/containerd or /opt is ours.
    return f"""version = 2
root = "{base}/root"
state = "{base}/state"
oom_score = 0
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "{base}/containerd.sock"

[ttrpc]
  address = "{base}/containerd.sock.ttrpc"

[debug]
  level = "debug"

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{base}/root/opt"
"""


@dataclass
class PrivateContainerd:
    """One containerd process and the ctr settings to drive it with a given runtime binary."""

    runtime: RuntimeBinary
    namespace: str = "husk-dropin"
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="husk-dropin-ctd-", dir="/tmp")))
    proc: subprocess.Popen | None = None
    # Set when a ctr call timed out: the runtime hangs, so later tests fail at once instead of waiting too.
    wedged: str = ""

    @property
    def address(self) -> str:
        return str(self.base / "containerd.sock")

    @property
    def runtime_root(self) -> Path:
        """What the shim passes as the runtime's --root (ctr --runc-root, plus the namespace)."""
        return self.base / "runtime-root"

    @property
    def runtime_root_ns(self) -> Path:
        return self.runtime_root / self.namespace

    @property
    def cgroup_parent(self) -> str:
        return "/" + self.base.name

    def bundle(self, cid: str) -> Path:
        return self.base / "state" / "io.containerd.runtime.v2.task" / self.namespace / cid

    def cgroup_path(self, cid: str) -> str:
        return f"{self.cgroup_parent}/{cid}"

    def start(self) -> None:
        (self.base / "config.toml").write_text(_config(self.base))
        logf = open(self.base / "containerd.log", "ab")
        try:
            self.proc = subprocess.Popen([CONTAINERD, "--config", str(self.base / "config.toml")],
                                         stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                         close_fds=True, start_new_session=True)
        finally:
            logf.close()
        proc = self.proc

        def answers() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"containerd exited {proc.returncode}: {self.log_tail()}")
            return self.ctr("version", check=False, timeout=10).returncode == 0
        wait_for(answers, 30, lambda: f"containerd to answer on {self.address}: {self.log_tail()}", interval=0.1)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.base / "containerd.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"

    def ctr(self, *args: str, check: bool = True, timeout: float = 60, stdin=subprocess.DEVNULL,
            **kw) -> subprocess.CompletedProcess:
        argv = [CTR, "--address", self.address, "--namespace", self.namespace, *args]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=stdin, **kw)
        except subprocess.TimeoutExpired:
            self.wedged = self.wedged or f"`ctr {' '.join(args[:2])}` timed out after {timeout}s"
            raise
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: rc {res.returncode}\nstdout: {res.stdout}\n"
                                 f"stderr: {res.stderr}")
        return res

    def run_flags(self, cid: str) -> list[str]:
        """The `ctr run` flags that make the runc shim use this runtime binary, root, cgroup and fifo dir."""
        return ["--runc-binary", self.runtime.path, "--runc-root", str(self.runtime_root),
                "--cgroup", self.cgroup_path(cid), "--fifo-dir", str(self.base / "fifo")]

    def run(self, image: str, cid: str, *cmd: str, detach: bool = False, rm: bool = False,
            extra: tuple[str, ...] = (), check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        flags = (["-d"] if detach else []) + (["--rm"] if rm else [])
        return self.ctr("run", *flags, *self.run_flags(cid), *extra, image, cid, *cmd, check=check,
                        timeout=timeout)

    def task_status(self, cid: str, timeout: float = 60) -> str | None:
        """RUNNING / PAUSED / STOPPED / CREATED from `ctr task ls`, None when there is no task."""
        for line in self.ctr("task", "ls", timeout=timeout).stdout.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 3 and parts[0] == cid:
                return parts[2]
        return None

    def task_pid(self, cid: str) -> int:
        for line in self.ctr("task", "ls").stdout.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 3 and parts[0] == cid:
                return int(parts[1])
        raise AssertionError(f"no task {cid}")

    def container_ids(self) -> set[str]:
        return set(self.ctr("containers", "ls", "-q").stdout.split())

    def remove(self, cid: str) -> None:
        """Best-effort removal of one container and its task (cleanup path; never raises)."""
        try:
            self.ctr("task", "kill", "-a", "-s", "SIGKILL", cid, check=False, timeout=15)
            try:
                wait_for(lambda: self.task_status(cid, timeout=15) in (None, "STOPPED"), 10, f"{cid} to stop")
            except AssertionError as e:   # task rm -f below kills what is left
                log.warning("%s", e)
            self.ctr("task", "rm", "-f", cid, check=False, timeout=15)
            self.ctr("containers", "rm", cid, check=False, timeout=15)
        except (subprocess.SubprocessError, AssertionError) as e:
            log.warning("cleanup of %s failed: %s", cid, e)

    def leftovers(self, cid: str, task_pids: list[host.ProcId]) -> list[str]:
        """Everything of container cid still on the host after delete; empty when it left nothing."""
        out = []
        if self.task_status(cid) is not None:
            out.append(f"task {cid} still listed")
        if cid in self.container_ids():
            out.append(f"container {cid} still listed")
        state_dir = self.runtime_root_ns / cid
        if state_dir.exists():
            out.append(f"runtime state dir {state_dir}")
        if self.runtime_root_ns.is_dir():
            try:
                if cid in self.runtime.container_ids(root=str(self.runtime_root_ns)):
                    out.append(f"{self.runtime.name} list still shows {cid}")
            except RuntimeError as e:
                out.append(str(e))
        out += [f"cgroup {p}" for p in host.cgroup_paths(self.cgroup_path(cid))]
        out += [f"mount {m}" for m in host.mounts_under(self.bundle(cid))]
        out += [f"process {p.pid} still alive" for p in task_pids if p.alive()]
        shims = host.pids_with_cmdline(SHIM, "-address " + self.address, "-id " + cid)
        out += [f"shim {pid} still running" for pid in shims]
        return out

    def shim_socket(self, cid: str) -> Path:
        """Where containerd 1.6 puts the shim's socket: /run/containerd/s/sha256(address/namespace/id)."""
        digest = hashlib.sha256(f"{self.address}/{self.namespace}/{cid}".encode()).hexdigest()
        return Path("/run/containerd/s") / digest

    def stop(self) -> list[str]:
        """Tear everything down; returns problems found (never raises, so fixtures always finish)."""
        problems = []
        if self.proc is not None and self.proc.poll() is None:
            try:
                left = sorted(self.container_ids_quick())
            except (subprocess.SubprocessError, AssertionError) as e:
                left = []
                problems.append(f"ctr containers ls failed: {e}")
            for cid in left:
                problems.append(f"container {cid} left at teardown")
                self.remove(cid)
            host.stop_process(self.proc)
        # Shims outlive containerd; those of this instance name its socket on their command line. A
        # runtime process that hangs names our directory (bundle, root, log) on its command line.
        shims = host.pids_with_cmdline(SHIM, "-address " + self.address)
        stuck = [p for p in host.pids_with_cmdline(str(self.base)) if p not in shims and p != os.getpid()]
        if stuck:
            problems.append(f"processes left: {stuck}")
            host.kill_pids(stuck)
        if shims:
            problems.append(f"shims left: {shims}")
            ids = [host.cmdline_arg(pid, "-id") for pid in shims]
            host.kill_pids(shims)
            for cid in ids:
                if cid:
                    self.shim_socket(cid).unlink(missing_ok=True)
        problems += [f"cgroup left: {p}" for p in host.remove_cgroup_tree(self.cgroup_parent)]
        for m in host.unmount_all_under(self.base):
            problems.append(f"mount left: {m}")
        shutil.rmtree(self.base, ignore_errors=True)
        return problems

    def container_ids_quick(self) -> set[str]:
        return set(self.ctr("containers", "ls", "-q", timeout=15).stdout.split())
