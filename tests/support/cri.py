"""husk-cri as a process for integration tests and scripts: its config, a pod network of its own, gRPC stubs,
kill -9 and restart, and a cleanup that removes everything it made even when a test failed half-way.

Every name is unique (`hct` prefix: bridge, subnet, cgroup parent, run dir); processes are ended by pid, and
only those whose working directory or command line is inside this daemon's own directories.
"""
from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

from tests.support.waiting import wait_for

CNI_BIN = "/usr/lib/cni"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=check)


def nat_chains() -> set[str]:
    out = sh("iptables", "-t", "nat", "-S", check=False).stdout
    return {line.split()[1] for line in out.splitlines() if line.startswith("-N ")}


def remove_new_empty_portmap_chains(before: set[str]) -> None:
    """portmap leaves its top-level chains after the last DEL: remove them if this run created them and no
    pod's rules are left in them (another user's pods keep them alive)."""
    top = ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ")
    present = nat_chains()
    if any(c in before for c in top) or "CNI-HOSTPORT-DNAT" not in present:
        return
    if any(line.startswith("-A") for line in
           sh("iptables", "-t", "nat", "-S", "CNI-HOSTPORT-DNAT", check=False).stdout.splitlines()):
        return
    for parent in ("PREROUTING", "OUTPUT", "POSTROUTING"):
        for line in sh("iptables", "-t", "nat", "-S", parent, check=False).stdout.splitlines():
            if line.startswith("-A") and any(f"-j {c}" in line for c in top):
                sh("iptables", "-t", "nat", *shlex.split("-D" + line[2:]), check=False)
    for c in top:
        if c in present:
            sh("iptables", "-t", "nat", "-F", c, check=False)
            sh("iptables", "-t", "nat", "-X", c, check=False)


@dataclass
class PodNetwork:
    """A CNI conf dir with a bridge + host-local + portmap network of unique names; local traffic only.
    `prefix` names the bridge (<prefix><tag>) and the network; the subnet is 10.<octets range>.<random>.0/24, so
    that suites running side by side (the CRI tests, scripts/kubelet-e2e) never share one."""
    base: str
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    prefix: str = "hct"
    octets: tuple[int, int] = (200, 250)

    def __post_init__(self) -> None:
        self.bridge = f"{self.prefix}{self.tag}"
        self.subnet_prefix = f"10.{random.randint(*self.octets)}.{random.randint(0, 255)}"
        self.subnet = f"{self.subnet_prefix}.0/24"
        self.conf_dir = os.path.join(self.base, "net.d")
        self.ipam_dir = os.path.join(self.base, "ipam")
        os.makedirs(self.conf_dir, exist_ok=True)
        from cri_server.network.defaults import default_conflist
        doc = default_conflist(bridge=self.bridge, subnet=self.subnet, network=f"{self.prefix}-{self.tag}",
                               data_dir=self.ipam_dir)
        with open(os.path.join(self.conf_dir, f"10-{self.prefix}.conflist"), "w") as f:
            json.dump(doc, f)
        with open("/proc/sys/net/ipv4/ip_forward") as f:
            self._ip_forward = f.read().strip()
        self._chains = nat_chains()

    def cleanup(self) -> None:
        sh("ip", "link", "del", self.bridge, check=False)
        remove_new_empty_portmap_chains(self._chains)
        with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
            f.write(self._ip_forward)


class CriDaemon:
    """One husk-cri: `start()`, `kill9()`, `stop()`, stubs, `cleanup()`."""

    def __init__(self, base: str, network: PodNetwork, registry_config_dir: str, sandbox_image: str,
                 runtime: str = os.environ.get("HUSK_TEST_CRI_RUNTIME", "in-process"),
                 extra_config: str = "", log_level: str = "debug") -> None:
        """`extra_config`: TOML appended to the config file (sections the base file does not have)."""
        self.tag = uuid.uuid4().hex[:8]
        self.base = base
        self.root = os.path.join(base, "root")
        self.state = f"/run/hct-{self.tag}"          # short: unix socket paths, netns pins, bundles
        self.socket = os.path.join(self.state, "cri.sock")
        self.runtime_root = os.path.join(self.state, "runtime")
        self.cgroup_parent = f"/hct-{self.tag}"
        self.network = network
        self.runtime = runtime
        # The binary that lists and force-deletes this daemon's containers in cleanup.
        self.runtime_binary = os.path.join(os.path.dirname(sys.executable), "husk") \
            if runtime in ("in-process", "husk") else runtime
        self.log_path = os.path.join(base, "husk-cri.log")
        self.config_path = os.path.join(base, "cri.toml")
        os.makedirs(base, exist_ok=True)
        with open(self.config_path, "w") as f:
            f.write("\n".join([
                "[server]", f'listen = "{self.socket}"', f'log_level = "{log_level}"', 'log_format = "text"',
                "[paths]", f'root = "{self.root}"', f'state = "{self.state}"',
                "[runtime]", f'runtime = "{runtime}"', f'runtime_root = "{self.runtime_root}"',
                f'sandbox_image = "{sandbox_image}"',
                # A RuntimeClass handler running runc, next to the default runtime.
                "[runtime.handlers]", 'runc = "runc"',
                "[cni]", f'conf_dir = "{network.conf_dir}"', f'bin_dirs = ["{CNI_BIN}"]',
                "[registry]", f'config_dir = "{registry_config_dir}"', "", extra_config]))
        self.proc: subprocess.Popen[bytes] | None = None
        self._channel: Any = None

    # --- process --------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> None:
        logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "cri_server", "--config", self.config_path],
                                     stdout=logf, stderr=logf, stdin=subprocess.DEVNULL)
        logf.close()
        proc = self.proc

        def answers() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"husk-cri exited {proc.returncode}:\n{self.log()[-3000:]}")
            return self._answers()
        wait_for(answers, timeout, f"husk-cri to answer on {self.socket} (log: {self.log_path})")

    def _answers(self) -> bool:
        try:
            if not stat.S_ISSOCK(os.lstat(self.socket).st_mode):
                return False
        except FileNotFoundError:
            return False
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def kill9(self) -> None:
        self._close_channel()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        self._close_channel()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # --- clients --------------------------------------------------------------------------
    def channel(self) -> Any:
        import grpc
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket}")
        return self._channel

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def runtime_stub(self) -> Any:
        from cri_server.api.v1 import api_pb2_grpc as rpc
        return rpc.RuntimeServiceStub(self.channel())

    def image_stub(self) -> Any:
        from cri_server.api.v1 import api_pb2_grpc as rpc
        return rpc.ImageServiceStub(self.channel())

    # --- cleanup --------------------------------------------------------------------------
    def remove_all_pods(self) -> None:
        from cri_server.api.v1 import api_pb2 as pb
        if self.proc is None or self.proc.poll() is not None or not self._answers():
            return
        rt = self.runtime_stub()
        try:
            for p in rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items:
                rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=p.id), timeout=60)
                rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=p.id), timeout=60)
        except Exception as e:  # noqa: BLE001 -- the forced cleanup below handles what is left
            print(f"cleanup through the API failed: {e}", file=sys.stderr)

    def cleanup(self) -> None:
        """Everything this daemon made goes, whatever state the test left it in."""
        self.remove_all_pods()
        self.stop()
        self._kill_our_processes()
        for binary, root in self.runtimes():
            for cid in self.runtime_ids(binary, root):
                sh(binary, "--root", root, "delete", "--force", cid, check=False)
        from cri_server import fsutil
        from cri_server.network import netns
        netns_dir = os.path.join(self.state, "netns")
        if os.path.isdir(netns_dir):
            for n in os.listdir(netns_dir):
                netns.remove(os.path.join(netns_dir, n))
        for d in (self.state, self.root):
            if os.path.exists(d):
                fsutil.unmount_all(d)
                shutil.rmtree(d, ignore_errors=True)
        remove_cgroup_tree(self.cgroup_parent)

    def runtimes(self) -> list[tuple[str, str]]:
        """(binary, --root) of the default runtime and of the runc handler (husk-cri's `<root>-runc`)."""
        out = [(self.runtime_binary, self.runtime_root)]
        if self.runtime_binary != "runc":
            out.append(("runc", self.runtime_root + "-runc"))
        return out

    def runtime_ids(self, binary: str = "", root: str = "") -> list[str]:
        if not binary:
            return [i for b, r in self.runtimes() for i in self.runtime_ids(b, r)]
        if not os.path.isdir(root):
            return []
        out = sh(binary, "--root", root, "list", "-q", check=False).stdout
        return [x for x in out.split() if x]

    def _kill_our_processes(self) -> None:
        """Shims of this daemon (their cwd is a bundle under our run dir) and their containers' processes."""
        mine = []
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            if pid == os.getpid():
                continue
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if cwd.startswith(self.state + "/") or self.state.encode() in cmd:
                mine.append(pid)
        for pid in mine:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def shim_pids(self) -> list[int]:
        out = []
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if cwd.startswith(os.path.join(self.state, "bundles") + "/") and comm != "runc":
                out.append(pid)
        return out


def remove_cgroup_tree(rel: str) -> None:
    """Removes `rel` and its children in every v1 hierarchy and the unified one (empty cgroups only)."""
    base = "/sys/fs/cgroup"
    for ctrl in os.listdir(base):
        top = os.path.join(base, ctrl, rel.lstrip("/"))
        if not os.path.isdir(top):
            continue
        for dirpath, dirnames, _ in sorted(os.walk(top), key=lambda t: -t[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
