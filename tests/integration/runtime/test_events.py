"""`husk events`: runc's JSON stats records (same keys as runc 1.1.5 prints for the same container), the
interval stream, OOM notifications, and the end of the stream when the container stops."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.conftest import unique
from tests.support import procfs
from tests.support.waiting import wait_for

pytestmark = pytest.mark.root


def shape(v):
    """The structure of a JSON value: dict keys recursively, list element shape, type names otherwise."""
    if isinstance(v, dict):
        return {k: shape(x) for k, x in v.items()}
    if isinstance(v, list):
        return [shape(v[0])] if v else []
    return type(v).__name__


def edit(c: dict) -> None:
    c["linux"]["resources"].update({"memory": {"limit": 64 << 20}, "pids": {"limit": 40},
                                    "cpu": {"quota": 50000, "period": 100000}})
    c["ociVersion"] = "1.0.2-dev"


def _throttled_with_cache(rt, cid: str) -> dict | None:
    """A stats record once the container was throttled, has page cache and is down to its one process (dd,
    which makes the cache, has exited: read while it ran, pids.current was 2)."""
    rec = json.loads(rt("events", "--stats", cid).stdout)
    if rec["data"]["memory"].get("cache") and rec["data"]["cpu"]["throttling"].get("throttledPeriods") \
            and rec["data"]["pids"].get("current") == 1:
        return rec
    return None


def read_line(p: subprocess.Popen, timeout: float) -> str:
    """The next line of `p`'s stdout, nothing read from it before (its buffer is empty: select sees all);
    AssertionError if no output comes within `timeout` s. husk writes each event in one flushed write."""
    import select
    if not select.select([p.stdout], [], [], timeout)[0]:
        raise AssertionError(f"no output from {p.args} within {timeout:g} s")
    return p.stdout.readline()


def test_stats_have_runcs_shape(husk, runc, make_bundle) -> None:
    got = {}
    for name, rt in (("husk", husk), ("runc", runc)):
        cid = unique(f"rtit-ev{name[0]}")
        # some CPU use and page cache first, so that counters runc omits when zero are present in both: the loop
        # burns more CPU than the 50% quota allows in one period, so both containers are throttled whatever the
        # machine's load (with 20000 rounds one of them sometimes was not, and its throttling had fewer keys)
        b = make_bundle(["sh", "-c", "i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done; "
                                     "dd if=/dev/zero of=/dev/shm/f bs=1M count=2 2>/dev/null; sleep 1000"], edit=edit)
        assert rt.run(b, cid, "-d").returncode == 0
        got[name] = wait_for(lambda: _throttled_with_cache(rt, cid), 30,
                             f"{name}'s container to be throttled, to have page cache and one process")
    h, r = got["husk"], got["runc"]
    assert (h["type"], r["type"]) == ("stats", "stats")
    assert h["id"] != r["id"]
    # runc's raw memory.stat keys and the per-cpu lists come from the same kernel files
    from runtime.cgroups import is_unified
    if is_unified():  # husk also reports cgroup v2's memory.peak, which runc 1.1.5 does not read
        h["data"]["memory"]["usage"].pop("max", None)
    assert shape(h) == shape(r), json.dumps([shape(h), shape(r)])
    assert h["data"]["pids"] == {"current": 1, "limit": 40} == r["data"]["pids"]
    assert h["data"]["memory"]["usage"]["limit"] == r["data"]["memory"]["usage"]["limit"] == 64 << 20
    assert h["data"]["cpuset"] == r["data"]["cpuset"]


def test_stats_line_is_compact_json(husk, make_bundle) -> None:
    cid = unique("rtit-evl")
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    out = husk("events", "--stats", cid).stdout
    assert out.count("\n") == 1 and out.startswith('{"type":"stats","id":"') and ": " not in out


def test_interval_stream_and_end_when_container_stops(husk, make_bundle) -> None:
    cid = unique("rtit-evs")
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    p = subprocess.Popen([*husk.argv, "--root", husk.root, "events", "--interval", "200ms", cid],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [p.stdout.readline() for _ in range(3)]
        assert all(json.loads(x)["type"] == "stats" for x in lines)
        husk("kill", cid, "KILL")
        # the stream ends with the container (read on meanwhile: a full pipe would block the writer)
        rest, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        assert all(json.loads(x)["type"] == "stats" for x in rest.splitlines())
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_oom_event(husk, make_bundle) -> None:
    def small(c: dict) -> None:
        c["linux"]["resources"]["memory"] = {"limit": 16 << 20, "swap": 16 << 20}
    cid = unique("rtit-evoom")
    husk.run(make_bundle(["sleep", "1000"], edit=small), cid, "-d")
    p = subprocess.Popen([*husk.argv, "--root", husk.root, "events", "--interval", "1h", cid],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # events registers the OOM notification (v1: an eventfd on cgroup.event_control; v2: an inotify watch on
        # memory.events) before it opens the init's pidfd: once that fd is open, an OOM cannot be missed
        wait_for(lambda: "anon_inode:[pidfd]" in procfs.fd_targets(p.pid) or p.poll() is not None, 30,
                 "`husk events` to open the init's pidfd")
        assert p.poll() is None, p.stderr.read()
        # a 64 MiB buffer cannot fit a 16 MiB cgroup: the OOM killer ends dd
        husk("exec", cid, "dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1", check=False,
             stdin=subprocess.DEVNULL)
        # the interval is 1 h: the next line is the oom event or nothing (the timeout fails the test)
        line = read_line(p, 30)
        assert json.loads(line) == {"type": "oom", "id": cid}
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("args, needle", [
    (["--interval", "0s"], "greater than 0"),
    (["--interval", "soon"], "invalid duration"),
])
def test_bad_interval(husk, make_bundle, args, needle) -> None:
    cid = unique("rtit-evbad")
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    cp = husk("events", *args, cid, check=False)
    assert cp.returncode == 1 and needle in cp.stderr


def test_events_of_a_stopped_or_missing_container(husk, make_bundle) -> None:
    cp = husk("events", "--stats", "nosuch", check=False)
    assert cp.returncode == 1 and "does not exist" in cp.stderr
    cid = unique("rtit-evstop")
    husk.run(make_bundle(["true"]), cid, "-d")
    husk.wait_status(cid, "stopped")
    cp = husk("events", "--stats", cid, check=False)
    assert cp.returncode == 1 and "is not running" in cp.stderr


def test_checkpoint_and_restore_are_clear_errors(husk, make_bundle) -> None:
    cid = unique("rtit-cr")
    husk.run(make_bundle(["sleep", "1000"]), cid, "-d")
    for args in (["checkpoint", "--image-path", "/nowhere", "--leave-running", cid],
                 ["restore", "--bundle", "/nowhere", "--image-path", "/nowhere", "--detach", cid]):
        cp = husk(*args, check=False)
        assert cp.returncode == 1 and "not supported" in cp.stderr
    assert husk.state(cid)["status"] == "running"
