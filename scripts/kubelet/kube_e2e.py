#!/usr/bin/env python3
"""A real kubelet (standalone: static pods, no API server) runs its pods on a husk-cri of its own.

Sets up (scripts/kubelet/kube_harness.py) local test images served by a local registry on 127.0.0.1, a husk-cri
with its own socket, dirs and bridge network, and the kubelet given by --kubelet/$KUBELET with the read-only port
127.0.0.1:10255; writes static pod manifests and checks what kubelet (/pods, /stats/summary, /metrics/*) and
husk-cri (CRI calls, files, cgroups) show. Each scenario passes or fails with the reason; a table ends the run.
The whole set runs once per value of the PodAndContainerStatsFromCRI feature gate (--gates off,on).

Usage: scripts/kubelet-e2e [--kubelet PATH] [--gates off,on] [--only NAME]... [--out DIR] [--keep]
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_harness import (BUSYBOX, GC_IMAGE, GC_IMAGE2, NODE, SANDBOX_IMAGE, TOP, Bed, Failed,  # noqa: E402
                          check, log, wait_for)

GATE = "PodAndContainerStatsFromCRI"


# --- pod manifests -------------------------------------------------------------------------------------------
def ctr(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", script], **extra}


def pod(name: str, containers: list[dict[str, Any]], restart: str = "Always", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name, "suite": "hke"},
                         "annotations": {"hke/note": f"pod {name}"}},
            "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 2, "containers": containers,
                     **spec}}


SLEEP = "trap 'exit 0' TERM; sleep 3600 & wait"
LOG_LINES = 40000
LOG_BATCH = 200


def manifests(host_dir: str) -> list[dict[str, Any]]:
    probe = {"periodSeconds": 2, "failureThreshold": 2, "timeoutSeconds": 2}
    return [
        pod("basic", [ctr("c", f"echo hello-from-basic; {SLEEP}")]),
        pod("crash", [ctr("c", "echo crash-start; exit 3")]),
        pod("live-exec", [ctr("c", f"touch /tmp/healthy; sleep 20; rm /tmp/healthy; {SLEEP}",
                              livenessProbe={"exec": {"command": ["cat", "/tmp/healthy"]}, **probe})]),
        pod("live-http", [ctr("c", "mkdir -p /www && echo ok > /www/healthz && httpd -p 8080 -h /www; sleep 20; "
                                   f"rm /www/healthz; {SLEEP}",
                              livenessProbe={"httpGet": {"path": "/healthz", "port": 8080}, **probe})]),
        pod("ready-tcp", [ctr("c", "sleep 8; httpd -f -p 8081 -h / & pid=$!; sleep 20; kill $pid; "
                                   f"echo stopped-listening; {SLEEP}",
                              readinessProbe={"tcpSocket": {"port": 8081}, "periodSeconds": 1,
                                              "failureThreshold": 1, "successThreshold": 1})]),
        pod("startup", [ctr("c", f"sleep 10; touch /tmp/started; {SLEEP}",
                            startupProbe={"exec": {"command": ["test", "-f", "/tmp/started"]},
                                          "periodSeconds": 1, "failureThreshold": 60})]),
        pod("init", [ctr("c", f"cat /work/order; {SLEEP}", volumeMounts=[{"name": "w", "mountPath": "/work"}])],
            initContainers=[ctr("i1", "echo one >> /work/order", volumeMounts=[{"name": "w", "mountPath": "/work"}]),
                            ctr("i2", "echo two >> /work/order", volumeMounts=[{"name": "w", "mountPath": "/work"}])],
            volumes=[{"name": "w", "emptyDir": {}}]),
        pod("volumes", [
            ctr("writer", "echo shared-by-writer > /shared/msg; echo from-pod > /host/out; "
                          "grep ' /mem ' /proc/mounts | cut -d' ' -f3 | sed 's/^/memfs=/'; "
                          "for f in /dapi/labels /dapi/annotations /dapi/name /proj/podname /proj/cpu_limit; do "
                          "echo \"file $f: $(cat $f | tr '\\n' ' ')\"; done; " + SLEEP,
                volumeMounts=[{"name": "shared", "mountPath": "/shared"}, {"name": "mem", "mountPath": "/mem"},
                              {"name": "host", "mountPath": "/host"}, {"name": "dapi", "mountPath": "/dapi"},
                              {"name": "proj", "mountPath": "/proj"}],
                resources={"limits": {"cpu": "300m", "memory": "64Mi"}}),
            ctr("reader", "while [ ! -s /shared/msg ]; do sleep 0.2; done; echo \"reader saw: $(cat /shared/msg)\"; "
                          + SLEEP, volumeMounts=[{"name": "shared", "mountPath": "/shared"}])],
            volumes=[{"name": "shared", "emptyDir": {}}, {"name": "mem", "emptyDir": {"medium": "Memory"}},
                     {"name": "host", "hostPath": {"path": host_dir, "type": "DirectoryOrCreate"}},
                     {"name": "dapi", "downwardAPI": {"items": [
                         {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                         {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                         {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                     # a projected volume needs a kube client even for downwardAPI sources only
                     # (pkg/volume/projected collectData): a second downwardAPI volume with a resourceFieldRef
                     {"name": "proj", "downwardAPI": {"items": [
                         {"path": "podname", "fieldRef": {"fieldPath": "metadata.name"}},
                         {"path": "cpu_limit", "resourceFieldRef": {"containerName": "writer",
                                                                    "resource": "limits.cpu", "divisor": "1m"}}]}}]),
        pod("env", [ctr("c", f"env | grep '^E_' | sort; {SLEEP}",
                        resources={"requests": {"cpu": "250m", "memory": "32Mi"},
                                   "limits": {"cpu": "500m", "memory": "64Mi"}},
                        env=[{"name": "E_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                             {"name": "E_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                             {"name": "E_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                             {"name": "E_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                             {"name": "E_PODIP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                             {"name": "E_LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                             {"name": "E_MEM_LIMIT_MI", "valueFrom": {"resourceFieldRef": {
                                 "resource": "limits.memory", "divisor": "1Mi"}}},
                             {"name": "E_CPU_REQ_M", "valueFrom": {"resourceFieldRef": {
                                 "resource": "requests.cpu", "divisor": "1m"}}},
                             {"name": "E_CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                             {"name": "E_PLAIN", "value": "plain-$(E_NS)"}])]),
        pod("qos-g", [ctr("c", SLEEP, resources={"requests": {"cpu": "200m", "memory": "64Mi"},
                                                 "limits": {"cpu": "200m", "memory": "64Mi"}})]),
        pod("qos-b", [ctr("c", SLEEP, resources={"requests": {"cpu": "100m", "memory": "32Mi"},
                                                 "limits": {"cpu": "500m", "memory": "128Mi"}})]),
        pod("logger", [ctr("c", f"i=0; while [ $i -lt {LOG_LINES} ]; do j=0; while [ $j -lt {LOG_BATCH} ]; do "
                                "i=$((i+1)); j=$((j+1)); echo \"seq $i ......................................"
                                "......................\"; done; usleep 100000; done; echo done-writing; "
                                + SLEEP)]),
    ]


# Pods whose containers must never restart nor change (the restart scenarios compare them).
STABLE = ["basic", "init", "volumes", "env", "qos-g", "qos-b", "startup", "logger", "ready-tcp"]


# --- helpers over kubelet's view -------------------------------------------------------------------------------
def cstatus(p: dict[str, Any] | None, name: str = "c", init: bool = False) -> dict[str, Any]:
    if not p:
        return {}
    key = "initContainerStatuses" if init else "containerStatuses"
    for s in p.get("status", {}).get(key) or []:
        if s["name"] == name:
            return s
    return {}


def cid(s: dict[str, Any]) -> str:
    return (s.get("containerID") or "").split("://")[-1]


def condition(p: dict[str, Any], kind: str) -> str:
    for c in p.get("status", {}).get("conditions") or []:
        if c["type"] == kind:
            return c["status"]
    return ""


def running(bed: Bed, name: str) -> dict[str, Any] | None:
    p = bed.pod(name)
    if p and p.get("status", {}).get("phase") == "Running" and \
            all("running" in s.get("state", {}) for s in p["status"].get("containerStatuses") or [{}]):
        return p
    return None


def pod_log_dir(bed: Bed, p: dict[str, Any], container: str) -> str:
    m = p["metadata"]
    return os.path.join(bed.pod_logs, f"{m['namespace']}_{m['name']}_{m['uid']}", container)


def parse_cri_log(data: str) -> list[str]:
    """Lines of a CRI log file (`<time> <stream> <P|F> <text>`), partial records joined."""
    out, part = [], ""
    for raw in data.splitlines():
        bits = raw.split(" ", 3)
        if len(bits) < 3:
            continue
        text = bits[3] if len(bits) == 4 else ""
        if bits[2] == "P":
            part += text
            continue
        out.append(part + text)
        part = ""
    return out


def container_log(bed: Bed, p: dict[str, Any], container: str) -> list[str]:
    d = pod_log_dir(bed, p, container)
    out: list[str] = []
    for f in sorted(glob.glob(os.path.join(d, "*.log"))):
        with open(f, errors="replace") as fh:
            out += parse_cri_log(fh.read())
    return out


def metric_values(text: str, name: str, **labels: str) -> list[float]:
    """Values of the Prometheus text series `name` whose labels include `labels` (timestamps ignored)."""
    out = []
    for line in text.splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        head, _, rest = line.rpartition("}") if "}" in line else ("", "", line[len(name):])
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            out.append(float(rest.split()[0]))
    return out


def metric_sum(text: str, name: str, **labels: str) -> float:
    return sum(metric_values(text, name, **labels))


def quantity(q: str) -> int:
    """A Kubernetes quantity as kubelet logs it (80131480Ki, 78226Mi, 123) in bytes."""
    units = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9}
    m = re.fullmatch(r"(\d+)([A-Za-z]*)", q)
    if not m or m.group(2) not in units:
        raise ValueError(f"quantity {q!r}")
    return int(m.group(1)) * units[m.group(2)]


def read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip())


# --- history: kubelet's /pods and the crash container's CRI records, polled in the background -------------------
@dataclass
class History:
    bed: Bed
    snaps: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    crash: dict[str, dict[str, int]] = field(default_factory=dict)   # container id -> created/started/finished ns
    crash_ids_seen: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                pods = self.bed.pods()
            except Exception:  # noqa: BLE001 -- kubelet restarting: skip this poll
                continue
            with self.lock:
                self.snaps.append((time.time(), pods))
            try:
                for c in self.bed.cri_containers("crash", "c"):
                    if c.id not in self.crash_ids_seen:
                        self.crash_ids_seen.append(c.id)
                    st = self.bed.container_status(c.id).status
                    self.crash[c.id] = {"created": st.created_at, "started": st.started_at,
                                        "finished": st.finished_at, "exit": st.exit_code}
            except Exception:  # noqa: BLE001 -- husk-cri restarting, or a container removed mid-poll
                pass

    def series(self, name: str, fn: Callable[[dict[str, Any]], Any]) -> list[Any]:
        with self.lock:
            snaps = list(self.snaps)
        out = []
        for _, pods in snaps:
            p = pods.get(name)
            if p is not None:
                v = fn(p)
                if not out or out[-1] != v:
                    out.append(v)
        return out


# --- scenarios -------------------------------------------------------------------------------------------------
class Ctx:
    def __init__(self, bed: Bed, hist: History, gates: dict[str, bool]) -> None:
        self.bed, self.hist, self.gates = bed, hist, gates
        self.notes: dict[str, str] = {}


def s_start_status(x: Ctx) -> str:
    from cri_server.api.v1 import api_pb2 as pb
    bed = x.bed
    p = wait_for("pod basic Running in /pods", lambda: running(bed, "basic"), 180)
    s = cstatus(p)
    check(s.get("ready") is True and s.get("restartCount") == 0, f"basic: ready/restartCount: {s}")
    sb = bed.cri_sandboxes("basic")
    check(len(sb) == 1 and sb[0].state == pb.SANDBOX_READY, f"basic: CRI sandboxes {sb}")
    check(sb[0].metadata.uid == p["metadata"]["uid"], "sandbox uid differs from /pods uid")
    st = bed.rt().PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=sb[0].id), timeout=30).status
    check(p["status"].get("podIP") == st.network.ip, f"podIP {p['status'].get('podIP')} vs CRI {st.network.ip}")
    check(st.network.ip.startswith(bed.net.subnet_prefix + "."), f"pod IP {st.network.ip} not in {bed.net.subnet}")
    cs = bed.cri_containers("basic", "c")
    check([c.id for c in cs] == [cid(s)], f"/pods containerID {cid(s)} vs CRI {[c.id for c in cs]}")
    check(cs[0].state == pb.CONTAINER_RUNNING, f"CRI state {cs[0].state}")
    lines = wait_for("basic's log", lambda: container_log(bed, p, "c"), 30)
    check("hello-from-basic" in lines, f"basic log: {lines}")
    return f"pod IP {st.network.ip}, sandbox {sb[0].id[:12]}, container {cs[0].id[:12]}"


def s_init(x: Ctx) -> str:
    p = wait_for("pod init Running", lambda: running(x.bed, "init"), 180)
    i1, i2, c = cstatus(p, "i1", True), cstatus(p, "i2", True), cstatus(p)
    for s in (i1, i2):
        t = s.get("state", {}).get("terminated", {})
        check(t.get("exitCode") == 0 and t.get("reason") == "Completed", f"init {s.get('name')}: {s.get('state')}")
    check(i1["state"]["terminated"]["finishedAt"] <= i2["state"]["terminated"]["startedAt"],
          "i2 started before i1 finished")
    check(i2["state"]["terminated"]["finishedAt"] <= c["state"]["running"]["startedAt"],
          "main container started before i2 finished")
    lines = wait_for("init's main log", lambda: container_log(x.bed, p, "c"), 30)
    check(lines[:2] == ["one", "two"], f"main saw {lines[:2]}, expected ['one', 'two']")
    return "i1, i2 Completed in order; main saw one,two"


def s_volumes(x: Ctx) -> str:
    bed = x.bed
    p = wait_for("pod volumes Running", lambda: running(bed, "volumes"), 180)
    host_file = os.path.join(bed.host_dir, "out")
    wait_for("hostPath file written by the pod", lambda: os.path.exists(host_file), 30)
    with open(host_file) as f:
        check(f.read() == "from-pod\n", "hostPath file content")
    lines = wait_for("writer's log", lambda: [ln for ln in container_log(bed, p, "writer") if "cpu_limit" in ln], 30)
    lines = container_log(bed, p, "writer")
    want = {
        "memfs=tmpfs": "emptyDir medium Memory is a tmpfs",
        "file /dapi/name: volumes-hke-node": "downwardAPI metadata.name",
        "file /proj/podname: volumes-hke-node": "downwardAPI metadata.name (second volume)",
        "file /proj/cpu_limit: 300": "downwardAPI resourceFieldRef limits.cpu in m",
    }
    for line, what in want.items():
        check(line in lines, f"{what}: expected {line!r} in {lines}")
    lab = [ln for ln in lines if ln.startswith("file /dapi/labels:")]
    check(bool(lab) and 'app="volumes"' in lab[0] and 'suite="hke"' in lab[0], f"labels file: {lab}")
    ann = [ln for ln in lines if ln.startswith("file /dapi/annotations:")]
    check(bool(ann) and 'hke/note="pod volumes"' in ann[0], f"annotations file: {ann}")
    r = wait_for("reader's log", lambda: container_log(bed, p, "reader"), 30)
    check("reader saw: shared-by-writer" in r, f"emptyDir shared between containers: reader log {r}")
    return "emptyDir (disk, Memory=tmpfs, shared by 2 containers), hostPath, downwardAPI (fieldRef, resourceFieldRef)"


def s_env(x: Ctx) -> str:
    p = wait_for("pod env Running", lambda: running(x.bed, "env"), 180)
    lines = wait_for("env's log", lambda: [ln for ln in container_log(x.bed, p, "c") if ln.startswith("E_")], 30)
    got = dict(ln.split("=", 1) for ln in lines)
    want = {"E_NAME": "env-" + NODE, "E_NS": "default", "E_UID": p["metadata"]["uid"], "E_NODE": NODE,
            "E_PODIP": p["status"]["podIP"], "E_LABEL": "env", "E_MEM_LIMIT_MI": "64", "E_CPU_REQ_M": "250",
            "E_CPU_LIMIT": "1", "E_PLAIN": "plain-default"}
    check(got == want, f"env: got {got}, want {want}")
    return "fieldRef (name, namespace, uid, nodeName, podIP, label), resourceFieldRef (divisors), $(VAR)"


def _cg(bed: Bed, ctrl: str, rel: str) -> str:
    return os.path.join("/sys/fs/cgroup", ctrl, rel.lstrip("/"))


def s_qos(x: Ctx) -> str:
    bed = x.bed
    kp = f"{bed.cgroup_root}/kubepods"
    for q in ("burstable", "besteffort"):
        check(os.path.isdir(_cg(bed, "memory", f"{kp}/{q}")), f"QoS cgroup {kp}/{q} missing")
    check(read_int(_cg(bed, "cpu", f"{kp}/besteffort/cpu.shares")) == 2, "besteffort cpu.shares != 2")
    out = []
    for name, qdir, mem, quota, shares in (("qos-g", "", 64 << 20, 20000, 204),
                                           ("qos-b", "burstable/", 128 << 20, 50000, 102)):
        p = wait_for(f"pod {name} Running", lambda n=name: running(bed, n), 180)
        check(p["status"].get("qosClass") == ("Guaranteed" if name == "qos-g" else "Burstable"),
              f"{name} qosClass {p['status'].get('qosClass')}")
        podcg = f"{kp}/{qdir}pod{p['metadata']['uid']}"
        check(read_int(_cg(bed, "memory", podcg + "/memory.limit_in_bytes")) == mem, f"{name} pod memory limit")
        check(read_int(_cg(bed, "cpu", podcg + "/cpu.cfs_quota_us")) == quota, f"{name} pod cpu quota")
        c = cid(cstatus(p))
        pid = bed.container_pid(c)
        check(pid > 0, f"{name}: no pid for container {c}")
        with open(f"/proc/{pid}/cgroup") as f:
            paths = dict((ln.split(":")[1], ln.split(":")[2].strip()) for ln in f if ln.count(":") >= 2)
        for ctrl in ("memory", "cpu,cpuacct" if "cpu,cpuacct" in paths else "cpu", "pids"):
            check(paths.get(ctrl, "").startswith(podcg + "/"),
                  f"{name}: {ctrl} cgroup {paths.get(ctrl)} not under {podcg}")
        ccg = paths["memory"]
        got = (read_int(_cg(bed, "memory", ccg + "/memory.limit_in_bytes")),
               read_int(_cg(bed, "cpu", ccg + "/cpu.cfs_quota_us")), read_int(_cg(bed, "cpu", ccg + "/cpu.shares")),
               read_int(_cg(bed, "cpu", ccg + "/cpu.cfs_period_us")))
        check(got == (mem, quota, shares, 100000), f"{name} container {ccg}: (memory, quota, shares, period) = {got}, "
                                                   f"want {(mem, quota, shares, 100000)}")
        out.append(f"{name}: {ccg.split('/kubepods/')[1][:40]}… mem {mem >> 20}Mi quota {quota} shares {shares}")
    return "; ".join(out)


def s_startup(x: Ctx) -> str:
    def series() -> list[Any]:
        return x.hist.series("startup", lambda p: (cstatus(p).get("started"), cstatus(p).get("ready")))
    wait_for("startup's container started and ready", lambda: series()[-1:] == [(True, True)], 120)
    seq = series()
    check((False, False) in seq and seq[-1] == (True, True), f"startup (started, ready) over time: {seq}")
    check(seq.index((False, False)) < seq.index((True, True)), f"order: {seq}")
    check(cstatus(x.bed.pod("startup")).get("restartCount") == 0, "startup probe restarted the container")
    return f"(started, ready): {seq}"


def s_readiness(x: Ctx) -> str:
    def flipped() -> bool:
        seq = x.hist.series("ready-tcp", lambda p: cstatus(p).get("ready"))
        return [v for v in seq if v is not None][-3:] == [False, True, False]
    wait_for("ready-tcp's Ready false -> true -> false", flipped, 120)
    conds = x.hist.series("ready-tcp", lambda p: condition(p, "Ready"))
    check(conds[-3:] == ["False", "True", "False"], f"pod Ready condition over time: {conds}")
    check(cstatus(x.bed.pod("ready-tcp")).get("restartCount") == 0, "readiness restarted the container")
    return f"container ready {x.hist.series('ready-tcp', lambda p: cstatus(p).get('ready'))}, pod Ready {conds}"


def _liveness(x: Ctx, name: str) -> str:
    p = wait_for(f"{name} restarted by its liveness probe",
                 lambda: (q := x.bed.pod(name)) and cstatus(q).get("restartCount", 0) >= 1 and q, 150)
    t = cstatus(p).get("lastState", {}).get("terminated", {})
    # the probe fails from 20 s on; kubelet's SIGTERM ends the container through its trap (exit 0)
    import datetime
    dur = (datetime.datetime.fromisoformat(t["finishedAt"].replace("Z", "+00:00")) -
           datetime.datetime.fromisoformat(t["startedAt"].replace("Z", "+00:00"))).total_seconds() if t else 0
    check(t.get("exitCode") == 0 and dur >= 20, f"{name}: last termination {t}")
    check(re.search(rf'pod="default/{name}-{NODE}" containerMessage="Container c failed liveness probe, will be '
                    'restarted"', x.bed.klog_tail(4 << 20)) is not None,
          f"{name}: no 'failed liveness probe, will be restarted' line for the pod in kubelet's log")
    return f"restartCount {cstatus(p)['restartCount']}, last exit {t.get('exitCode')} ({t.get('reason')})"


def s_liveness_exec(x: Ctx) -> str:
    return _liveness(x, "live-exec")


def s_liveness_http(x: Ctx) -> str:
    return _liveness(x, "live-http")


def s_backoff(x: Ctx) -> str:
    wait_for("crash's restartCount >= 4", lambda: cstatus(x.bed.pod("crash")).get("restartCount", 0) >= 4, 300)
    waits = x.hist.series("crash", lambda p: cstatus(p).get("state", {}).get("waiting", {}).get("reason"))
    check("CrashLoopBackOff" in waits, f"waiting reasons seen: {waits}")
    t = cstatus(x.bed.pod("crash")).get("lastState", {}).get("terminated", {})
    check(t.get("exitCode") == 3 and t.get("reason") == "Error", f"last termination {t}")
    with x.hist.lock:
        recs = sorted((r for r in x.hist.crash.values() if r["started"]), key=lambda r: r["started"])
    gaps = [(b["started"] - a["finished"]) / 1e9 for a, b in zip(recs, recs[1:]) if a["finished"]]
    check(len(gaps) >= 3, f"too few restarts recorded through CRI: {recs}")
    # kubelet restarts a first crash at once, then backs off 10 s, 20 s, 40 s... (pkg/kubelet/kubelet.go
    # backOffPeriod, doubling up to MaxContainerBackOff): every later gap is at least that long
    want = [0.0] + [10.0 * 2 ** i for i in range(len(gaps) - 1)]
    check(all(g >= w - 1 for g, w in zip(gaps, want)),
          f"restart gaps {['%.1f' % g for g in gaps]} s shorter than kubelet's back-off {want}")
    return f"gaps between exit and next start: {', '.join('%.1f' % g for g in gaps)} s"


def s_container_gc(x: Ctx) -> str:
    bed = x.bed
    ids = list(x.hist.crash_ids_seen)
    check(len(ids) >= 4, f"only {len(ids)} crash containers seen")

    def collected() -> list[str]:
        now = {c.id for c in bed.cri_containers("crash", "c")}
        return [i for i in ids[:-2] if i not in now] == ids[:-2] and sorted(now)
    now = wait_for("kubelet to remove all but the last dead crash containers", collected, 90)
    check(len(now) <= 2, f"crash containers still in CRI: {now}")
    root, state = bed.cri.root, bed.cri.state
    for i in ids[:-2]:
        for d in (os.path.join(root, "containers", i), os.path.join(state, "bundles", i),
                  os.path.join(state, "shims", i)):
            check(not os.path.exists(d), f"removed container {i[:12]} left {d}")
        check(i not in bed.cri.runtime_ids(), f"runtime still lists {i[:12]}")
    return f"{len(ids)} crash containers seen, {len(ids) - len(now)} removed (dirs and runtime state gone), " \
           f"{len(now)} kept"


def s_log_rotation(x: Ctx) -> str:
    bed = x.bed
    p = wait_for("logger Running", lambda: running(bed, "logger"), 180)
    d = pod_log_dir(bed, p, "c")

    def done() -> bool:
        for f in glob.glob(os.path.join(d, "0.log*")):
            if f.endswith(".gz"):
                continue
            with open(f, errors="replace") as fh:
                if "done-writing" in fh.read():
                    return True
        return False
    wait_for("logger to finish writing", done, 240, 2)
    files = sorted(glob.glob(os.path.join(d, "0.log*")))
    rotated = [f for f in files if not f.endswith("/0.log")]
    check(len(rotated) >= 2, f"rotated files: {files}")
    seqs: list[int] = []
    for f in files:
        opener = gzip.open if f.endswith(".gz") else open
        with opener(f, "rt", errors="replace") as fh:  # type: ignore[operator]
            seqs += [int(ln.split()[1]) for ln in parse_cri_log(fh.read()) if ln.startswith("seq ")]
    dup = len(seqs) - len(set(seqs))
    missing = sorted(set(range(1, LOG_LINES + 1)) - set(seqs))
    check(dup == 0 and not missing, f"{len(seqs)} lines, {dup} duplicated, missing {missing[:10]}…")
    return f"{len(rotated)} rotated files ({sum(f.endswith('.gz') for f in rotated)} gzipped), {LOG_LINES} lines, " \
           "none lost or doubled"


def s_stats(x: Ctx) -> str:
    bed = x.bed
    s = bed.summary()
    pods = {p["podRef"]["name"]: p for p in s.get("pods") or []}
    b = pods.get("basic-" + NODE)
    check(b is not None, f"basic not in /stats/summary pods: {list(pods)}")
    cs = {c["name"]: c for c in b.get("containers") or []}
    c = cs.get("c") or {}
    check((c.get("cpu") or {}).get("usageCoreNanoSeconds", 0) > 0, f"basic/c cpu stats: {c.get('cpu')}")
    check((c.get("memory") or {}).get("workingSetBytes", 0) > 0, f"basic/c memory stats: {c.get('memory')}")
    check(((c.get("rootfs") or {}).get("usedBytes")) is not None, f"basic/c rootfs stats: {c.get('rootfs')}")
    check((b.get("cpu") or {}).get("usageCoreNanoSeconds", 0) > 0, f"pod basic cpu: {b.get('cpu')}")
    rt = s["node"].get("runtime", {}).get("imageFs") or {}
    check(rt.get("capacityBytes", 0) > 0 and rt.get("usedBytes", 0) > 0, f"node.runtime.imageFs: {rt}")
    res = bed.metrics("/metrics/resource")
    pod_l = {"pod": "basic-" + NODE, "namespace": "default"}
    check(metric_sum(res, "pod_cpu_usage_seconds_total", **pod_l) > 0, "/metrics/resource: no pod cpu for basic")
    ctr_res = metric_values(res, "container_cpu_usage_seconds_total", container="c", **pod_l)
    cad = bed.metrics("/metrics/cadvisor")
    cpu = metric_values(cad, "container_cpu_usage_seconds_total", container="c", **pod_l)
    mem = metric_values(cad, "container_memory_working_set_bytes", container="c", **pod_l)
    names = sorted({ln.split("{")[0] for ln in cad.splitlines() if 'pod="basic-' in ln and 'container="c"' in ln})
    if x.gates.get(GATE):
        # kubelet 1.32 builds only pod-level CPU/memory from ListPodSandboxStats for /metrics/resource
        # (stats/cri_stats_provider.go ListPodCPUAndMemoryStats): no container_* series there with the gate on
        check(not ctr_res or ctr_res[0] > 0, f"/metrics/resource container cpu {ctr_res}")
        # /metrics/cadvisor comes from husk-cri's ListPodSandboxMetrics
        check(len(cpu) == 1 and len(mem) == 1 and mem[0] > 0,
              f"gate on: /metrics/cadvisor basic/c: container_cpu_usage_seconds_total {cpu}, "
              f"container_memory_working_set_bytes {mem}")
    else:
        check(len(ctr_res) == 1 and ctr_res[0] > 0, f"/metrics/resource container cpu for basic/c: {ctr_res}")
    return f"summary pod+container cpu/memory/rootfs/logs; /metrics/resource container series: {len(ctr_res)}; " \
           f"/metrics/cadvisor basic/c: {len(names)} series (cpu {cpu}, working set {mem})"


def _stable_ids(bed: Bed) -> dict[str, tuple[str, list[tuple[str, str, int]]]]:
    out = {}
    for n in STABLE:
        sb = bed.cri_sandboxes(n)
        p = bed.pod(n)
        check(p is not None, f"{n} missing from /pods")
        out[n] = (",".join(sorted(s.id for s in sb)),
                  sorted((s["name"], cid(s), s.get("restartCount", 0))
                         for s in p["status"].get("containerStatuses") or []))
    return out


def _synced(bed: Bed, before: float) -> bool:
    """kubelet ran a sync of every pod at least twice since `before` (kubelet_pod_worker_duration_seconds)."""
    now = metric_sum(bed.metrics(), "kubelet_pod_worker_duration_seconds_count", operation_type="sync")
    return now - before >= 2 * len(os.listdir(bed.manifests))


def _same_after(bed: Bed, action: Callable[[], None], what: str, reset: bool) -> str:
    from cri_server.api.v1 import api_pb2 as pb
    wait_for("stable pods Running", lambda: all(running(bed, n) for n in STABLE), 180)
    before = _stable_ids(bed)
    n_sandboxes = len(bed.cri_sandboxes())
    syncs = 0.0 if reset else metric_sum(bed.metrics(), "kubelet_pod_worker_duration_seconds_count",
                                         operation_type="sync")
    action()
    wait_for(f"kubelet to sync every pod twice after {what}", lambda: _synced(bed, syncs), 120, 2)
    wait_for("stable pods Running", lambda: all(running(bed, n) for n in STABLE), 60)
    after = _stable_ids(bed)
    diff = {n: (before[n], after[n]) for n in STABLE if before[n] != after[n]}
    check(not diff, f"changed after {what}: {diff}")
    check(len(bed.cri_sandboxes()) == n_sandboxes, f"sandboxes {n_sandboxes} -> {len(bed.cri_sandboxes())}")
    for n in STABLE:
        for _, c, _ in after[n][1]:
            check(bed.container_status(c).status.state == pb.CONTAINER_RUNNING, f"{n}: {c[:12]} not running")
    return f"{len(STABLE)} pods: same sandboxes, containers and restart counts"


def s_cri_restart(x: Ctx) -> str:
    a = _same_after(x.bed, lambda: x.bed.restart_cri(kill9=False), "husk-cri SIGTERM + start", False)
    b = _same_after(x.bed, lambda: x.bed.restart_cri(kill9=True), "husk-cri kill -9 + start", False)
    return f"SIGTERM: {a}; kill -9: {b}"


def s_kubelet_restart(x: Ctx) -> str:
    return _same_after(x.bed, lambda: x.bed.restart_kubelet(), "kubelet restart", True)


def _image_ids(bed: Bed) -> dict[str, str]:
    from cri_server.api.v1 import api_pb2 as pb
    return {t: i.id for i in bed.img().ListImages(pb.ListImagesRequest(), timeout=30).images for t in i.repo_tags}


def _image_info(bed: Bed, ref: str) -> dict[str, Any]:
    from cri_server.api.v1 import api_pb2 as pb
    st = bed.img().ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=ref), verbose=True), timeout=30)
    return json.loads(st.info["info"])


def _pull(bed: Bed, ref: str) -> tuple[str, list[str], int]:
    """Pulls `ref` through CRI; returns its id, the blob files only it has (manifest, config, layers busybox does
    not share) and the number of those layers."""
    from cri_server.api.v1 import api_pb2 as pb
    bed.img().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=120)
    info, base = _image_info(bed, ref), _image_info(bed, BUSYBOX)
    shared = {x["digest"] for x in base["layers"]}
    layers = [x["digest"] for x in info["layers"] if x["digest"] not in shared]
    blobs = os.path.join(bed.cri.root, "images", "content", "blobs", "sha256")
    files = [os.path.join(blobs, d.split(":")[1]) for d in [info["manifestDigest"], info["id"], *layers]]
    for f in files:
        check(os.path.isfile(f), f"{ref}: blob {f} not in husk-cri's content store")
    return info["id"], files, len(layers)


def _layer_dirs(bed: Bed) -> int:
    return len(os.listdir(os.path.join(bed.cri.root, "images", "snapshots", "layers")))


def _imagefs(bed: Bed) -> tuple[str, int, int]:
    from cri_server.api.v1 import api_pb2 as pb
    r = bed.img().ImageFsInfo(pb.ImageFsInfoRequest(), timeout=30)
    f = r.image_filesystems[0]
    return f.fs_id.mountpoint, f.used_bytes.value, f.inodes_used.value


def s_image_gc(x: Ctx) -> str:
    bed = x.bed
    ids_before = _image_ids(bed)
    img_id, own, n_layers = _pull(bed, GC_IMAGE)
    check(GC_IMAGE in _image_ids(bed), f"{GC_IMAGE} not listed after the pull")
    layer_dirs = _layer_dirs(bed)
    mnt, used_before, inodes_before = _imagefs(bed)
    # ImageFsInfo must name a directory on the filesystem that holds husk-cri's images
    check(os.path.isdir(mnt), f"ImageFsInfo mountpoint {mnt!r} is not a directory")
    check(os.stat(mnt).st_dev == os.stat(os.path.join(bed.cri.root, "images")).st_dev,
          f"ImageFsInfo mountpoint {mnt} is not on the images' filesystem")
    sv = os.statvfs(mnt)
    summ = bed.summary()["node"]["runtime"]["imageFs"]
    check(summ["capacityBytes"] == sv.f_blocks * sv.f_frsize,
          f"kubelet imageFs capacity {summ['capacityBytes']} != statvfs({mnt}) {sv.f_blocks * sv.f_frsize}")
    usage = 100 - summ["availableBytes"] * 100 // summ["capacityBytes"]
    high, low = max(usage - 5, 2), max(usage - 6, 1)
    off = bed.klog_size()
    bed.restart_kubelet(imageGCHighThresholdPercent=high, imageGCLowThresholdPercent=low)
    # kubelet's image GC runs at start (too early: its first try fails, "Stats initialization may not have
    # completed yet") and then every 5 minutes (pkg/kubelet/kubelet.go ImageGCPeriod)
    wait_for(f"kubelet's image GC to remove {GC_IMAGE}", lambda: GC_IMAGE not in _image_ids(bed), 360, 3)
    try:
        wait_for("the image's blobs and unpacked layers to be freed", lambda: not any(os.path.exists(f) for f in own)
                 and _layer_dirs(bed) <= layer_dirs - n_layers, 30)
    except Failed:
        raise Failed(f"left after the image was removed: blobs {[f for f in own if os.path.exists(f)]}, unpacked "
                     f"layers {layer_dirs} -> {_layer_dirs(bed)} (its own: {n_layers})") from None
    _, used_after, inodes_after = _imagefs(bed)
    # bytes move with metadata writes too; every removed blob is one inode less
    check(inodes_before - inodes_after >= len(own), f"ImageFsInfo inodes_used {inodes_before} -> {inodes_after} "
                                                    f"after removing {len(own)} blob files")
    logs = bed.klog_since(off)
    check(f'"Removing image to free bytes" imageID="{img_id}"' in logs, "no 'Removing image to free bytes' line")
    after = _image_ids(bed)
    check(BUSYBOX in after, "image GC removed busybox, which running pods use")
    check(SANDBOX_IMAGE in after, f"image GC removed the sandbox image {SANDBOX_IMAGE}: husk-cri did not report it "
                                  "pinned")
    removed = sorted(set(ids_before) - set(after))
    x.notes["image_gc_removed"] = ", ".join(removed)
    return f"imagefs {usage}% used, thresholds {high}/{low}: {GC_IMAGE.split('/')[-1]} removed through CRI, " \
           f"its blobs deleted, ImageFsInfo used {used_before} -> {used_after} B, inodes {inodes_before} -> " \
           f"{inodes_after}; also removed: {removed or 'nothing else'}"


def s_eviction(x: Ctx) -> str:
    bed = x.bed
    _pull(bed, GC_IMAGE2)
    mnt, _, _ = _imagefs(bed)
    sv = os.statvfs(mnt)
    off = bed.klog_size()
    bed.restart_kubelet(evictionHard={"memory.available": "1Mi", "imagefs.available": "99%",
                                      "nodefs.available": "0%"}, _v=3)  # type: ignore[arg-type]
    wait_for("the eviction manager to act on imagefs.available", lambda: '"Eviction manager: attempting to reclaim"'
             in bed.klog_since(off), 120, 2)
    wait_for(f"eviction's image GC to remove {GC_IMAGE2}", lambda: GC_IMAGE2 not in _image_ids(bed), 120, 2)
    wait_for("the eviction manager to try to evict a pod", lambda: '"Eviction manager: cannot evict a critical pod"'
             in bed.klog_since(off), 120, 2)
    logs = bed.klog_since(off)
    obs = re.findall(r'"Eviction manager:" log="observations" signal="imagefs.available" resourceName="[^"]*" '
                     r'available="(\w+)" capacity="(\w+)"', logs)
    check(bool(obs), "no imagefs.available observation logged (v=3)")
    avail, cap = (quantity(v) for v in obs[-1])
    check(cap == sv.f_blocks * sv.f_frsize, f"observed imagefs capacity {cap} != statvfs({mnt})")
    check(abs(avail - sv.f_bavail * sv.f_frsize) < 2 << 30, f"observed imagefs available {avail} vs statvfs "
                                                              f"{sv.f_bavail * sv.f_frsize}")
    check(re.search(r'"Eviction manager: attempting to reclaim" resourceName="ephemeral-storage"', logs) is not None,
          "no reclaim of ephemeral-storage")
    ranked = re.findall(r'"Eviction manager: pods ranked for eviction" pods=\[([^\]]*)\]', logs)
    check(bool(ranked), "the eviction manager ranked no pods")
    crit = re.findall(r'"Eviction manager: cannot evict a critical pod" pod="([^"]+)"', logs)
    check(bool(crit), "the eviction manager did not try to evict a pod")
    x.notes["eviction"] = "static pods are critical: kubelet never evicts them"
    bed.restart_kubelet()
    return f"imagefs.available observed {avail >> 30} GiB of {cap >> 30} GiB (= statvfs of {mnt}); " \
           f"{GC_IMAGE2.split('/')[-1]} removed by the eviction manager's image GC; pod eviction refused by kubelet " \
           f"itself ('cannot evict a critical pod': static pods); ranked: {ranked[-1][:120]}"


def s_manifest_removal(x: Ctx) -> str:
    from cri_server.api.v1 import api_pb2 as pb
    bed = x.bed
    p = wait_for("basic Running", lambda: running(bed, "basic"), 60)
    uid = p["metadata"]["uid"]
    sb = bed.cri_sandboxes("basic")[0].id
    bed.remove_pod("basic")
    wait_for("basic gone from /pods", lambda: "basic" not in bed.pods(), 90)

    def stopped() -> bool:
        cs = bed.cri_containers("basic")
        ss = bed.cri_sandboxes("basic")
        return all(c.state != pb.CONTAINER_RUNNING for c in cs) and all(s.state != pb.SANDBOX_READY for s in ss)
    wait_for("basic's containers and sandbox stopped in CRI", stopped, 90)
    podcg = _cg(bed, "memory", f"{bed.cgroup_root}/kubepods/besteffort/pod{uid}")
    wait_for(f"pod cgroup {podcg} removed", lambda: not os.path.exists(podcg), 90)
    wait_for("kubelet's pod dir removed", lambda: not os.path.exists(os.path.join(bed.kroot, "pods", uid)), 120, 2)
    check(not os.path.exists(os.path.join(bed.cri.state, "netns", sb)), "netns of the removed pod left")
    return "containers + sandbox stopped, pod cgroup and kubelet pod dir removed, netns gone"


def s_cri_errors(x: Ctx) -> str:
    """Every CRI error kubelet logged in this pass: only husk-cri being down (its restarts: Unavailable while
    dialing) and NotFound for a container kubelet asked about while removing it are expected."""
    with open(x.bed.klog_path, errors="replace") as f:
        lines = [ln for ln in f if "rpc error: code = " in ln]
    counts: dict[str, int] = {}
    bad = []
    for ln in lines:
        code = re.search(r"rpc error: code = (\w+)", ln).group(1)  # type: ignore[union-attr]
        if code == "Unavailable" and any(m in ln for m in ("Error while dialing", "error reading from server: EOF",
                                                         "transport is closing")):
            key = "Unavailable (husk-cri down)"
        elif code == "NotFound" and ('"ContainerStatus from runtime service failed"' in ln
                                     or "failed to get container status" in ln):
            key = "NotFound (ContainerStatus of a removed container)"
        else:
            key = code
            bad.append(ln.strip()[:400])
        counts[key] = counts.get(key, 0) + 1
    nano = sum(1 for ln in open(x.bed.klog_path, errors="replace") if "Failed updating cpu usage nano core" in ln)
    check(not bad, f"{len(bad)} unexpected CRI errors, first: {bad[:3]}")
    return f"{counts or 'none'}; 'Failed updating cpu usage nano core': {nano}"


SCENARIOS: list[tuple[str, Callable[[Ctx], str]]] = [
    ("start-status", s_start_status), ("init-containers", s_init), ("volumes", s_volumes), ("env", s_env),
    ("qos-cgroups", s_qos), ("startup-probe", s_startup), ("readiness-tcp-probe", s_readiness),
    ("liveness-exec-probe", s_liveness_exec), ("liveness-http-probe", s_liveness_http),
    ("log-rotation", s_log_rotation), ("restart-backoff", s_backoff), ("container-gc", s_container_gc),
    ("stats", s_stats), ("husk-cri-restart", s_cri_restart), ("kubelet-restart", s_kubelet_restart),
    ("image-gc", s_image_gc), ("eviction-imagefs", s_eviction), ("manifest-removal", s_manifest_removal),
    ("kubelet-cri-errors", s_cri_errors),
]


def run_pass(kubelet: str, out: str, cache: str, gate_on: bool, only: set[str]) -> list[tuple[str, str, str]]:
    gates = {GATE: gate_on}
    label = f"{GATE}={'on' if gate_on else 'off'}"
    bed = Bed(kubelet, out, cache, gates)
    results: list[tuple[str, str, str]] = []
    hist = History(bed)
    th = threading.Thread(target=hist.run, name="history", daemon=True)
    try:
        bed.start()
        log(f"{bed.version}, {label}: kubelet up (log {bed.klog_path})")
        for m in manifests(bed.host_dir):
            bed.add_pod(m)
        th.start()
        x = Ctx(bed, hist, gates)
        for name, fn in SCENARIOS:
            if only and name not in only:
                continue
            t0 = time.monotonic()
            try:
                detail = fn(x)
                results.append((name, "PASS", detail))
            except Failed as e:
                results.append((name, "FAIL", str(e)))
            except Exception as e:  # noqa: BLE001 -- a scenario's crash is its failure; the others still run
                results.append((name, "FAIL", f"{type(e).__name__}: {e}"))
                traceback.print_exc()
            log(f"{label} {name}: {results[-1][1]} ({time.monotonic() - t0:.0f}s) {results[-1][2]}")
    except Exception as e:  # noqa: BLE001
        results.append(("setup", "FAIL", f"{type(e).__name__}: {e}"))
        traceback.print_exc()
    finally:
        hist.stop.set()
        if th.is_alive():
            th.join(10)
        left = bed.close()
        results.append(("clean-stop", "FAIL" if left else "PASS",
                        "; ".join(left) if left else "no pods, containers, mounts, cgroups, processes, netns, bridge"))
        log(f"{label} clean-stop: {results[-1][1]} {results[-1][2]}")
    return [(f"{label}", n, f"{r}: {d}") for n, r, d in results]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kubelet", default=os.environ.get("KUBELET", ""))
    ap.add_argument("--gates", default="off,on", help="PodAndContainerStatsFromCRI values to run: off,on | off | on")
    ap.add_argument("--only", action="append", default=[], help=f"scenario (repeatable): "
                    f"{', '.join(n for n, _ in SCENARIOS)}")
    ap.add_argument("--out", default="")
    ap.add_argument("--cache", default=os.path.join(TOP, ".cache", "kubelet-e2e"))
    ap.add_argument("--keep", action="store_true", help="keep the output dir (logs) even when everything passed")
    a = ap.parse_args()
    if not a.kubelet:
        print("kubelet-e2e: skipped (no kubelet: set KUBELET=path or pass --kubelet PATH)")
        return 0
    if not os.access(a.kubelet, os.X_OK):
        print(f"kubelet-e2e: --kubelet {a.kubelet}: not an executable file", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("kubelet-e2e: needs root (cgroups, mounts, network namespaces)", file=sys.stderr)
        return 2
    unknown = set(a.only) - {n for n, _ in SCENARIOS}
    if unknown:
        print(f"kubelet-e2e: unknown scenario(s) {sorted(unknown)}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, _f: sys.exit(128 + n))
    out = a.out or tempfile.mkdtemp(prefix="hke-", dir="/tmp")
    rows: list[tuple[str, str, str]] = []
    for g in [v.strip() for v in a.gates.split(",") if v.strip()]:
        d = os.path.join(out, f"gate-{g}")
        os.makedirs(d, exist_ok=True)
        rows += run_pass(a.kubelet, d, a.cache, g == "on", set(a.only))
    version = subprocess.run([a.kubelet, "--version"], capture_output=True, text=True).stdout.strip()
    print()
    print(f"| kubelet | {GATE} | scenario | result |")
    print("|---|---|---|---|")
    for label, name, res in rows:
        print(f"| {version} | {label.split('=')[1]} | {name} | {res.replace('|', '/')} |")
    failed = [r for r in rows if r[2].startswith("FAIL")]
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"kubelet": version, "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)
    print(f"\n{len(rows) - len(failed)} passed, {len(failed)} failed; logs in {out}")
    if not failed and not a.keep:
        shutil.rmtree(out, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
