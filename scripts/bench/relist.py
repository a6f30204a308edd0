#!/usr/bin/env python3
"""husk-cri's own cost next to containerd 1.6's CRI plugin: daemon memory at 0, 20 and N pods, then CPU time and
List* latencies while a client relists as kubelet does.

Both daemons run side by side (scripts/bench/cri.py's launcher, driver and pod/container creation): N pods
(sandbox + one busybox `sleep 3600` each, created alternately on both) with the daemon's PSS read at 0, 20 and
N pods. Then the relisting client relists as kubelet does, against each daemon in turn in --slice second
slices (alternating, so a change in the machine's load falls on both), --seconds in all per daemon: its PLEG
(ListPodSandbox, ListContainers) and its stats provider (ListPodSandboxStats, ListContainerStats) are two
concurrent callers, the stats one once per --interval, the PLEG one waiting --interval * U(0.75, 1.25) after
each relist, so PLEG calls fall at every phase of the stats calls (a List that waits behind a stats sweep
shows). The PLEG caller is a process of its own (until stop 15 a thread of the stats caller's: its timings then
included the GIL held while the stats responses were decoded, which a Go kubelet does not pay). --sequential: one caller making the four calls one after the other per --interval (before 2026-12-02
the only mode; a List never overlapped a stats call then). Per daemon: utime+stime from /proc/<pid>/stat (the
process's own threads, children excluded) of the daemon, of husk-cri's spawner, and summed over the shims
(husk-shim, or containerd-shim-runc-v2); p50/p99/max of each RPC. Everything is torn down at the end.

After the window, --back-to-back N calls of ListPodSandbox and of ListContainers in a tight loop per daemon
give the per-call latency without the wake-up from a second of idling, and --idle-calls N Version calls per
daemon, each after idling as the PLEG caller does, the floor under the relisting latencies (the cheapest RPC
after the same idle: thread wake-ups on both sides, no work), with a bare grpc.aio server (nothing behind it)
taken in turn with them: what any Python CRI server on this grpcio pays before its own code runs.

Usage: scripts/bench/relist [--pods 100] [--seconds 300] [--slice 30] [--interval 1] [--back-to-back 200]
                            [--idle-calls 40] [--sequential] [--rpcs ListPodSandbox,ListContainers,...] [--out DIR]
                            [--runtime in-process|runc] [--skip-containerd] [--log-level warn] [--py-spy FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cri  # noqa: E402  (scripts/bench/cri.py: launcher, driver, memory helpers; it puts the repo on sys.path)

CLK_TCK = os.sysconf("SC_CLK_TCK")
RPCS = ("ListPodSandbox", "ListContainers", "ListPodSandboxStats", "ListContainerStats")


def log(msg: str) -> None:
    print(f"bench-relist: {msg}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """utime+stime of `pid` (all its threads, not its children), seconds; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    # After "(comm)": state is field 3, utime 14 and stime 15 (1-based), so indexes 11 and 12 here.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children_named(ppid: int, prefix: str) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        if int(s.rpartition(")")[2].split()[1]) == ppid and comm.startswith(prefix):
            out.append(int(p))
    return out


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile of `xs` (q in 0..100)."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))
    return s[int(k)]


def back_to_back(side: "Side", n: int) -> dict:
    """ListPodSandbox and ListContainers called `n` times each in a tight loop: the per-call cost without the
    wake-up after a second of idling (on a loaded machine that wake-up is most of the relist latency)."""
    from cri_server.api.v1 import api_pb2 as pb
    rt = side.driver.rt
    out = {}
    for name, call in (("ListPodSandbox", lambda: rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30)),
                       ("ListContainers", lambda: rt.ListContainers(pb.ListContainersRequest(), timeout=30))):
        xs = []
        for _ in range(n):
            t0 = time.perf_counter()
            call()
            xs.append((time.perf_counter() - t0) * 1e3)
        out[name] = {"p50": round(percentile(xs, 50), 2), "p99": round(percentile(xs, 99), 2), "n": n}
    return out


# A gRPC server with nothing behind it, on the same grpcio as husk-cri (grpc.aio, one event loop): its Version
# after the same idle is what any Python CRI server pays before its own code runs.
BARE_SERVER = """
import asyncio, sys
import grpc
from cri_server.api.v1 import api_pb2 as pb, api_pb2_grpc as rpc
class Runtime(rpc.RuntimeServiceServicer):
    async def Version(self, request, context):
        return pb.VersionResponse(version="0.1.0", runtime_name="bare", runtime_version="0",
                                  runtime_api_version="v1")
async def main():
    server = grpc.aio.server()
    rpc.add_RuntimeServiceServicer_to_server(Runtime(), server)
    server.add_insecure_port("unix://" + sys.argv[1])
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()
asyncio.run(main())
"""


def idle_floor(sides: list["Side"], n: int, interval: float, out_dir: str) -> dict[str, dict]:
    """The floor under the relisting latencies: `n` Version calls per daemon (the cheapest RPC, no work behind
    it), each after idling interval * U(0.75, 1.25) as the PLEG caller does, daemons taken in turn, and a bare
    grpc.aio server's (BARE_SERVER) among them. What a daemon cannot answer faster than after a second of
    idling, on this machine and with this client (the wake-ups of the client's and the daemon's threads), no
    List can."""
    import grpc

    from cri_server.api.v1 import api_pb2 as pb
    from cri_server.api.v1 import api_pb2_grpc as rpc
    sock = os.path.join(out_dir, "bare-grpc.sock")
    bare = subprocess.Popen([sys.executable, "-c", BARE_SERVER, sock], stdout=subprocess.PIPE, text=True)
    try:
        assert bare.stdout is not None
        if bare.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the bare grpc.aio server did not start (exit {bare.wait()})")
        stubs = {s.name: s.driver.rt for s in sides}
        stubs["bare grpc.aio"] = rpc.RuntimeServiceStub(grpc.insecure_channel(f"unix://{sock}"))
        stubs["bare grpc.aio"].Version(pb.VersionRequest(), timeout=30)      # connected before the first reading
        rng = random.Random(7)
        xs: dict[str, list[float]] = {name: [] for name in stubs}
        for _ in range(n):
            for name, stub in stubs.items():
                time.sleep(interval * rng.uniform(0.75, 1.25))
                t0 = time.perf_counter()
                stub.Version(pb.VersionRequest(), timeout=30)
                xs[name].append((time.perf_counter() - t0) * 1e3)
    finally:
        bare.terminate()
        bare.wait()
    return {k: {"p50": round(percentile(v, 50), 2), "p99": round(percentile(v, 99), 2), "max": round(max(v), 2),
                "n": len(v)} for k, v in xs.items() if v}


class Side:
    """One daemon under test: its driver, how to find its processes, what the run measured."""

    def __init__(self, name: str, driver: cri.Driver, daemon_pid: int, helpers: dict) -> None:
        self.name = name
        self.driver = driver
        self.daemon_pid = daemon_pid
        self.helpers = helpers          # group name -> callable returning the pids of that group now
        self.cpu: dict[str, float] = {"daemon": 0.0, **{k: 0.0 for k in helpers}}
        self.lat: dict[str, list[float]] = {r: [] for r in RPCS}
        self.errors: dict[str, str] = {}
        self.items: dict[str, int] = {}
        self.seconds = 0.0
        self.relists = 0
        self.pleg_relists = 0
        self.rpcs = set(RPCS)

    def cpu_now(self) -> dict[str, dict[int, float]]:
        out = {"daemon": {self.daemon_pid: cpu_seconds(self.daemon_pid)}}
        for k, pids in self.helpers.items():
            out[k] = {p: cpu_seconds(p) for p in pids()}
        return out

    def add_cpu(self, before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]) -> None:
        for k in after:
            # Only processes present at both ends count (none start or stop during the relist window).
            self.cpu[k] += sum(after[k][p] - before[k][p] for p in after[k] if p in before[k])

    def calls(self) -> dict[str, Callable[[], int]]:
        from cri_server.api.v1 import api_pb2 as pb
        rt = self.driver.rt
        return {"ListPodSandbox": lambda: len(rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items),
                "ListContainers": lambda: len(rt.ListContainers(pb.ListContainersRequest(), timeout=30).containers),
                "ListPodSandboxStats": lambda: len(rt.ListPodSandboxStats(pb.ListPodSandboxStatsRequest(),
                                                                          timeout=30).stats),
                "ListContainerStats": lambda: len(rt.ListContainerStats(pb.ListContainerStatsRequest(),
                                                                        timeout=30).stats)}

    def relist_once(self, names: tuple[str, ...] = RPCS) -> None:
        import grpc
        calls = self.calls()
        for name in names:
            if name in self.errors or name not in self.rpcs:
                continue
            t0 = time.perf_counter()
            try:
                n = calls[name]()
            except grpc.RpcError as e:
                self.errors[name] = f"{e.code().name}: {e.details()}"
                log(f"{self.name} {name}: {self.errors[name]} (not called again)")
                continue
            self.lat[name].append((time.perf_counter() - t0) * 1e3)
            self.items[name] = n

    def relist(self, seconds: float, interval: float, sequential: bool = False) -> None:
        """Relists for `seconds`. sequential: the four calls one after the other once per interval. Else as
        kubelet: its PLEG (ListPodSandbox, ListContainers) and its stats provider (ListPodSandboxStats,
        ListContainerStats) are separate callers; the stats caller runs once per interval, the PLEG caller
        waits interval * U(0.75, 1.25) after each relist (kubelet waits a period after the relist ends), so
        its calls fall at every phase of the stats calls, sometimes in the middle of them."""
        before = self.cpu_now()
        t_start = time.monotonic()
        if sequential:
            self.relists += self._ticking(RPCS, t_start, seconds, interval)
        else:
            # The PLEG caller is another process: in this one it would share the GIL with the stats caller, and
            # its timings would include the stats responses' decoding (kubelet, in Go, has no such lock)
            pleg = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--_pleg", self.driver.socket,
                                     str(seconds), str(interval), str(self.relists), ",".join(sorted(self.rpcs))],
                                    stdout=subprocess.PIPE, text=True)
            assert pleg.stdout is not None
            if pleg.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{self.name}: the PLEG caller did not start (exit {pleg.wait()})")
            t_start = time.monotonic()
            self.relists += self._ticking(RPCS[2:], t_start, seconds, interval)
            got = json.loads(pleg.stdout.read())
            pleg.wait()
            for name, values in got["lat"].items():
                self.lat[name].extend(values)
            for name, err in got["errors"].items():
                self.errors.setdefault(name, err)
            self.pleg_relists += got["relists"]
        self.seconds += time.monotonic() - t_start
        self.add_cpu(before, self.cpu_now())

    def _ticking(self, names: tuple[str, ...], t_start: float, seconds: float, interval: float) -> int:
        n = 0
        tick = t_start
        while time.monotonic() - t_start < seconds:
            self.relist_once(names)
            n += 1
            tick += interval
            delay = tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                tick = time.monotonic()     # late: no burst of catch-up relists
        return n

    def summary(self) -> dict:
        lat = {r: {"p50": round(percentile(v, 50), 2), "p99": round(percentile(v, 99), 2),
                   "max": round(max(v), 2), "n": len(v)} for r, v in self.lat.items() if v}
        return {"cpu_s": {k: round(v, 2) for k, v in self.cpu.items()}, "window_s": round(self.seconds, 1),
                "relists": self.relists, "pleg_relists": self.pleg_relists,
                "latency_ms": lat, "items": self.items, "errors": self.errors}


def pleg_caller(socket: str, seconds: float, interval: float, seed: int, rpcs: set[str]) -> int:
    """The PLEG caller's process (`relist.py --_pleg SOCKET SECONDS INTERVAL SEED RPCS`): ListPodSandbox and
    ListContainers, then a wait of interval * U(0.75, 1.25), for `seconds` after it prints "ready"; then its
    latencies as JSON on stdout."""
    import grpc

    from cri_server.api.v1 import api_pb2 as pb
    from cri_server.api.v1 import api_pb2_grpc as rpc
    rt = rpc.RuntimeServiceStub(grpc.insecure_channel(f"unix://{socket}"))
    calls = {"ListPodSandbox": lambda: rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30),
             "ListContainers": lambda: rt.ListContainers(pb.ListContainersRequest(), timeout=30)}
    calls = {k: v for k, v in calls.items() if k in rpcs}
    rt.Version(pb.VersionRequest(), timeout=30)   # connected before the window
    print("ready", flush=True)
    lat: dict[str, list[float]] = {k: [] for k in calls}
    errors: dict[str, str] = {}
    rng = random.Random(seed)
    relists = 0
    t_start = time.monotonic()
    while time.monotonic() - t_start < seconds:
        for name, call in calls.items():
            if name in errors:
                continue
            t0 = time.perf_counter()
            try:
                call()
            except grpc.RpcError as e:
                errors[name] = f"{e.code().name}: {e.details()}"
                continue
            lat[name].append((time.perf_counter() - t0) * 1e3)
        relists += 1
        time.sleep(interval * rng.uniform(0.75, 1.25))
    print(json.dumps({"lat": lat, "errors": errors, "relists": relists}), flush=True)
    return 0


def pss(pids: list[int]) -> int:
    total = 0
    for p in pids:
        try:
            total += cri._memory(p)["Pss"]
        except (OSError, KeyError):
            continue
    return total


def main() -> int:
    if sys.argv[1:2] == ["--_pleg"]:
        sock, seconds, interval, seed, rpcs = sys.argv[2:7]
        return pleg_caller(sock, float(seconds), float(interval), int(seed), set(rpcs.split(",")))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=300, help="relisting time per daemon")
    ap.add_argument("--slice", type=float, default=30, help="relist one daemon this long, then the other")
    ap.add_argument("--interval", type=float, default=1.0, help="one relist (the four RPCs) per interval")
    ap.add_argument("--sequential", action="store_true",
                    help="one client calling the four RPCs one after the other (the default: kubelet's PLEG and "
                         "stats provider as two concurrent callers)")
    ap.add_argument("--back-to-back", type=int, default=200, metavar="N",
                    help="then N ListPodSandbox and N ListContainers in a tight loop per daemon")
    ap.add_argument("--idle-calls", type=int, default=40, metavar="N",
                    help="then N Version calls per daemon, each after idling about --interval: the floor of an "
                         "RPC after a second of idling, on this machine and with this client")
    ap.add_argument("--rpcs", default=",".join(RPCS), help="the RPCs a relist makes (comma-separated)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds before each memory reading")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(),
                                                  f"husk-bench-relist-{time.strftime('%Y%m%dT%H%M%S')}"))
    ap.add_argument("--runtime", default="in-process", help="husk-cri's runtime: in-process (husk) or runc")
    ap.add_argument("--skip-containerd", action="store_true")
    ap.add_argument("--log-level", default="warn")
    ap.add_argument("--py-spy", default="", metavar="FILE",
                    help="profile husk-cri with py-spy (raw folded stacks to FILE) during its relist slices; "
                         "the sampling costs the daemon CPU, so its CPU figures are not comparable then")
    a = ap.parse_args()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, _f: sys.exit(128 + n))
    os.makedirs(a.out, exist_ok=True)

    from cri_server.images import testimages
    from tests.support.cri import CriDaemon, PodNetwork
    from tests.support.registry import LocalRegistry, write_hosts_toml

    layouts = os.path.join(cri.TOP, ".cache", "bench-cri-layouts")
    index = testimages.build(layouts, only=["busybox", "pause-sandbox"], big=False, log=lambda *_: None)
    reg = LocalRegistry(os.path.join(a.out, "registry"))
    tag = uuid.uuid4().hex[:6]
    husk_net = ctd_net = husk = ctd = None
    sides: list[Side] = []
    results: dict = {"pods": a.pods, "seconds": a.seconds, "slice": a.slice, "interval": a.interval,
                     "client": "sequential" if a.sequential else "kubelet (PLEG and stats concurrent)",
                     "husk_runtime": a.runtime, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "cpus": os.cpu_count(), "load_before": os.getloadavg()}
    try:
        reg.start()
        reg.push(os.path.join(layouts, index["busybox"]["layout"]), "library/busybox:latest")
        reg.push(os.path.join(layouts, index["pause-sandbox"]["layout"]), "pause:3.9-husk")
        certs = os.path.join(a.out, "certs.d")
        for h in cri.MIRRORED:
            write_hosts_toml(certs, h, f"http://{reg.addr}")
        husk_net = PodNetwork(os.path.join(a.out, "husk-net"))
        husk = CriDaemon(os.path.join(a.out, "husk"), husk_net, certs, cri.SANDBOX_IMAGE, runtime=a.runtime,
                         log_level=a.log_level)
        husk.start()
        hpid = husk.proc.pid
        sides.append(Side("husk-cri", cri.Driver("husk-cri", husk.socket, f"/hcb-husk-{tag}",
                                                 os.path.join(a.out, "logs")), hpid,
                          {"spawner": lambda: children_named(hpid, "husk-cri-spawn"), "shims": husk.shim_pids}))
        if not a.skip_containerd:
            ctd_net = PodNetwork(os.path.join(a.out, "ctd-net"))
            ctd = cri.CriContainerd(f"/run/hcb-{tag}", ctd_net.conf_dir, certs)
            ctd.start()
            ctd_dir = ctd.d
            sides.append(Side("containerd-1.6", cri.Driver("containerd-1.6", ctd.socket, f"/hcb-ctd-{tag}",
                                                           os.path.join(a.out, "logs")), ctd.proc.pid,
                              {"shims": lambda: [p for p in cri._pids_with("containerd-shim-runc-v2")
                                                 if cri._is_under(p, ctd_dir)]}))
        for s in sides:
            s.rpcs = set(a.rpcs.split(","))
            s.driver.pull(cri.SANDBOX_IMAGE)
            s.driver.pull(cri.BUSYBOX)

        # Memory at 0, 20 and N pods (and the shims' PSS summed).
        checkpoints = sorted({0, min(20, a.pods), a.pods})
        mem: dict = {s.name: {} for s in sides}

        def read_memory(n: int) -> None:
            time.sleep(a.settle)
            for s in sides:
                m = cri._memory(s.daemon_pid)
                m["shims_Pss_sum"] = pss(s.helpers["shims"]())
                mem[s.name][n] = m
            log(f"{n} pods: " + ", ".join(f"{s.name} Pss {mem[s.name][n]['Pss']} kB" for s in sides))

        read_memory(0)
        t0 = time.monotonic()
        for i in range(a.pods):
            for s in sides:
                s.driver.run_pod_with_container(f"r{i}-{tag}", False)
            if i + 1 in checkpoints:
                read_memory(i + 1)
        results["create_s"] = round(time.monotonic() - t0, 1)
        log(f"{a.pods} pods on each in {results['create_s']} s; relisting {a.seconds} s per daemon")

        # The relisting client, alternating daemons slice by slice.
        if a.py_spy:
            results["py_spy"] = a.py_spy
        done = {s.name: 0.0 for s in sides}
        while any(done[s.name] < a.seconds for s in sides):
            for s in sides:
                left = a.seconds - done[s.name]
                if left <= 0:
                    continue
                span = min(a.slice, left)
                spy = None
                if a.py_spy and s.name == "husk-cri":
                    spy = subprocess.Popen([_py_spy(), "record", "--pid", str(s.daemon_pid), "--format", "raw",
                                            "--rate", "50", "--idle", "--threads", "-o",
                                            f"{a.py_spy}.{int(done[s.name])}", "--duration", str(int(span))],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                s.relist(span, a.interval, a.sequential)
                if spy is not None:
                    spy.wait()
                done[s.name] += span
        for s in sides:
            m = cri._memory(s.daemon_pid)
            mem[s.name]["after relist"] = m
        results["memory_kB"] = mem
        results["relist"] = {s.name: s.summary() for s in sides}
        if a.back_to_back:
            for s in sides:
                results["relist"][s.name]["back_to_back_ms"] = back_to_back(s, a.back_to_back)
        if a.idle_calls:
            floor = idle_floor(sides, a.idle_calls, a.interval, a.out)
            results["bare_idle_version_ms"] = floor.pop("bare grpc.aio")
            for name, x in floor.items():
                results["relist"][name]["idle_version_ms"] = x
        results["load_after"] = os.getloadavg()
        log("tearing down")
        for s in sides:
            s.driver.remove_all()
    finally:
        cri.teardown([s.driver for s in sides], husk, ctd, (husk_net, ctd_net), reg)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(table(results))
    return 0


def _py_spy() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.path.exists(here) else "py-spy"


def table(r: dict) -> str:
    mem, rel = r.get("memory_kB", {}), r.get("relist", {})
    names = list(rel)
    lines = [f"{r['date']}, {r['cpus']} CPUs, load {r['load_before'][0]:.2f} before, "
             f"{r['load_after'][0]:.2f} after (1-min averages); {r['pods']} pods; relist every {r['interval']} s "
             f"for {r['seconds']} s per daemon in {r['slice']} s slices; client: {r.get('client', 'sequential')}",
             "",
             "| | " + " | ".join(names) + (" | husk / containerd |" if len(names) == 2 else " |"),
             "|---|" + "---|" * (len(names) + (len(names) == 2))]

    def row(label: str, vals: list[float], ratio: bool = True) -> None:
        cells = [f"{v:g}" for v in vals]
        if len(vals) == 2:
            cells.append(f"{vals[0] / vals[1]:.2f}" if ratio and vals[1] else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    for when in next(iter(mem.values()), {}):
        row(f"daemon Pss, {when}{' pods' if isinstance(when, int) else ''} (kB)", [mem[n][when]["Pss"] for n in names])
    for when in next(iter(mem.values()), {}):
        if isinstance(when, int) and when:
            row(f"shims' Pss summed, {when} pods (kB)", [mem[n][when]["shims_Pss_sum"] for n in names])
    row("daemon CPU over the relist window (s)", [rel[n]["cpu_s"]["daemon"] for n in names])
    row("shims' CPU (s)", [rel[n]["cpu_s"].get("shims", 0) for n in names])
    if "spawner" in rel.get("husk-cri", {}).get("cpu_s", {}):
        lines.append(f"| husk-cri's spawner CPU (s) | {rel['husk-cri']['cpu_s']['spawner']} |"
                     + " |" * (len(names) - 1 + (len(names) == 2)))
    row("daemon + spawner + shims CPU (s)", [round(sum(rel[n]["cpu_s"].values()), 2) for n in names])
    row("relists done (one per interval unless the four calls took longer)", [rel[n]["relists"] for n in names],
        ratio=False)
    if any(rel[n].get("pleg_relists") for n in names):
        row("PLEG relists done (concurrent client)", [rel[n].get("pleg_relists", 0) for n in names], ratio=False)
    row("daemon CPU per relist (ms)", [round(rel[n]["cpu_s"]["daemon"] * 1e3 / max(rel[n]["relists"], 1), 1)
                                       for n in names])
    row("daemon + spawner + shims CPU per relist (ms)",
        [round(sum(rel[n]["cpu_s"].values()) * 1e3 / max(rel[n]["relists"], 1), 1) for n in names])
    for rpc in RPCS:
        cells = []
        for n in names:
            x = rel[n]["latency_ms"].get(rpc)
            cells.append(f"{x['p50']} / {x['p99']} (max {x['max']}, n {x['n']})" if x else
                         rel[n]["errors"].get(rpc, "-"))
        lines.append(f"| {rpc} ms p50 / p99 | " + " | ".join(cells) + (" | |" if len(names) == 2 else " |"))
    for rpc in RPCS[:2]:
        xs = [rel[n].get("back_to_back_ms", {}).get(rpc) for n in names]
        if all(xs):
            lines.append(f"| {rpc} back to back, ms p50 / p99 (n {xs[0]['n']}) | "
                         + " | ".join(f"{x['p50']} / {x['p99']}" for x in xs) + (" | |" if len(names) == 2 else " |"))
    xs = [rel[n].get("idle_version_ms") for n in names]
    if all(xs):
        lines.append(f"| Version after idling ~{r['interval']} s (the floor), ms p50 / p99 (n {xs[0]['n']}) | "
                     + " | ".join(f"{x['p50']} / {x['p99']}" for x in xs) + (" | |" if len(names) == 2 else " |"))
    bare = r.get("bare_idle_version_ms")
    if bare:
        lines += ["", f"A bare grpc.aio server (nothing behind it, the same grpcio and client), Version after the same "
                      f"idling: p50 {bare['p50']} / p99 {bare['p99']} ms (max {bare['max']}, n {bare['n']})."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
