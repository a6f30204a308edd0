#!/usr/bin/env python3
"""Runs critest (cri-tools' conformance suite, built outside this repository) against a husk-cri of its own.

Builds the test images locally (scripts/build-test-images' catalog plus critest's stand-ins: nginx, httpd,
nonewprivs, ...), serves them from the distro's docker-registry on a free 127.0.0.1 port, maps every upstream
registry critest names to it with hosts.toml files (no other host is ever contacted), starts husk-cri with a
private pod network, runs critest, summarises the report and removes everything it started.

Usage: scripts/critest [--out DIR] [--critest PATH] [--runtime in-process|runc] [-- extra critest/ginkgo flags]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TOP)

MIRRORED = ("registry.k8s.io", "k8s.gcr.io", "gcr.io", "docker.io", "public.ecr.aws")
SANDBOX_IMAGE = "registry.k8s.io/pause:3.9-husk"


def build_images(cache: str, log) -> list[tuple[str, list[str]]]:  # type: ignore[no-untyped-def]
    """(layout dir, registry paths) of every image critest may pull, the stand-ins last (they win)."""
    from cri_server.images import testimages
    from cri_server.images.builder import LayerCache, write_image
    from tests.support import critest_images
    layouts = os.path.join(cache, "layouts")
    index = testimages.build(layouts, big=False, log=lambda *_: None)
    out = [(os.path.join(layouts, v["layout"]), list(v["refs"])) for v in index.values()]
    helpers = critest_images.compile_helpers(os.path.join(cache, "helpers"))
    busybox = critest_images.dynamic_busybox(os.path.join(cache, "deb"))
    extra = os.path.join(cache, "critest-layouts")
    os.makedirs(extra, exist_ok=True)
    lc = LayerCache()
    for spec in critest_images.catalog(busybox, helpers):
        write_image(extra, spec, lc)
        out.append((os.path.join(extra, spec.name), list(spec.refs)))
    log(f"{len(out)} image layouts ready")
    return out


def summarize(report: str) -> dict:
    with open(report) as f:
        suites = json.load(f)
    counts = {"passed": 0, "failed": 0, "skipped": 0, "pending": 0, "other": 0}
    failures = []
    for suite in suites:
        for spec in suite.get("SpecReports") or ():
            if spec.get("LeafNodeType") != "It":
                continue
            state = spec.get("State", "")
            key = state if state in counts else ("failed" if state in ("panicked", "timedout", "interrupted")
                                                 else "other")
            counts[key] += 1
            if key == "failed":
                name = " ".join(spec.get("ContainerHierarchyTexts") or []) + " " + spec.get("LeafNodeText", "")
                msg = (spec.get("Failure") or {}).get("Message", "").strip().splitlines()
                failures.append({"spec": name.strip(), "reason": msg[0][:300] if msg else state})
    return {"counts": counts, "failures": failures}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), f"husk-critest-{time.strftime('%Y%m%dT%H%M%S')}"))
    ap.add_argument("--cache", default=os.path.join(TOP, ".cache", "critest"))
    ap.add_argument("--critest", default=os.environ.get("CRITEST") or shutil.which("critest") or "",
                    help="the critest binary (default: $CRITEST, else critest on PATH)")
    ap.add_argument("--runtime", default="in-process", help="husk-cri's runtime: in-process (husk) or runc")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds for the whole critest run")
    ap.add_argument("extra", nargs="*", help="extra critest/ginkgo flags (after --)")
    a = ap.parse_args()
    # A SIGTERM (e.g. from `timeout`) must still run the cleanup below: raise instead of dying.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda n, _f: sys.exit(128 + n))
    if not a.critest or not os.path.isfile(a.critest):
        print(f"critest not found ({a.critest or 'not on PATH'}): build cri-tools outside this repository and "
              "pass --critest or set CRITEST",
              file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)

    def log(msg: str) -> None:
        print(f"critest: {msg}", flush=True)

    from tests.support.cri import CriDaemon, PodNetwork
    from tests.support.registry import LocalRegistry, write_hosts_toml
    images = build_images(a.cache, log)
    reg = LocalRegistry(os.path.join(a.out, "registry"))
    net = daemon = None
    try:
        reg.start()
        for layout, refs in images:
            for ref in refs:
                reg.push(layout, ref)
        log(f"registry on {reg.addr} with {sum(len(r) for _, r in images)} references")
        certs = os.path.join(a.out, "certs.d")
        for host in MIRRORED:
            write_hosts_toml(certs, host, f"http://{reg.addr}")
        net = PodNetwork(a.out)
        daemon = CriDaemon(a.out, net, certs, SANDBOX_IMAGE, runtime=a.runtime)
        daemon.start()
        log(f"husk-cri on unix://{daemon.socket} (runtime {a.runtime}, bridge {net.bridge}, {net.subnet})")
        endpoint = f"unix://{daemon.socket}"
        args = [a.critest, "-runtime-endpoint", endpoint, "-image-endpoint", endpoint, "-ginkgo.no-color",
                "-ginkgo.v", "-ginkgo.timeout", f"{a.timeout - 60}s",
                "-ginkgo.json-report", os.path.join(a.out, "report.json"),
                "-ginkgo.junit-report", os.path.join(a.out, "junit.xml"), *a.extra]
        t0 = time.monotonic()
        with open(os.path.join(a.out, "critest.log"), "wb") as f:
            rc = subprocess.run(args, cwd=a.out, stdout=f, stderr=subprocess.STDOUT, timeout=a.timeout).returncode
        log(f"critest exited {rc} after {time.monotonic() - t0:.0f}s; log {a.out}/critest.log")
        report = os.path.join(a.out, "report.json")
        if os.path.exists(report):
            s = summarize(report)
            with open(os.path.join(a.out, "summary.json"), "w") as f:
                json.dump(s, f, indent=1)
            c = s["counts"]
            log(f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
            for fl in s["failures"]:
                log(f"FAIL {fl['spec']}: {fl['reason']}")
        return rc
    finally:
        if daemon is not None:
            daemon.cleanup()
        if net is not None:
            net.cleanup()
        reg.stop()


if __name__ == "__main__":
    sys.exit(main())
