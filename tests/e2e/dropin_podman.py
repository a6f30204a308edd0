"""A private podman for the drop-in tests: own storage, run and tmp dirs, and a containers.conf for this host.

Owns the podman configuration files and running podman with `--runtime <binary>`; cleanup removes the
containers, unmounts what storage left and deletes the tests' cgroup parent. It never touches the host's
default podman storage (one exception podman 4.3 does not let us move: its image blob-info cache in
/var/lib/containers/cache, written on `load`).
"""
from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e import dropin_host as host
from tests.e2e.dropin_runtimes import RuntimeBinary

log = logging.getLogger(__name__)

PODMAN = "/usr/bin/podman"


def _ulimit(kind: int, name: str, soft: int, hard: int) -> str:
    # Never above our own hard limit: without CAP_SYS_RESOURCE nobody below us can raise it.
    cur_hard = resource.getrlimit(kind)[1]
    if cur_hard != resource.RLIM_INFINITY:
        hard = min(hard, cur_hard)
        soft = min(soft, hard)
    return f"{name}={soft}:{hard}"


def default_ulimits() -> list[str]:
    """The explicit default rlimits the tests' containers.conf gives every container.

    podman 4.3 otherwise asks for nofile/nproc at (or above) its own hard limits, and it runs conmon (and so
    the runtime) with a lower RLIMIT_NPROC hard limit than it asks for: without CAP_SYS_RESOURCE the
    runtime's setrlimit then fails with EPERM ("error setting rlimit type 6"), even with runc.
    """
    return [_ulimit(resource.RLIMIT_NOFILE, "nofile", 1024, 2048),
            _ulimit(resource.RLIMIT_NPROC, "nproc", 2048, 4096)]


def containers_conf(base: Path) -> str:
    ulimits = ", ".join(json.dumps(u) for u in default_ulimits())
    return f"""# podman settings under which podman + runc work on a host without CAP_SYS_RESOURCE
# and with cgroup v1, isolated from the host's own podman state.
[containers]
default_ulimits = [{ulimits}]
netns = "none"
log_driver = "k8s-file"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{base}/events.log"
tmp_dir = "{base}/tmp"
lock_type = "file"
volume_path = "{base}/volumes"
static_dir = "{base}/root/libpod"

[network]
network_config_dir = "{base}/net"
"""


def storage_conf(base: Path) -> str:
    return f"""[storage]
driver = "overlay"
graphroot = "{base}/root"
runroot = "{base}/runroot"
"""


@dataclass
class PrivatePodman:
    """podman with private configuration, storage and cgroup parent, driving one runtime binary."""

    runtime: RuntimeBinary
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="husk-dropin-pm-", dir="/tmp")))
    # Set when a podman call timed out: later tests fail at once instead of waiting for the same hang.
    wedged: str = ""

    @property
    def cgroup_parent(self) -> str:
        return "/" + self.base.name

    def setup(self) -> None:
        (self.base / "containers.conf").write_text(containers_conf(self.base))
        (self.base / "storage.conf").write_text(storage_conf(self.base))
        # No search registries: a short name never makes podman resolve a host.
        (self.base / "registries.conf").write_text("unqualified-search-registries = []\n")

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(CONTAINERS_CONF=str(self.base / "containers.conf"),
                   CONTAINERS_STORAGE_CONF=str(self.base / "storage.conf"),
                   CONTAINERS_REGISTRIES_CONF=str(self.base / "registries.conf"))
        return env

    def argv(self, *args: str) -> list[str]:
        return [PODMAN, "--runtime", self.runtime.path, *args]

    def podman(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        argv = self.argv(*args)
        # cwd is ours: conmon writes files (an "oom" marker) into the working directory it inherits.
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env,
                                 stdin=subprocess.DEVNULL, cwd=self.base)
        except subprocess.TimeoutExpired:
            self.wedged = self.wedged or f"`podman {' '.join(args[:1])}` timed out after {timeout}s"
            raise
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: rc {res.returncode}\nstdout: {res.stdout}\n"
                                 f"stderr: {res.stderr}")
        return res

    def run_flags(self) -> list[str]:
        return ["--cgroup-parent", self.cgroup_parent]

    def run(self, image: str, *cmd: str, name: str, detach: bool = False, rm: bool = False,
            extra: tuple[str, ...] = (), check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        flags = (["-d"] if detach else []) + (["--rm"] if rm else [])
        return self.podman("run", "--name", name, *flags, *self.run_flags(), *extra, image, *cmd, check=check,
                           timeout=timeout)

    def inspect(self, name: str) -> dict:
        return json.loads(self.podman("container", "inspect", name).stdout)[0]

    def container_ids(self) -> set[str]:
        return set(self.podman("ps", "-a", "-q", "--no-trunc").stdout.split())

    def cgroup_path(self, cid: str) -> str:
        return f"{self.cgroup_parent}/libpod-{cid}"

    def leftovers(self, cid: str, procs: list[host.ProcId]) -> list[str]:
        """What container cid (full id) left after `podman rm`; empty when nothing."""
        out = []
        if cid in self.container_ids():
            out.append(f"podman still lists {cid}")
        # podman uses the runtime's default --root: ask the runtime itself.
        if self.runtime.run("state", cid).returncode == 0:
            out.append(f"{self.runtime.name} state {cid} still succeeds")
        try:
            if cid in self.runtime.container_ids():
                out.append(f"{self.runtime.name} list still shows {cid}")
        except RuntimeError as e:
            out.append(str(e))
        out += [f"cgroup {p}" for p in host.cgroup_paths(self.cgroup_path(cid))]
        out += [f"mount {m}" for m in host.mounts_under(self.base) if cid in m]
        out += [f"process {p.pid} still alive" for p in procs if p.alive()]
        return out

    def stop(self) -> list[str]:
        """Remove every container, then everything on disk; returns what had to be cleaned (never raises)."""
        problems = []
        try:
            left = self.container_ids_quick()
            if left:
                problems.append(f"containers left at teardown: {sorted(left)}")
                self.podman("rm", "-a", "-f", "-t", "0", check=False, timeout=60)
        except (AssertionError, subprocess.SubprocessError) as e:
            problems.append(f"podman cleanup failed: {e}")
        # A runtime whose delete failed keeps state in its default root: remove what points into our dir.
        try:
            stale = self.runtime.force_delete_bundles_under(str(self.base))
        except subprocess.SubprocessError as e:
            stale = [f"(runtime list failed: {e})"]
        if stale:
            problems.append(f"{self.runtime.name} state left for {stale}")
        # conmon and any hung runtime process name our directory on their command line.
        stuck = [p for p in host.pids_with_cmdline(str(self.base)) if p != os.getpid()]
        if stuck:
            problems.append(f"processes left: {stuck}")
            host.kill_pids(stuck)
        # Containers' init and conmon live in the cgroup parent: nothing else does.
        problems += [f"cgroup left: {p}" for p in host.remove_cgroup_tree(self.cgroup_parent)]
        for m in host.unmount_all_under(self.base):
            problems.append(f"mount left: {m}")
        shutil.rmtree(self.base, ignore_errors=True)
        return problems

    def container_ids_quick(self) -> set[str]:
        return set(self.podman("ps", "-a", "-q", "--no-trunc", timeout=30).stdout.split())
