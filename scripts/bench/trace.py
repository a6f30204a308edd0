#!/usr/bin/env python3
"""What the start-up trace (cri_server/trace.py) adds to one RunPodSandbox, measured piece by piece.

Per RunPodSandbox husk-cri records ~13 steps (2 nested CNI plugins), asks the runtime for its stage timings (an
empty file in the bundle), reads them back (~5 stages), serializes the trace into the record's extra (written in
the same transaction as before, only larger). The runtime takes ~12 clock readings and fills the file. This times
each part N times (median of 5 runs) and, for the persistence, the record write with and without the trace.

Usage: .venv/bin/python scripts/bench/trace.py [--n 2000]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, TOP)

from cri_server import trace  # noqa: E402
from cri_server.store.records import SandboxRecord, SandboxState  # noqa: E402
from cri_server.store.store import Store  # noqa: E402
from runtime import stages  # noqa: E402

SANDBOX_STEPS = ["reserve_name", "record", "pod_files", "image", "netns", "cni", "rootfs", "spec", "shim_spawn",
                 "runtime_create", "runtime_start"]
RUNTIME = [("cgroups", 1, 2), ("cgroup_apply", 3, 4), ("namespaces", 5, 6), ("rootfs", 7, 8), ("pivot_root", 9, 1)]


def one_trace(bundle: str) -> trace.Trace:
    tr = trace.Trace("sandbox", "a" * 64, "default/web", 2.0)
    for name in SANDBOX_STEPS:
        with tr.step(name):
            if name == "cni":
                for p in ("bridge", "portmap"):
                    with tr.step(f"cni.add.{p}"):
                        pass
            elif name == "runtime_create":
                trace.request_runtime_stages(bundle)
                stages.write(bundle, RUNTIME)          # the runtime's side
                trace.add_runtime_stages(tr, bundle)
    return tr


def runtime_side() -> None:
    t = stages.now()
    acc: list = []
    for name in ("cgroups", "cgroup_apply", "namespaces", "rootfs", "pivot_root"):
        stages.since(acc, name, t)
    stages.decode(stages.encode(acc))


def median_us(fn, n: int) -> float:
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    n = ap.parse_args().n
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR") or None) as d:
        bundle = os.path.join(d, "bundle")
        os.makedirs(bundle)
        tr = one_trace(bundle)
        doc = tr.to_json()
        store = Store(os.path.join(d, "metadata.db"))
        base = dict(name="n", pod_name="web", pod_uid="u", pod_namespace="default", attempt=0,
                    state=SandboxState.READY, created_at=1, config=b"\x0a" * 300,
                    extra={"runtime": "husk", "bundle": bundle, "state_dir": d, "hostname": "web"})
        i = [0]

        def put(with_trace: bool) -> None:
            i[0] += 1
            extra = dict(base["extra"], **({trace.KEY: doc} if with_trace else {}))
            store.put_sandbox(SandboxRecord(id=f"{i[0]:064d}", **{**base, "name": f"n{i[0]}", "extra": extra}))

        rows = [
            ("recorder: 13 steps + 5 runtime stages (incl. the stage file)", median_us(lambda: one_trace(bundle), n)),
            ("  of which the stage file (create, runtime's write, read)", median_us(lambda: (trace.request_runtime_stages(bundle), stages.write(bundle, RUNTIME), stages.read(bundle)), n)),
            ("runtime side: clock readings + encode/decode", median_us(runtime_side, n)),
            ("runtime side when nobody asked (failed open)", median_us(lambda: stages.write(d, RUNTIME), n)),
            ("trace -> JSON for the record", median_us(lambda: json.dumps(tr.to_json()), n)),
            ("record write (fdatasync) without trace", median_us(lambda: put(False), max(n // 20, 20))),
            ("record write (fdatasync) with trace", median_us(lambda: put(True), max(n // 20, 20))),
        ]
        store.close()
    print(f"trace JSON: {len(json.dumps(doc))} bytes, {len(doc['steps'])} steps")
    for what, us in rows:
        print(f"{us:10.1f} us  {what}")


if __name__ == "__main__":
    main()
