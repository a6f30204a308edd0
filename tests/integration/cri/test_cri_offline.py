"""`husk-cri pods|ps|inspect|logs` against a real husk-cri's state: they agree with the CRI answers while husk-cri
runs, keep answering (live state from the shims, logs followed) after it stopped, while it hangs in the middle of
a request and after it was killed there; and a `logs -f` reading the store never keeps husk-cri from writing."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Iterator

import pytest

from cri_server import offline
from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX
from tests.integration.cri.helpers import (container_config, pod_config, run_pod, start_container, status,
                                           wait_exited, wait_for)

pytestmark = [pytest.mark.root, pytest.mark.e2e]

CLI_TIMEOUT = 30     # a command that blocks on the store or on husk-cri fails here instead of hanging the suite
NOTE = "(husk-cri not asked)"


def cli(cri: Any, *args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "cri_server", "--config", cri.config_path, *args],
                       capture_output=True, text=True, timeout=CLI_TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("# read directly from ") and NOTE in r.stderr.splitlines()[0]
    return r


@contextlib.contextmanager
def following(cri: Any, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`husk-cri logs -f ...` running; killed after CLI_TIMEOUT so that a hang fails the test (its stdout ends)."""
    proc = subprocess.Popen([sys.executable, "-m", "cri_server", "--config", cri.config_path, "logs", "-f", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(CLI_TIMEOUT, proc.kill)
    watchdog.start()
    try:
        yield proc
    finally:
        watchdog.cancel()
        watchdog.join()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def next_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"logs -f ended (exit {proc.poll()})"
    return line


def rows(out: str) -> dict[str, list[str]]:
    """A crictl-style table: first cell -> cells (columns split on runs of 3+ spaces, as tabwriter pads)."""
    import re
    lines = out.splitlines()
    return {cells[0]: cells for cells in (re.split(r" {3,}", line.rstrip()) for line in lines[1:])}


def expected_pod_rows(rt: Any) -> dict[str, list[str]]:
    out = {}
    for p in rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items:
        out[p.id[:13]] = [p.id[:13], "Ready" if p.state == pb.SANDBOX_READY else "NotReady", p.metadata.name,
                          p.metadata.namespace, str(p.metadata.attempt), p.runtime_handler or "(default)"]
    return out


def expected_container_rows(rt: Any, only_running: bool = False) -> dict[str, list[str]]:
    names = {pb.CONTAINER_CREATED: "Created", pb.CONTAINER_RUNNING: "Running", pb.CONTAINER_EXITED: "Exited",
             pb.CONTAINER_UNKNOWN: "Unknown"}
    out = {}
    for c in rt.ListContainers(pb.ListContainersRequest(), timeout=30).containers:
        if only_running and c.state != pb.CONTAINER_RUNNING:
            continue
        out[c.id[:13]] = [c.id[:13], c.image.image, names[c.state], c.metadata.name, str(c.metadata.attempt),
                          c.pod_sandbox_id[:13], c.labels.get(offline.POD_NAME_LABEL, "unknown"),
                          c.labels.get(offline.POD_NAMESPACE_LABEL, "unknown")]
    return out


def without_created(table: dict[str, list[str]], created_col: int) -> dict[str, list[str]]:
    return {k: v[:created_col] + v[created_col + 1:] for k, v in table.items()}


def inspect_json(cri: Any, cid: str) -> dict[str, Any]:
    return json.loads(cli(cri, "inspect", cid[:10]).stdout)


def rpc_status(rt: Any, cid: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """ContainerStatus(verbose) as crictl inspect shows it: times as RFC 3339 text."""
    from google.protobuf import json_format
    resp = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=30)
    st = json.loads(json_format.MessageToJson(resp.status, always_print_fields_with_no_presence=True))
    for key in ("createdAt", "startedAt", "finishedAt"):
        st[key] = offline.rfc3339(int(st[key]))
    return st, json.loads(resp.info["info"])


def set_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """inspect's status without the nulls crictl prints for unset messages (protojson leaves them out)."""
    return {k: v for k, v in doc.items() if v is not None}


def ticker(name: str) -> pb.ContainerConfig:
    """Prints a numbered line every 0.1 s until /stop exists in its rootfs, then exits 3."""
    cfg = container_config(name, ["sh", "-c", "echo hello; echo oops >&2; i=0; while [ ! -e /stop ]; do "
                                              "i=$((i+1)); echo tick $i; sleep 0.1; done; exit 3"])
    cfg.labels[offline.POD_NAME_LABEL] = "offline"
    return cfg


def ticks(text: str) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith("tick ")]


def test_offline_views_agree_with_the_cri_and_work_after_husk_cri_stopped(cri):
    rt, im = cri.runtime_stub(), cri.image_stub()
    im.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    pod = pod_config(cri, "offline")
    pod_id = run_pod(rt, pod)
    tick_id = start_container(rt, pod_id, pod, ticker("ticker"))
    done_id = start_container(rt, pod_id, pod, container_config("done", ["sh", "-c", "echo bye; exit 0"]))
    wait_exited(rt, done_id)
    wait_for(lambda: " tick " in open(status(rt, tick_id).log_path).read(), what="ticks in the log")

    # (a) husk-cri runs: the same rows and status as its answers (CREATED is relative to now: left out).
    assert without_created(rows(cli(cri, "pods").stdout), 1) == expected_pod_rows(rt)
    assert without_created(rows(cli(cri, "ps", "-a").stdout), 2) == expected_container_rows(rt)
    assert without_created(rows(cli(cri, "ps").stdout), 2) == expected_container_rows(rt, only_running=True)
    for cid in (tick_id, done_id):
        doc = inspect_json(cri, cid)
        st, info = rpc_status(rt, cid)
        assert set_fields(doc["status"]) == st
        assert doc["info"]["pid"] == info["pid"] and doc["info"]["sandboxID"] == pod_id
        assert doc["info"]["config"]["metadata"]["name"] in ("ticker", "done")
        assert doc["info"]["runtimeSpec"]["process"]["args"][0] == "sh"
    assert json.loads(cli(cri, "inspect", pod_id[:8]).stdout)["status"]["metadata"]["name"] == "offline"
    assert cli(cri, "logs", done_id).stdout == "bye\n"
    logs = cli(cri, "logs", tick_id)
    assert logs.stdout.startswith("hello\ntick 1\n") and logs.stderr.splitlines()[1:] == ["oops"]
    assert len(cli(cri, "logs", "--tail", "2", tick_id).stdout.splitlines()) == 2

    # A `logs -f` reading the store and the log does not keep husk-cri from writing its store.
    with following(cri, tick_id) as follower:
        assert next_line(follower) == "hello\n"
        other_id = run_pod(rt, pod_config(cri, "offline-2"))
        assert other_id[:13] in rows(cli(cri, "pods").stdout)
        assert next_line(follower) == "tick 1\n"

    # (b) husk-cri stopped (SIGTERM): the same answers, live state from the shims, logs followed.
    before_pods = expected_pod_rows(rt)
    before_ps = expected_container_rows(rt)
    before_status = inspect_json(cri, tick_id)["status"]
    cri.stop()
    assert without_created(rows(cli(cri, "pods").stdout), 1) == before_pods
    assert without_created(rows(cli(cri, "ps", "-a").stdout), 2) == before_ps
    doc = inspect_json(cri, tick_id)
    assert doc["status"] == before_status and doc["info"]["live"]["source"] == "shim"
    assert doc["info"]["live"]["status"] == "RUNNING"

    with following(cri, "--tail", "1", tick_id) as follower:
        first = ticks(next_line(follower))
        assert first
        # New lines arrive while husk-cri is down: the shim keeps writing the log and -f keeps reading it.
        while not any(n > first[0] + 3 for n in ticks(next_line(follower))):
            pass
        open(os.path.join(doc["info"]["bundle"], "rootfs", "stop"), "w").close()
        follower.wait()                       # the container ended: -f ends by itself (the watchdog otherwise)
        assert follower.returncode == 0

    ended = inspect_json(cri, tick_id)
    assert ended["status"]["state"] == "CONTAINER_EXITED" and ended["status"]["exitCode"] == 3
    assert ended["info"]["live"]["status"] == "STOPPED"
    ps_rows = rows(cli(cri, "ps", "-a").stdout)
    assert ps_rows[tick_id[:13]][3] == "Exited"
    assert tick_id[:13] not in rows(cli(cri, "ps").stdout)

    # husk-cri started again records the same exit.
    cri.start()
    rt = cri.runtime_stub()
    s = wait_exited(rt, tick_id)
    assert s.exit_code == 3
    assert without_created(rows(cli(cri, "ps", "-a").stdout), 2) == expected_container_rows(rt)


def test_offline_views_answer_while_husk_cri_hangs_mid_request_and_after_it_was_killed(cri):
    rt, im = cri.runtime_stub(), cri.image_stub()
    im.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120)
    pod = pod_config(cri, "hang")
    pod_id = run_pod(rt, pod)
    cid = start_container(rt, pod_id, pod, ticker("ticker"))
    db = os.path.join(cri.root, "metadata.db")

    # A RunPodSandbox in flight; husk-cri is frozen once its record exists (mid-request).
    errors: list[BaseException] = []

    def run_other() -> None:
        try:
            run_pod(cri.runtime_stub(), pod_config(cri, "inflight"))
        except Exception as e:  # noqa: BLE001 -- the RPC fails once husk-cri is killed below
            errors.append(e)

    t = threading.Thread(target=run_other)
    t.start()
    wait_for(lambda: len(offline.read_records(db).sandboxes) == 2, what="the in-flight sandbox's record")
    assert cri.proc is not None
    os.kill(cri.proc.pid, signal.SIGSTOP)
    try:
        assert rows(cli(cri, "ps").stdout)[cid[:13]][3] == "Running"
        assert pod_id[:13] in rows(cli(cri, "pods").stdout)
        assert inspect_json(cri, cid)["info"]["live"]["status"] == "RUNNING"
        assert cli(cri, "logs", "--tail", "1", cid).stdout.startswith("tick ")
    finally:
        os.kill(cri.proc.pid, signal.SIGKILL)     # killed in the middle of the request
        cri.proc.wait(30)
    t.join(60)
    assert not t.is_alive()

    assert rows(cli(cri, "ps").stdout)[cid[:13]][3] == "Running"
    assert pod_id[:13] in rows(cli(cri, "pods").stdout)
    assert inspect_json(cri, cid)["status"]["state"] == "CONTAINER_RUNNING"

    # A hung shim costs one --shim-timeout: the container is shown Unknown and the command answers.
    shim_pid = inspect_json(cri, cid)["info"]["shim_pid"]
    os.kill(shim_pid, signal.SIGSTOP)
    try:
        r = cli(cri, "ps", "-a", "--shim-timeout", "0.5")
        assert rows(r.stdout)[cid[:13]][3] == "Unknown" and "no answer" in r.stderr
    finally:
        os.kill(shim_pid, signal.SIGCONT)
    cri.start()
    wait_for(lambda: status(cri.runtime_stub(), cid).state == pb.CONTAINER_RUNNING, what="husk-cri recovered")
