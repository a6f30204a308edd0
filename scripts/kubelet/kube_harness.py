"""The test bed of scripts/kubelet-e2e: local images in a local registry, a husk-cri of its own (tests/support/cri's
CriDaemon) on a private bridge network, and a standalone kubelet (static pods, read-only port) whose configuration
a scenario may change by restarting it. `Bed.close()` removes everything: pods, containers, mounts, cgroups (the
kubelet's own cgroup root included), processes, network namespaces, the bridge; kernel tunables kubelet changes are
put back.

Every name is this run's own: bridge `hke<tag>` on 10.19x.y.0/24, kubelet cgroup root `/hke-<tag>`, husk-cri state
`/run/hct-<tag>`; only processes started here (or whose cwd/command line is inside this run's dirs) are ended.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if TOP not in sys.path:
    sys.path.insert(0, TOP)

from tests.support.cri import PodNetwork  # noqa: E402 -- after the path

SANDBOX_IMAGE = "registry.k8s.io/pause:3.9-husk"
BUSYBOX = "docker.io/library/busybox:latest"
GC_IMAGE = "registry.k8s.io/k8s-staging-cri-tools/test-image-1:latest"
GC_IMAGE2 = "registry.k8s.io/k8s-staging-cri-tools/test-image-2:latest"
# (catalog image, registry path)
PUSHED = [("busybox", "library/busybox:latest"), ("pause-sandbox", "pause:3.9-husk"),
          ("test-image-1", "k8s-staging-cri-tools/test-image-1:latest"),
          ("test-image-2", "k8s-staging-cri-tools/test-image-2:latest")]
NODE = "hke-node"
RO_PORT = 10255
# kubelet sets these when protectKernelDefaults is false (cm/container_manager_linux.go setupKernelTunables)
TUNABLES = ["vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
            "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"]
# kubelet links every container's log here (pkg/kubelet/kuberuntime: ContainerLogsDir, not configurable)
CONTAINER_LOGS = "/var/log/containers"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} kubelet-e2e: {msg}", flush=True)


class Failed(AssertionError):
    """A scenario's check did not hold; the message says what was expected and what was seen."""


def check(cond: bool, what: str) -> None:
    if not cond:
        raise Failed(what)


def wait_for(what: str, fn: Callable[[], Any], timeout: float, interval: float = 1.0) -> Any:
    """Polls `fn` until it returns a truthy value (returned) or raises Failed naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last_err = ""
    while True:
        try:
            v = fn()
            if v:
                return v
        except (OSError, ValueError, KeyError, IndexError, urllib.error.URLError) as e:
            last_err = f" (last error: {e})"
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:.0f}s waiting for {what}{last_err}")
        time.sleep(interval)


def http_get(path: str, timeout: float = 10) -> bytes:
    with _NO_PROXY.open(f"http://127.0.0.1:{RO_PORT}{path}", timeout=timeout) as r:
        return r.read()


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@dataclass
class Network(PodNetwork):
    """A CNI conf dir with a bridge network of this run's own (bridge hke<tag>, 10.19x.y.0/24)."""
    prefix: str = "hke"
    octets: tuple[int, int] = (190, 199)


def base_kubelet_config(manifests: str, pod_logs: str, endpoint: str, cgroup_root: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": endpoint, "imageServiceEndpoint": endpoint,
        "staticPodPath": manifests, "fileCheckFrequency": "2s", "syncFrequency": "10s",
        "podLogsDir": pod_logs,
        "failSwapOn": False, "cgroupDriver": "cgroupfs", "cgroupsPerQOS": True, "cgroupRoot": cgroup_root,
        "enforceNodeAllocatable": [], "makeIPTablesUtilChains": False,
        "readOnlyPort": RO_PORT, "address": "127.0.0.1", "healthzPort": 0, "healthzBindAddress": "127.0.0.1",
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "runtimeRequestTimeout": "2m",
        # small logs, checked often: the log-rotation scenario
        "containerLogMaxSize": "100Ki", "containerLogMaxFiles": 40, "containerLogMonitorInterval": "3s",
        # no image GC and no eviction unless a scenario asks for them
        # (an imageMinimumGCAge of 0 means kubelet's default, 2m)
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99, "imageMinimumGCAge": "1s",
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%", "imagefs.available": "0%",
                         "nodefs.inodesFree": "0%", "imagefs.inodesFree": "0%"},
        "evictionPressureTransitionPeriod": "5s",
        "featureGates": {},
        "serializeImagePulls": False,
    }


class Bed:
    """Registry, husk-cri, kubelet. `start()`, `restart_kubelet(**overrides)`, `restart_cri(kill9=False)`, `close()`."""

    def __init__(self, kubelet: str, out: str, cache: str, gates: dict[str, bool], verbosity: int = 2) -> None:
        self.kubelet_bin = kubelet
        self.out = out
        self.cache = cache
        self.gates = gates
        self.verbosity = verbosity
        self.tag = uuid.uuid4().hex[:6]
        self.cgroup_root = f"/hke-{self.tag}"
        self.kdir = os.path.join(out, "kubelet")
        self.manifests = os.path.join(self.kdir, "manifests")
        self.kroot = os.path.join(self.kdir, "root")
        self.pod_logs = os.path.join(self.kdir, "pod-logs")
        self.host_dir = os.path.join(out, "hostpath")
        self.config_path = os.path.join(self.kdir, "config.json")
        self.klog_path = os.path.join(self.kdir, "kubelet.log")
        self.reg: Any = None
        self.net: Network | None = None
        self.cri: Any = None
        self.kproc: subprocess.Popen[bytes] | None = None
        self.kconfig: dict[str, Any] = {}
        self._tunables: dict[str, str] = {}
        self._kubelet_starts = 0
        self.version = ""
        self._had_container_logs = os.path.isdir(CONTAINER_LOGS)

    # --- set-up -----------------------------------------------------------------------------------------
    def start(self) -> None:
        from cri_server.images import testimages
        from tests.support.cri import CriDaemon
        from tests.support.registry import LocalRegistry, write_hosts_toml
        if not port_free(RO_PORT):
            raise RuntimeError(f"127.0.0.1:{RO_PORT} is in use (another kubelet?): the read-only port is needed")
        for d in (self.manifests, self.kroot, self.pod_logs, self.host_dir):
            os.makedirs(d, exist_ok=True)
        self.version = subprocess.run([self.kubelet_bin, "--version"], capture_output=True, text=True,
                                      check=True).stdout.strip()
        layouts = os.path.join(self.cache, "layouts")
        index = testimages.build(layouts, only=sorted({n for n, _ in PUSHED}), big=False, log=lambda *_: None)
        self.reg = LocalRegistry(os.path.join(self.out, "registry"))
        self.reg.start()
        for name, path in PUSHED:
            self.reg.push(os.path.join(layouts, index[name]["layout"]), path)
        certs = os.path.join(self.out, "certs.d")
        for host in ("docker.io", "registry.k8s.io", self.reg.addr):
            write_hosts_toml(certs, host, f"http://{self.reg.addr}")
        self.net = Network(self.out)
        self.cri = CriDaemon(self.out, self.net, certs, SANDBOX_IMAGE, log_level="info")  # type: ignore[arg-type]
        self.cri.start()
        log(f"registry {self.reg.addr}; husk-cri unix://{self.cri.socket}; bridge {self.net.bridge} "
            f"{self.net.subnet}; kubelet cgroup root {self.cgroup_root}")
        for t in TUNABLES:
            with open(f"/proc/sys/{t}") as f:
                self._tunables[t] = f.read().strip()
        self._make_cgroup_root()
        self.kconfig = base_kubelet_config(self.manifests, self.pod_logs, f"unix://{self.cri.socket}",
                                           self.cgroup_root)
        self.kconfig["featureGates"] = dict(self.gates)
        self.start_kubelet()

    def _make_cgroup_root(self) -> None:
        """kubelet refuses a cgroupRoot that does not exist in every hierarchy it uses."""
        base = "/sys/fs/cgroup"
        for ctrl in os.listdir(base):
            if not os.path.isdir(os.path.join(base, ctrl)) or os.path.islink(os.path.join(base, ctrl)):
                continue
            d = os.path.join(base, ctrl, self.cgroup_root.lstrip("/"))
            os.makedirs(d, exist_ok=True)
            if ctrl == "cpuset":
                for fname in ("cpuset.cpus", "cpuset.mems"):
                    with open(os.path.join(base, ctrl, fname)) as f:
                        v = f.read().strip()
                    with open(os.path.join(d, fname), "w") as f:
                        f.write(v)

    # --- kubelet ----------------------------------------------------------------------------------------
    def start_kubelet(self, **overrides: Any) -> None:
        verbosity = overrides.pop("_v", self.verbosity)
        cfg = copy.deepcopy(self.kconfig)
        cfg.update(overrides)
        with open(self.config_path, "w") as f:
            json.dump(cfg, f, indent=1)
        self._kubelet_starts += 1
        logf = open(self.klog_path, "ab")
        logf.write(f"\n===== kubelet start {self._kubelet_starts}: overrides {json.dumps(overrides)}\n".encode())
        logf.flush()
        self.kproc = subprocess.Popen(
            [self.kubelet_bin, f"--config={self.config_path}", f"--root-dir={self.kroot}",
             f"--cert-dir={os.path.join(self.kdir, 'pki')}", f"--hostname-override={NODE}", f"--v={verbosity}"],
            stdout=logf, stderr=logf, stdin=subprocess.DEVNULL, start_new_session=True)
        logf.close()

        def up() -> bool:
            if self.kproc is not None and self.kproc.poll() is not None:
                raise RuntimeError(f"kubelet exited {self.kproc.returncode}: {self.klog_tail()}")
            return json.loads(http_get("/pods", 2)).get("kind") == "PodList"
        wait_for("kubelet's read-only port to answer /pods", up, 90, 0.5)

    def stop_kubelet(self) -> None:
        p = self.kproc
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        wait_for(f"127.0.0.1:{RO_PORT} to be free", lambda: port_free(RO_PORT), 30, 0.2)

    def restart_kubelet(self, **overrides: Any) -> None:
        self.stop_kubelet()
        self.start_kubelet(**overrides)

    def klog_tail(self, n: int = 4000) -> str:
        try:
            with open(self.klog_path, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def klog_since(self, offset: int) -> str:
        with open(self.klog_path, errors="replace") as f:
            f.seek(offset)
            return f.read()

    def klog_size(self) -> int:
        return os.path.getsize(self.klog_path)

    # --- husk-cri ---------------------------------------------------------------------------------------
    def restart_cri(self, kill9: bool = False) -> None:
        if kill9:
            self.cri.kill9()
        else:
            self.cri.stop()
        self.cri.start()

    # --- manifests and kubelet's view ----------------------------------------------------------------------
    def add_pod(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        tmp = os.path.join(self.kdir, f".{name}.json")
        with open(tmp, "w") as f:
            json.dump(pod, f, indent=1)
        os.rename(tmp, os.path.join(self.manifests, f"{name}.json"))

    def remove_pod(self, name: str) -> None:
        try:
            os.unlink(os.path.join(self.manifests, f"{name}.json"))
        except FileNotFoundError:
            pass

    def pods(self) -> dict[str, dict[str, Any]]:
        """kubelet's /pods by manifest name (the static pod's name less `-<node>`)."""
        doc = json.loads(http_get("/pods"))
        out = {}
        for p in doc.get("items") or []:
            n = p["metadata"]["name"]
            out[n[:-len(NODE) - 1] if n.endswith("-" + NODE) else n] = p
        return out

    def pod(self, name: str) -> dict[str, Any] | None:
        return self.pods().get(name)

    def metrics(self, path: str = "/metrics") -> str:
        return http_get(path, 30).decode()

    def summary(self) -> dict[str, Any]:
        return json.loads(http_get("/stats/summary", 30))

    # --- CRI --------------------------------------------------------------------------------------------
    def rt(self) -> Any:
        return self.cri.runtime_stub()

    def img(self) -> Any:
        return self.cri.image_stub()

    def cri_sandboxes(self, name: str | None = None) -> list[Any]:
        from cri_server.api.v1 import api_pb2 as pb
        items = self.rt().ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items
        return [s for s in items if name is None or s.metadata.name == f"{name}-{NODE}"]

    def cri_containers(self, pod: str | None = None, container: str | None = None) -> list[Any]:
        from cri_server.api.v1 import api_pb2 as pb
        items = self.rt().ListContainers(pb.ListContainersRequest(), timeout=30).containers
        return [c for c in items
                if (pod is None or c.labels.get("io.kubernetes.pod.name") == f"{pod}-{NODE}")
                and (container is None or c.metadata.name == container)]

    def container_status(self, cid: str) -> Any:
        from cri_server.api.v1 import api_pb2 as pb
        return self.rt().ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=30)

    def container_pid(self, cid: str) -> int:
        info = json.loads(self.container_status(cid).info.get("info", "{}"))
        return int(info.get("pid") or 0)

    # --- tear-down --------------------------------------------------------------------------------------
    def close(self) -> list[str]:
        """Removes everything; returns what was left behind (empty when the stop was clean)."""
        from cri_server import fsutil
        from tests.support.cri import remove_cgroup_tree
        problems: list[str] = []
        try:
            if self.kproc is not None and self.kproc.poll() is None and os.path.isdir(self.manifests):
                for n in os.listdir(self.manifests):
                    os.unlink(os.path.join(self.manifests, n))
                try:
                    wait_for("kubelet to stop every pod", lambda: not self.cri_running(), 120, 1)
                except Failed as e:
                    problems.append(str(e))
        except OSError as e:
            problems.append(f"removing the manifests: {e}")
        self.stop_kubelet()
        if self.cri is not None:
            self.cri.cleanup()
        if os.path.isdir(self.kroot):
            fsutil.unmount_all(self.kroot)
        for t, v in self._tunables.items():
            try:
                with open(f"/proc/sys/{t}", "w") as f:
                    f.write(v)
            except OSError as e:
                problems.append(f"restoring /proc/sys/{t}={v}: {e}")
        if self.net is not None:
            self.net.cleanup()
        if self.reg is not None:
            self.reg.stop()
        remove_cgroup_tree(self.cgroup_root)
        for link in self.log_links():
            os.unlink(link)
        if not self._had_container_logs:
            try:
                os.rmdir(CONTAINER_LOGS)
            except OSError:
                pass
        problems += self.leftovers()
        if self.kdir and os.path.isdir(self.kroot):
            shutil.rmtree(self.kroot, ignore_errors=True)
        return problems

    def cri_running(self) -> bool:
        from cri_server.api.v1 import api_pb2 as pb
        try:
            cs = self.cri_containers()
            ss = self.cri_sandboxes()
        except Exception:  # noqa: BLE001 -- husk-cri down: nothing to wait for
            return False
        return any(c.state == pb.CONTAINER_RUNNING for c in cs) or any(s.state == pb.SANDBOX_READY for s in ss)

    def log_links(self) -> list[str]:
        """kubelet's /var/log/containers links into this run's pod log dir."""
        out = []
        if os.path.isdir(CONTAINER_LOGS):
            for n in os.listdir(CONTAINER_LOGS):
                p = os.path.join(CONTAINER_LOGS, n)
                if os.path.islink(p) and os.readlink(p).startswith(self.pod_logs + "/"):
                    out.append(p)
        return out

    def leftovers(self) -> list[str]:
        out: list[str] = [f"log link left: {p}" for p in self.log_links()]
        roots = [self.out, self.cgroup_root]
        if self.cri is not None:
            roots.append(self.cri.state)
        from runtime import mountinfo
        for m in mountinfo.read():
            mp = m.point
            if any(mp.startswith(r + "/") or mp == r for r in roots if r.startswith("/") and len(r) > 5
                   and r != self.cgroup_root):
                out.append(f"mount left: {mp}")
        for ctrl in os.listdir("/sys/fs/cgroup"):
            d = os.path.join("/sys/fs/cgroup", ctrl, self.cgroup_root.lstrip("/"))
            if os.path.isdir(d):
                out.append(f"cgroup left: {d}")
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            if pid == os.getpid():
                continue
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                with open(f"/proc/{pid}/cgroup") as f:
                    cg = f.read()
            except OSError:
                continue
            mine = [r for r in roots if r and (cwd.startswith(r + "/") or r in cmd or f":{r}/" in cg)]
            if mine and "docker-registry" not in cmd:
                out.append(f"process left: {pid} {cmd[:120]}")
        if self.cri is not None and os.path.isdir(os.path.join(self.cri.state, "netns")):
            out.append(f"netns dir left: {os.path.join(self.cri.state, 'netns')}")
        if self.net is not None and os.path.exists(f"/sys/class/net/{self.net.bridge}"):
            out.append(f"bridge left: {self.net.bridge}")
        for t, v in self._tunables.items():
            with open(f"/proc/sys/{t}") as f:
                if f.read().strip() != v:
                    out.append(f"/proc/sys/{t} not restored to {v}")
        return out
