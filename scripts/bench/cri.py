#!/usr/bin/env python3
"""CRI latencies and memory: husk-cri side by side with containerd 1.6's CRI plugin (a private containerd),
driven by the same Python gRPC client in the same run, images from one local registry.

Per runtime, N rounds (alternating between the runtimes): RunPodSandbox; CreateContainer+StartContainer of
busybox `sleep 3600`; StopPodSandbox+RemovePodSandbox of that pod. Medians (and min/max) in ms. Then memory:
the daemon's RSS/PSS with 0 pods and with P pods (one sleeping container each), and the shims' PSS.

Burst mode (`--burst N --parallel P`), as kubelet starts pods: N pods (RunPodSandbox, CreateContainer,
StartContainer of busybox `sleep 3600` each) started by P concurrent clients, wall time and pods/s, the shims'
memory with the N pods up, then the N pods torn down (StopPodSandbox+RemovePodSandbox) by P clients; repeated
--repeat times, husk-cri and containerd interleaved (h, c, c, h, h, c...), medians reported with the ratio
husk/containerd. With the pods up, husk-cri's start-up trace of each (verbose PodSandboxStatus/ContainerStatus,
cri_server/trace.py) is read: per step, median/p90/max and the summed time over all bursts, i.e. which steps
stretch when P pods start at once. The latency rounds and the memory steps above are skipped in that mode.

Usage: scripts/bench/cri [--rounds 20] [--pods 20] [--out DIR] [--runtime in-process|runc] [--log-level warn]
       scripts/bench/cri --burst 40 --parallel 8 [--repeat 2] [...]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Appended, not prepended: husk itself comes from the installed (byte-compiled) copy the wrapper made; only
# tests/support (the registry and daemon helpers) is taken from the repository.
sys.path.append(TOP)

SANDBOX_IMAGE = "registry.k8s.io/pause:3.9-husk"
BUSYBOX = "docker.io/library/busybox:latest"
MIRRORED = ("registry.k8s.io", "docker.io")

CONTAINERD_CONFIG = """version = 2
root = "{d}/root"
state = "{d}/state"
oom_score = 0
[grpc]
  address = "{d}/c.sock"
[ttrpc]
  address = "{d}/c.sock.ttrpc"
[debug]
  level = "warn"
[metrics]
  address = ""
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{d}/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{sandbox}"
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_selinux = false
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "{d}/state/runc"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "{cni}"
      max_conf_num = 1
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "{certs}"
"""


class CriContainerd:
    """containerd 1.6 with its CRI plugin, everything under a short private dir, stopped by its pid."""

    def __init__(self, d: str, cni_conf_dir: str, certs: str) -> None:
        self.d = d
        self.socket = os.path.join(d, "c.sock")
        self.proc: subprocess.Popen[bytes] | None = None
        os.makedirs(d, exist_ok=True)
        self.conf = os.path.join(d, "config.toml")
        with open(self.conf, "w") as f:
            f.write(CONTAINERD_CONFIG.format(d=d, sandbox=SANDBOX_IMAGE, cni=cni_conf_dir, certs=certs))

    def start(self) -> None:
        logf = open(os.path.join(self.d, "containerd.log"), "ab")
        self.proc = subprocess.Popen(["containerd", "--config", self.conf], stdout=logf, stderr=logf)
        logf.close()
        for _ in range(400):
            if os.path.exists(self.socket):
                return
            time.sleep(0.05)
        raise RuntimeError(f"containerd did not start; see {self.d}/containerd.log")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cleanup(self) -> None:
        from cri_server import fsutil
        self.stop()
        for pid in _pids_with(self.d):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        runc_root = os.path.join(self.d, "state", "runc")
        if os.path.isdir(runc_root):
            for ns in os.listdir(runc_root):
                ids = subprocess.run(["runc", "--root", os.path.join(runc_root, ns), "list", "-q"],
                                     capture_output=True, text=True).stdout.split()
                for cid in ids:
                    subprocess.run(["runc", "--root", os.path.join(runc_root, ns), "delete", "--force", cid],
                                   capture_output=True)
        fsutil.unmount_all(self.d)
        subprocess.run(["rm", "-rf", self.d], check=False)


def _pids_with(text: str) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if text.encode() in cmd:
            out.append(int(p))
    return out


def _children(pid: int) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        try:
            with open(f"/proc/{p}/stat") as f:
                if p.isdigit() and int(f.read().rpartition(")")[2].split()[1]) == pid:
                    out.append(int(p))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _memory(pid: int) -> dict[str, int]:
    """VmRSS and, from smaps_rollup, Pss and anonymous RSS, in kB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "RssAnon:")):
                out[line.split(":")[0]] = int(line.split()[1])
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1])
    return out


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 1), "min": round(min(xs), 1), "max": round(max(xs), 1),
            "n": len(xs)}


class Driver:
    def __init__(self, name: str, socket: str, cgroup_parent: str, log_root: str) -> None:
        import grpc

        from cri_server.api.v1 import api_pb2_grpc as rpc
        self.name = name
        self.socket = socket
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.rt = rpc.RuntimeServiceStub(self.channel)
        self.im = rpc.ImageServiceStub(self.channel)
        self.cgroup_parent = cgroup_parent
        self.log_root = log_root
        self.times: dict[str, list[float]] = {"run": [], "create": [], "start": [], "create_start": [],
                                              "stop_remove": []}
        self.shim_memory: Any = None      # () -> the shims' memory (_shim_memory), set by main()

    def pull(self, ref: str) -> None:
        from cri_server.api.v1 import api_pb2 as pb
        self.im.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=300)

    def pod(self, name: str):  # type: ignore[no-untyped-def]
        from cri_server.api.v1 import api_pb2 as pb
        c = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name=name, namespace="bench", uid=name, attempt=0),
                                hostname=name, log_directory=os.path.join(self.log_root, name),
                                labels={"io.kubernetes.pod.name": name})
        c.linux.cgroup_parent = self.cgroup_parent
        c.linux.security_context.namespace_options.pid = pb.CONTAINER
        return c

    def run_pod_with_container(self, name: str, record: bool) -> str:
        from cri_server.api.v1 import api_pb2 as pb
        cfg = self.pod(name)
        t0 = time.perf_counter()
        pod_id = self.rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=120).pod_sandbox_id
        t1 = time.perf_counter()
        cc = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="sleep"), image=pb.ImageSpec(image=BUSYBOX),
                                command=["sleep", "3600"], log_path="sleep.log")
        cc.linux.security_context.namespace_options.pid = pb.CONTAINER
        cid = self.rt.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=cc,
                                                                sandbox_config=cfg), timeout=120).container_id
        t_created = time.perf_counter()
        self.rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=120)
        t2 = time.perf_counter()
        if record:
            self.times["run"].append((t1 - t0) * 1e3)
            self.times["create"].append((t_created - t1) * 1e3)
            self.times["start"].append((t2 - t_created) * 1e3)
            self.times["create_start"].append((t2 - t1) * 1e3)
        return pod_id

    def remove_pod(self, pod_id: str, record: bool) -> None:
        from cri_server.api.v1 import api_pb2 as pb
        t0 = time.perf_counter()
        self.rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=120)
        self.rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=120)
        if record:
            self.times["stop_remove"].append((time.perf_counter() - t0) * 1e3)

    def remove_all(self) -> None:
        from cri_server.api.v1 import api_pb2 as pb
        for p in self.rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=60).items:
            self.remove_pod(p.id, False)


def _burst_once(d: Driver, n: int, parallel: int, prefix: str) -> dict:
    """Starts n pods (sandbox + one container) with `parallel` concurrent clients, measures the shims' memory
    with all up, tears them down the same way. Wall times in s; failures counted, never fatal."""
    lock = threading.Lock()
    per_pod: list[float] = []
    errors: list[str] = []

    def up(i: int) -> str | None:
        t0 = time.perf_counter()
        try:
            pod_id = d.run_pod_with_container(f"{prefix}-{i}", False)
        except Exception as e:  # noqa: BLE001 -- counted and reported, the burst goes on
            with lock:
                errors.append(f"start {prefix}-{i}: {e}")
            return None
        with lock:
            per_pod.append((time.perf_counter() - t0) * 1e3)
        return pod_id

    def down(pod_id: str) -> None:
        try:
            d.remove_pod(pod_id, False)
        except Exception as e:  # noqa: BLE001
            with lock:
                errors.append(f"remove {pod_id[:12]}: {e}")

    with ThreadPoolExecutor(parallel) as ex:
        t0 = time.perf_counter()
        pods = [p for p in ex.map(up, range(n)) if p]
        t_up = time.perf_counter() - t0
        mem = d.shim_memory() if d.shim_memory is not None else {}
        steps = step_times(d, pods)
        t1 = time.perf_counter()
        list(ex.map(down, pods))
        t_down = time.perf_counter() - t1
    return {"start_s": round(t_up, 2), "pods_per_s": round(len(pods) / t_up, 2) if t_up else 0.0,
            "teardown_s": round(t_down, 2), "started": len(pods), "errors": errors[:10], "n_errors": len(errors),
            "per_pod_ms": _stats(per_pod) if per_pod else {}, "shims": mem, "steps": steps}


def step_times(d: Driver, pods: list[str]) -> dict[str, list[float]]:
    """husk-cri's start-up trace of each pod's sandbox and containers (verbose status, info "trace"):
    "<kind>:<step>" -> the durations in ms, top-level steps only (nested ones as "<kind>:<parent>/<step>").
    Empty for a daemon that keeps no trace (containerd)."""
    from cri_server.api.v1 import api_pb2 as pb
    out: dict[str, list[float]] = {}

    def add(kind: str, info: Any) -> None:
        raw = info.get("trace")
        if not raw:
            return
        steps = json.loads(raw)
        steps = steps.get("steps", steps) if isinstance(steps, dict) else steps
        for st in steps:
            name = st["name"]
            if st.get("parent", -1) >= 0:
                name = f"{steps[st['parent']]['name']}/{name}"
            out.setdefault(f"{kind}:{name}", []).append(st.get("duration", 0) / 1e6)

    for pod_id in pods:
        try:
            add("sandbox", d.rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True),
                                                 timeout=30).info)
            for c in d.rt.ListContainers(pb.ListContainersRequest(
                    filter=pb.ContainerFilter(pod_sandbox_id=pod_id)), timeout=30).containers:
                add("container", d.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=c.id, verbose=True),
                                                      timeout=30).info)
        except Exception:  # noqa: BLE001 -- a pod that went away has no trace; the burst goes on
            continue
    return out


def run_burst(drivers: list[Driver], n: int, parallel: int, repeat: int, tag: str,
              log: Any) -> dict:
    """--repeat bursts per driver, interleaved (ABBA...), so that a change in the machine's load hits both."""
    runs: dict[str, list[dict]] = {d.name: [] for d in drivers}
    for d in drivers:       # one pod each first: nothing in the bursts is a first time (caches, snapshots)
        d.remove_pod(d.run_pod_with_container(f"w-{tag}", False), False)
    seq = 0
    for r in range(repeat):
        for d in (drivers if r % 2 == 0 else list(reversed(drivers))):
            res = _burst_once(d, n, parallel, f"u{r}-{tag}")
            res["load"] = round(os.getloadavg()[0], 2)
            res["seq"] = seq
            seq += 1
            runs[d.name].append(res)
            log(f"burst {r + 1}/{repeat} {d.name}: {res['started']}/{n} pods in {res['start_s']} s "
                f"({res['pods_per_s']} pods/s), teardown {res['teardown_s']} s, {res['n_errors']} errors")
    steps: dict[str, list[float]] = {}
    for d in drivers:
        for res in runs[d.name]:
            for k, v in res.pop("steps", {}).items():
                steps.setdefault(k, []).extend(v)
    out: dict = {"n": n, "parallel": parallel, "repeat": repeat, "runs": runs, "median": {},
                 "steps_ms": {k: {"median": round(statistics.median(v), 1), "p90": round(_pct(v, 90), 1),
                                  "max": round(max(v), 1), "sum_s": round(sum(v) / 1e3, 2), "n": len(v)}
                              for k, v in steps.items()}}
    for name, rs in runs.items():
        med = {k: round(statistics.median(x[k] for x in rs), 2) for k in ("start_s", "teardown_s")}
        med["pods_per_s"] = round(n / med["start_s"], 2) if med["start_s"] else 0.0   # of the median start
        out["median"][name] = med
    return out


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(-(-len(s) * q // 100)) - 1))]


def _shim_memory(pids: list[int]) -> dict:
    ms = []
    for p in pids:
        try:
            ms.append(_memory(p))
        except OSError:
            continue
    if not ms:
        return {}
    return {"count": len(ms), "Pss_median": statistics.median(m["Pss"] for m in ms),
            "Pss_sum": sum(m["Pss"] for m in ms), "VmRSS_median": statistics.median(m["VmRSS"] for m in ms)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(),
                                                  f"husk-bench-cri-{time.strftime('%Y%m%dT%H%M%S')}"))
    ap.add_argument("--runtime", default="in-process", help="husk-cri's runtime: in-process (husk) or runc")
    ap.add_argument("--skip-containerd", action="store_true")
    ap.add_argument("--log-level", default="warn",
                    help="husk-cri's log level (containerd runs at warn here: the same by default)")
    ap.add_argument("--burst", type=int, default=0, metavar="N",
                    help="burst mode: start N pods with --parallel clients, then tear them down")
    ap.add_argument("--parallel", type=int, default=10, metavar="P", help="concurrent clients in burst mode")
    ap.add_argument("--repeat", type=int, default=2, help="bursts per runtime, interleaved (burst mode)")
    a = ap.parse_args()
    if a.burst and a.parallel < 1:
        ap.error("--parallel must be at least 1")
    # A SIGTERM (e.g. from `timeout`) must still run the cleanup below: raise instead of dying.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, _f: sys.exit(128 + n))
    os.makedirs(a.out, exist_ok=True)

    from cri_server.images import testimages
    from tests.support.cri import CriDaemon, PodNetwork
    from tests.support.registry import LocalRegistry, write_hosts_toml

    def log(msg: str) -> None:
        print(f"bench-cri: {msg}", file=sys.stderr, flush=True)

    layouts = os.path.join(TOP, ".cache", "bench-cri-layouts")
    index = testimages.build(layouts, only=["busybox", "pause-sandbox"], big=False, log=lambda *_: None)
    reg = LocalRegistry(os.path.join(a.out, "registry"))
    tag = uuid.uuid4().hex[:6]
    husk_net = ctd_net = husk = ctd = None
    drivers: list[Driver] = []
    results: dict = {"rounds": a.rounds, "pods": a.pods, "husk_runtime": a.runtime,
                     "load_before": os.getloadavg()}
    try:
        reg.start()
        reg.push(os.path.join(layouts, index["busybox"]["layout"]), "library/busybox:latest")
        reg.push(os.path.join(layouts, index["pause-sandbox"]["layout"]), "pause:3.9-husk")
        certs = os.path.join(a.out, "certs.d")
        for h in MIRRORED:
            write_hosts_toml(certs, h, f"http://{reg.addr}")
        husk_net = PodNetwork(os.path.join(a.out, "husk-net"))
        husk = CriDaemon(os.path.join(a.out, "husk"), husk_net, certs, SANDBOX_IMAGE, runtime=a.runtime,
                         log_level=a.log_level)
        husk.start()
        drivers.append(Driver("husk-cri", husk.socket, f"/hcb-husk-{tag}", os.path.join(a.out, "logs")))
        drivers[0].shim_memory = lambda: _shim_memory(husk.shim_pids())
        if not a.skip_containerd:
            ctd_net = PodNetwork(os.path.join(a.out, "ctd-net"))
            ctd = CriContainerd(f"/run/hcb-{tag}", ctd_net.conf_dir, certs)
            ctd.start()
            drivers.append(Driver("containerd-1.6", ctd.socket, f"/hcb-ctd-{tag}", os.path.join(a.out, "logs")))
            ctd_dir = ctd.d
            drivers[1].shim_memory = lambda: _shim_memory([p for p in _pids_with("containerd-shim-runc-v2")
                                                           if _is_under(p, ctd_dir)])
        for d in drivers:
            d.pull(SANDBOX_IMAGE)
            d.pull(BUSYBOX)
        if a.burst:
            results["burst"] = run_burst(drivers, a.burst, a.parallel, a.repeat, tag, log)
            results["load_after"] = os.getloadavg()
        else:
            log(f"warm-up and {a.rounds} rounds on {', '.join(d.name for d in drivers)}")
            for i in range(a.warmup + a.rounds):
                for d in (drivers if i % 2 == 0 else list(reversed(drivers))):
                    pod_id = d.run_pod_with_container(f"b{i}-{tag}", i >= a.warmup)
                    d.remove_pod(pod_id, i >= a.warmup)
            results["latency_ms"] = {d.name: {k: _stats(v) for k, v in d.times.items()} for d in drivers}

            # Memory: a freshly restarted husk-cri with no pods, then P pods with one container each.
            husk.stop()
            husk.start()
            drivers[0] = Driver("husk-cri", husk.socket, drivers[0].cgroup_parent, drivers[0].log_root)
            time.sleep(3)
            mem: dict = {"husk-cri": {"0 pods": _memory(husk.proc.pid)}}
            if ctd is not None:
                mem["containerd-1.6"] = {"0 pods": _memory(ctd.proc.pid)}
            for d in drivers:
                for i in range(a.pods):
                    d.run_pod_with_container(f"m{i}-{tag}", False)
            time.sleep(3)
            mem["husk-cri"][f"{a.pods} pods"] = _memory(husk.proc.pid)
            spawners = _children(husk.proc.pid)      # the spawner (zygote) is husk-cri's only child
            if spawners:
                mem["husk-cri's spawner"] = {f"{a.pods} pods": _memory(spawners[0])}
            shims = [_memory(p) for p in husk.shim_pids()]
            mem["husk-shim"] = {"count": len(shims), "Pss_median": statistics.median(s["Pss"] for s in shims),
                                "Pss_sum": sum(s["Pss"] for s in shims),
                                "VmRSS_median": statistics.median(s["VmRSS"] for s in shims)}
            if ctd is not None:
                mem["containerd-1.6"][f"{a.pods} pods"] = _memory(ctd.proc.pid)
                cshims = [_memory(p) for p in _pids_with("containerd-shim-runc-v2") if _is_under(p, ctd.d)]
                if cshims:
                    mem["containerd-shim-runc-v2"] = {"count": len(cshims),
                                                      "Pss_median": statistics.median(s["Pss"] for s in cshims),
                                                      "Pss_sum": sum(s["Pss"] for s in cshims),
                                                      "VmRSS_median": statistics.median(s["VmRSS"] for s in cshims)}
            results["memory_kB"] = mem
            for d in drivers:
                d.remove_all()
            results["load_after"] = os.getloadavg()
    finally:
        teardown(drivers, husk, ctd, (husk_net, ctd_net), reg)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(_burst_table(results["burst"]) if a.burst else _table(results))
    return 0


def teardown(drivers: list, husk: Any, ctd: Any, nets: tuple, reg: Any) -> None:
    """Ends a benchmark's bed: the clients, husk-cri, containerd, the pod networks, the registry and the pods'
    cgroup parents (scripts/bench/relist.py ends its bed the same way)."""
    from tests.support.cri import remove_cgroup_tree
    for d in drivers:
        d.channel.close()
    if husk is not None:
        husk.cleanup()
    if ctd is not None:
        ctd.cleanup()
    for n in nets:
        if n is not None:
            n.cleanup()
    reg.stop()
    for d in drivers:
        remove_cgroup_tree(d.cgroup_parent)


def _is_under(pid: int, d: str) -> bool:
    """A containerd shim of our containerd: its command line names our containerd's address."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return d.encode() in f.read()
    except OSError:
        return False


def _burst_table(b: dict) -> str:
    names = list(b["median"])
    lines = [f"| {b['n']} pods, {b['parallel']} at a time, median of {b['repeat']} | " + " | ".join(names)
             + (" | husk/containerd |" if len(names) == 2 else " |"), "|---|" + "---|" * (len(names) + (len(names) == 2))]
    for key, label in (("start_s", "start (RunPodSandbox+CreateContainer+StartContainer), s"),
                       ("pods_per_s", "pods/s"), ("teardown_s", "teardown (StopPodSandbox+RemovePodSandbox), s")):
        vals = [b["median"][n][key] for n in names]
        ratio = f" | {vals[0] / vals[1]:.2f}" if len(vals) == 2 and vals[1] else ""
        lines.append(f"| {label} | " + " | ".join(str(v) for v in vals) + ratio + " |")
    lines += ["", "| run (in order) | start s | pods/s | teardown s | per pod ms, median (max) | errors | load | "
              "shims | shim Pss median kB | shims' Pss sum kB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for n, i, r in sorted(((n, i, r) for n in names for i, r in enumerate(b["runs"][n])), key=lambda x: x[2]["seq"]):
        pp, sh = r["per_pod_ms"], r["shims"]
        lines.append(f"| {n} #{i + 1} | {r['start_s']} | {r['pods_per_s']} | {r['teardown_s']} | "
                     f"{pp.get('median')} ({pp.get('max')}) | {r['n_errors']} | {r['load']} | {sh.get('count')} | "
                     f"{sh.get('Pss_median')} | {sh.get('Pss_sum')} |")
    if b.get("steps_ms"):
        lines += ["", "| husk-cri start-up step (trace), all bursts | median ms | p90 ms | max ms | sum s | n |",
                  "|---|---|---|---|---|---|"]
        for k, v in sorted(b["steps_ms"].items(), key=lambda kv: -kv[1]["sum_s"]):
            lines.append(f"| {k} | {v['median']} | {v['p90']} | {v['max']} | {v['sum_s']} | {v['n']} |")
    return "\n".join(lines)


def _table(r: dict) -> str:
    lat = r.get("latency_ms", {})
    names = list(lat)
    lines = [f"| ms, median (min-max) of {r['rounds']} | " + " | ".join(names) + " |",
             "|---|" + "---|" * len(names)]
    for key, label in (("run", "RunPodSandbox"), ("create", "CreateContainer"), ("start", "StartContainer"),
                       ("create_start", "CreateContainer+StartContainer"),
                       ("stop_remove", "StopPodSandbox+RemovePodSandbox")):
        cells = [f"{lat[n][key]['median']} ({lat[n][key]['min']}-{lat[n][key]['max']})" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    mem = r.get("memory_kB", {})
    lines.append("| memory, kB | VmRSS | Pss | RssAnon |")
    lines.append("|---|---|---|---|")
    for name, by in mem.items():
        if "count" in by:
            lines.append(f"| {name} (median of {by['count']}) | {by['VmRSS_median']} | {by['Pss_median']} "
                         f"(sum {by['Pss_sum']}) | |")
            continue
        for when, m in by.items():
            lines.append(f"| {name}, {when} | {m.get('VmRSS')} | {m.get('Pss')} | {m.get('RssAnon')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
