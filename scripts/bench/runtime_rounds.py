"""Interleaved rounds for scripts/bench/runtime: husk and runc (the anchor) alternate round by round, so that a
busy host's load shifts hit both alike. Per runtime and round, in this order:
  - create+start+delete "first": after a pause of 100 ms with nothing of either runtime running, as between a
    node's container starts; a write to cgroup.procs (runc's create, on every cgroup layout) then waits for an
    RCU grace period (the cgroup_threadgroup_rwsem's rcu_sync is back on its fast path);
  - `run` of the bundle;
  - create+start+delete "after run": right after the runtime's own `run`, when a cgroup.procs write finds the
    rwsem still in its slow mode and skips that wait.
Wall time of each verb, and the CPU of the three (rusage of the verb's process and what it reaped).
Floors: floor:RT="ARGV" is a command that starts RT's process and does nothing (floor:husk="/path/python -IS -c
pass", the interpreter husk's launcher names; floor:runc="runc --version"), timed once per round: every verb is
one such start, so RT's create+start+delete less three of its floor is the runtimes' own work, printed beside.
Usage: runtime_rounds.py OUT LABEL RUNS BUNDLE NAME="ARGV" ... (one of them named runc, the anchor; the order
rotates round by round, e.g. husk="/path/husk --root R" husk-old="..." runc="runc --root R2"); writes
OUT/csd-LABEL.json and prints medians and ratios to runc.
Numbers only, not a pass/fail test."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

WARM_ROUNDS = 3
PAUSE = 0.1
KINDS = ("first", "after_run")


def timed(argv: list[str]) -> tuple[float, float]:
    dn = subprocess.DEVNULL
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdin=dn, stdout=dn, stderr=dn)
    _, status, ru = os.wait4(p.pid, 0)
    if status:
        sys.exit(f"{argv} failed: {status}")
    return (time.perf_counter() - t) * 1000, (ru.ru_utime + ru.ru_stime) * 1000


def wait_stopped(r: list[str], cid: str) -> None:
    for _ in range(500):  # delete is timed on a stopped container
        if '"stopped"' in subprocess.run(r + ["state", cid], capture_output=True, text=True).stdout:
            return
        time.sleep(0.01)


def csd(r: list[str], bundle: str, cid: str) -> dict[str, float]:
    c, cc = timed(r + ["create", "--bundle", bundle, cid])
    s, scpu = timed(r + ["start", cid])
    wait_stopped(r, cid)
    d, dc = timed(r + ["delete", cid])
    return {"create": c, "start": s, "delete": d, "cpu": cc + scpu + dc}


def main() -> None:
    out, label, runs, bundle = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    given = {name: argv.split() for name, _, argv in (a.partition("=") for a in sys.argv[5:])}
    floors = {name: argv for name, argv in given.items() if name.startswith("floor:")}
    rts = {name: argv for name, argv in given.items() if name not in floors}
    if "runc" not in rts or len(rts) < 2:
        sys.exit("runtime_rounds.py: give runc=ARGV and at least one other NAME=ARGV")
    names = list(rts)
    res: dict[str, dict[str, list[float]]] = {
        rt: {f"{kind}_{k}": [] for kind in KINDS for k in ("create", "start", "delete", "cpu")} | {"run": []}
        for rt in rts}
    dn = subprocess.DEVNULL
    for i in range(runs + WARM_ROUNDS):
        for rt in names[i % len(names):] + names[:i % len(names)]:
            r, cid = rts[rt], f"hb-{rt}-csd"
            subprocess.run(r + ["delete", "-f", cid], stdin=dn, stdout=dn, stderr=dn)
            time.sleep(PAUSE)
            first = csd(r, bundle, cid)
            run, _ = timed(r + ["run", "--bundle", bundle, f"hb-{rt}-irun"])
            after = csd(r, bundle, cid)
            if i >= WARM_ROUNDS:
                res[rt]["run"].append(run)
                for kind, got in (("first", first), ("after_run", after)):
                    for k, v in got.items():
                        res[rt][f"{kind}_{k}"].append(v)
        for name, argv in floors.items():
            wall, _ = timed(argv)
            if i >= WARM_ROUNDS:
                res.setdefault(name, {"wall": []})["wall"].append(wall)
    with open(os.path.join(out, f"csd-{label}.json"), "w") as f:
        json.dump(res, f)
    med = {rt: {k: statistics.median(v) for k, v in r.items()} for rt, r in res.items() if rt not in floors}
    floor = {name: statistics.median(res[name]["wall"]) for name in floors if name in res}
    others = [rt for rt in names if rt != "runc"]
    print(f"[{label}] run interleaved (medians of {runs}): "
          + ", ".join(f"{rt} {med[rt]['run']:.1f} ms" for rt in names) + "; "
          + ", ".join(f"{rt}/runc {med[rt]['run'] / med['runc']['run']:.2f}" for rt in others))
    for kind in KINDS:
        tot = {rt: sum(m[f"{kind}_{v}"] for v in ("create", "start", "delete")) for rt, m in med.items()}
        for rt in names:
            m = med[rt]
            print(f"[{label}] {kind:9s} {rt}: create {m[f'{kind}_create']:.1f} start {m[f'{kind}_start']:.1f} "
                  f"delete {m[f'{kind}_delete']:.1f} ms, sum {tot[rt]:.1f} ms, CPU of the three "
                  f"{m[f'{kind}_cpu']:.1f} ms")
        for rt in others:
            print(f"[{label}] create+start+delete {kind}: {rt}/runc {tot[rt] / tot['runc']:.2f} (wall), "
                  f"{med[rt][f'{kind}_cpu'] / med['runc'][f'{kind}_cpu']:.2f} (CPU)")
        if floor:
            own = {rt: tot[rt] - 3 * floor[f"floor:{rt}"] for rt in names if f"floor:{rt}" in floor}
            print(f"[{label}] create+start+delete {kind} less three process starts (floor:RT): "
                  + ", ".join(f"{rt} {ms:.1f} ms" for rt, ms in own.items())
                  + "".join(f"; {rt}/runc {own[rt] / own['runc']:.2f}" for rt in others if rt in own and "runc" in own))
    for name, ms in floor.items():
        print(f"[{label}] {name}, one process start doing nothing (median of {runs}): {ms:.1f} ms")


if __name__ == "__main__":
    main()
