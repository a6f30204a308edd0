"""Pulls in a worker process (ImageService(pull_worker=True), what husk-cri uses; images/pullworker.py): the same
records, errors (class and message) and metrics hooks as in-process; concurrent pulls of one reference share one
worker; a cancelled pull or a closing service stops its worker and leaves no image; the worker dies with its
parent; the process that asked never imports the registry client (aiohttp). A worker is kept IDLE_S after
a pull: the next pull uses it (no imports again); it ends after the idle time or at close(); a cancelled pull's
worker is not reused; one that died idle is replaced."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from cri_server.images import pull as pullmod
from cri_server.images import pullworker
from cri_server.images.auth import AuthConfig
from cri_server.images.errors import ImageError, NotFound, Unauthorized
from cri_server.images.service import ImageService
from tests.support.imagetest import certs_for, run
from tests.support.procfs import args
from tests.support.registry import PASSWORD, USER, write_hosts_toml
from tests.support.waiting import wait_for, wait_for_async

pytestmark = pytest.mark.root

LAYERED = "docker.io/husk-test/layered:v1"
HANG = "hang.test/stuck/image:v1"


def _svc(tmp_path, certs, worker: bool = True, **kw) -> ImageService:  # type: ignore[no-untyped-def]
    return ImageService(str(tmp_path / "root"), certs, retry_backoff=0.01, pull_worker=worker, **kw)


def _workers(parent: int) -> list[int]:
    """Live pull workers whose parent is `parent`."""
    out = []
    for p in (x for x in os.listdir("/proc") if x.isdigit()):
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            if int(st[1]) == parent and st[0] not in "ZX" and "pullworker" in args(int(p)):
                out.append(int(p))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except (FileNotFoundError, ProcessLookupError):   # ESRCH: reaped while read
        return True


@pytest.fixture
def hanging(tmp_path, certs_dir) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A registry host (hang.test, in certs_dir) that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    write_hosts_toml(certs_dir, "hang.test", f"http://127.0.0.1:{srv.getsockname()[1]}")
    try:
        yield certs_dir
    finally:
        srv.close()


def test_pull_in_a_worker_records_and_metrics_hooks(tmp_path, certs_dir, registry, monkeypatch):
    started: list[asyncio.Task] = []  # type: ignore[type-arg]
    fetched: list[int] = []
    monkeypatch.setattr(pullmod, "on_pull", lambda task, t0: started.append(task))
    monkeypatch.setattr(pullmod, "on_fetched", fetched.append)
    runs: list[str] = []
    real_run = pullworker.run

    async def counting_run(ref, *a, **kw):  # type: ignore[no-untyped-def]
        runs.append(ref)
        return await real_run(ref, *a, **kw)
    monkeypatch.setattr(pullworker, "run", counting_run)

    async def main():
        svc = _svc(tmp_path, certs_dir)
        try:
            rec = await svc.pull("busybox")
            assert rec.repo_tags == ("docker.io/library/busybox:latest",) and rec.config.cmd == ("sh",)
            for x in rec.layers:
                svc.content.verify(x.digest)
            assert svc.list() == [rec] and svc.get("busybox") == rec
            assert len(started) == 1 and started[0].done() and started[0].exception() is None
            assert fetched == [sum(x.size for x in rec.layers)]
            # again: the worker finds everything on disk and downloads nothing
            assert (await svc.pull("busybox")).id == rec.id
            assert len(fetched) == 1 and len(started) == 2
            # concurrent pulls of one reference: one worker
            runs.clear()
            recs = await asyncio.gather(*(svc.pull(LAYERED) for _ in range(3)))
            assert len({r.id for r in recs}) == 1 and runs == [LAYERED]
            assert all(x.state == "ready" for x in svc.db.layers())
            assert os.listdir(svc.snapshots.tmp_dir) == []
        finally:
            await svc.close()
    run(main())


def test_errors_are_the_in_process_ones(tmp_path, certs_dir, registry, htpasswd_registry):
    write_hosts_toml(certs_dir, htpasswd_registry.addr, f"http://{htpasswd_registry.addr}")
    private = f"{htpasswd_registry.addr}/private/layered:v1"
    cases = [("busybox:no-such-tag", None, None), (private, None, None),  # NotFound, Unauthorized twice
             (private, AuthConfig(username=USER, password="wrong"), None)]

    async def attempt(svc: ImageService, ref, auth, platform) -> ImageError:  # type: ignore[no-untyped-def]
        with pytest.raises(ImageError) as ei:
            await svc.pull(ref, auth, platform)
        return ei.value

    async def main():
        inproc, worker = _svc(tmp_path / "a", certs_dir, False), _svc(tmp_path / "b", certs_dir)
        try:
            classes = []
            for ref, auth, platform in cases:
                want = await attempt(inproc, ref, auth, platform)
                got = await attempt(worker, ref, auth, platform)
                assert type(got) is type(want) and str(got) == str(want) and got.code == want.code, ref
                classes.append(type(got))
            assert classes == [NotFound, Unauthorized, Unauthorized] and "refused" in str(got)
            assert worker.list() == []
            # the right credentials, sent on stdin
            rec = await worker.pull(private, AuthConfig(username=USER, password=PASSWORD))
            assert worker.get(private) == rec
        finally:
            await inproc.close()
            await worker.close()
    run(main())


def test_cancel_and_close_stop_the_worker(tmp_path, hanging):
    async def main():
        svc = _svc(tmp_path, hanging)
        try:
            task = asyncio.ensure_future(svc.pull(HANG))
            (pid,) = await wait_for_async(lambda: _workers(os.getpid()), 30, "a pull worker")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # the shared pull unwinds in its own task, as in-process: it stops the worker and waits for it
            await wait_for_async(lambda: _gone(pid) and not svc._worker_pulls, 30, f"the pull worker {pid} to end")
            assert svc.list() == [] and not svc._pulls
            # husk-cri stopping: close() stops the workers of the pulls in flight
            task = asyncio.ensure_future(svc.pull(HANG))
            (pid,) = await wait_for_async(lambda: _workers(os.getpid()), 30, "a pull worker")
        finally:
            await svc.close()
        assert task.cancelled() and _gone(pid)
        assert os.listdir(svc.snapshots.tmp_dir) == []
    run(main())


def test_the_worker_dies_with_its_parent(tmp_path, hanging):
    script = textwrap.dedent(f"""
        import asyncio, sys
        from cri_server.images.service import ImageService
        async def main():
            svc = ImageService({str(tmp_path / "root")!r}, {hanging!r}, pull_worker=True)
            await svc.pull({HANG!r})
        asyncio.run(main())
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=os.getcwd())
    try:
        (pid,) = wait_for(lambda: _workers(parent.pid), 30, "the parent's pull worker")
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        wait_for(lambda: _gone(pid), 30, f"the pull worker {pid} to exit after its parent died")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()



@pytest.fixture
def results(monkeypatch) -> list[pullworker.WorkerResult]:  # type: ignore[no-untyped-def]
    """The WorkerResult of each pull through ImageService, in order."""
    got: list[pullworker.WorkerResult] = []
    real_run = pullworker.run

    async def recording_run(*a, **kw):  # type: ignore[no-untyped-def]
        res = await real_run(*a, **kw)
        got.append(res)
        return res
    monkeypatch.setattr(pullworker, "run", recording_run)
    return got


def test_the_idle_worker_serves_the_next_pull_then_ends(tmp_path, certs_dir, registry, monkeypatch, results):
    monkeypatch.setattr(pullworker, "IDLE_S", 120.0)

    async def main():
        svc = _svc(tmp_path, certs_dir)
        try:
            rec = await svc.pull("busybox")
            (pid,) = _workers(os.getpid())      # idle, kept
            assert (await svc.pull("busybox")).id == rec.id
            assert [(r.pid, r.served, r.loaded) for r in results] == [(pid, 1, True), (pid, 2, False)]
            assert results[1].fetched == 0
            # the idle time is read when a worker becomes idle: after this pull it ends on its own
            monkeypatch.setattr(pullworker, "IDLE_S", 0.1)
            await svc.pull(LAYERED)
            assert results[-1].pid == pid
            await wait_for_async(lambda: _gone(pid) and not _workers(os.getpid()), 30,
                                 f"the idle pull worker {pid} to end")
            monkeypatch.setattr(pullworker, "IDLE_S", 120.0)
            await svc.pull("busybox")
            assert results[-1].pid != pid and results[-1].served == 1 and results[-1].loaded
            (pid,) = _workers(os.getpid())
        finally:
            await svc.close()
        assert _gone(pid)                       # close() ended the idle worker
    run(main())


def test_cancelled_and_dead_workers_are_not_reused(tmp_path, certs_dir, registry, hanging, monkeypatch,
                                                   results):
    monkeypatch.setattr(pullworker, "IDLE_S", 120.0)

    async def main():
        svc = _svc(tmp_path, certs_dir)
        try:
            await svc.pull("busybox")
            (pid,) = _workers(os.getpid())
            task = asyncio.ensure_future(svc.pull(HANG))    # takes the idle worker, which hangs
            await wait_for_async(lambda: not svc._worker_pool.idle_pids(), 30, "the idle worker to be taken")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await wait_for_async(lambda: _gone(pid) and not svc._worker_pulls, 30, f"the pull worker {pid} to end")
            await svc.pull("busybox")
            assert results[-1].pid != pid and results[-1].served == 1
            # an idle worker killed (OOM killer, crash): the next pull gets a new one
            (pid,) = _workers(os.getpid())
            os.kill(pid, signal.SIGKILL)
            await wait_for_async(lambda: _gone(pid), 30, f"the pull worker {pid} to die")
            await svc.pull("busybox")
            assert results[-1].pid != pid and results[-1].served == 1
            assert svc._worker_pool.idle_pids() == [results[-1].pid]
        finally:
            await svc.close()
        assert not _workers(os.getpid())
    run(main())

_MODULES = """
import asyncio, json, sys
from cri_server.images.service import ImageService
async def main():
    svc = ImageService(sys.argv[1], sys.argv[2], pull_worker=sys.argv[3] == "worker")
    try:
        await svc.pull("busybox")
    finally:
        await svc.close()
asyncio.run(main())
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("aiohttp", "yarl", "multidict")
                        or m == "cri_server.images.registry")))
"""


@pytest.mark.parametrize("mode", ["worker", "in-process"])
def test_the_pulling_process_never_imports_aiohttp(tmp_path, certs_dir, registry, mode):
    """In-process is the control: the same pull imports aiohttp there."""
    out = subprocess.run([sys.executable, "-c", _MODULES, str(tmp_path / "root"), certs_dir, mode],
                         capture_output=True, text=True, timeout=120, cwd=os.getcwd())
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    if mode == "worker":
        assert loaded == []
    else:
        assert "aiohttp" in loaded
