"""The pull worker's protocol (images/pullworker.py) without a registry: errors cross the process boundary as the
same ImageError class, message, gRPC code and attributes; anything else is INTERNAL; a worker that dies without
an answer is an error naming its status; a worker whose stdin closes (husk-cri gone) stops its pull and exits.
A worker serves requests one after the other and exits 0 at EOF while idle; the daemon's WorkerPool (driven here
by a fake worker) reuses an idle worker, ends it after IDLE_S or at close(), replaces one that died idle, never
reuses a cancelled one and does not retry a request a worker took before dying."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from cri_server.images import manifest as mf
from cri_server.images import pullworker
from cri_server.images.errors import ImageError, InvalidReference, NoSpace, PlatformNotFound, Unauthorized
from cri_server.images.pullworker import PullWorkerError, error_dict, error_from
from tests.support.registry import write_hosts_toml
from tests.support.waiting import wait_for, wait_for_async


def _roundtrip(e: BaseException) -> ImageError:
    return error_from(json.loads(json.dumps(error_dict(e))))


@pytest.mark.parametrize("err", [
    PlatformNotFound("docker.io/library/x:1", "linux/amd64", ["linux/arm64", "linux/s390x"]),
    NoSpace("pulling x", "/nonexistent/images/content", needed=10, written=4),
    InvalidReference("Bad//Ref", "empty path component"),
    Unauthorized("registry.test: credentials refused"),
])
def test_image_errors_keep_class_message_code_and_attributes(err: ImageError) -> None:
    got = _roundtrip(err)
    assert type(got) is type(err) and str(got) == str(err) and got.code == err.code
    assert {k: v for k, v in vars(got).items()} == {k: v for k, v in vars(err).items()}


def test_other_errors_are_internal() -> None:
    got = _roundtrip(PermissionError(13, "Permission denied", "/var/lib/husk/images/meta.db"))
    assert type(got) is PullWorkerError and got.code == "INTERNAL"
    assert str(got).startswith("PermissionError: ") and "meta.db" in str(got)
    # a class of the same name elsewhere is not trusted
    fake = {"module": "evil", "class": "NotFound", "message": "x", "attrs": {}}
    assert type(error_from(fake)) is PullWorkerError


def test_a_worker_without_an_answer_is_an_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(pullworker, "_interpreter",
                        lambda: (sys.executable, [sys.executable, "-c", "import sys; sys.exit(3)"]))
    with pytest.raises(PullWorkerError, match="exited with status 3 without a result"):
        asyncio.run(pullworker.run("busybox", None, mf.Platform("linux", "amd64"), None, str(tmp_path), None, {}))


def test_the_worker_stops_when_its_stdin_closes(tmp_path) -> None:
    srv = socket.socket()      # a registry that accepts and never answers: the pull hangs until told to stop
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    certs = str(tmp_path / "certs.d")
    write_hosts_toml(certs, "hang.test", f"http://127.0.0.1:{srv.getsockname()[1]}")
    exe, argv = pullworker._interpreter()
    proc = subprocess.Popen(argv, executable=exe, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        req = {"ref": "hang.test/x:1", "platform": {"os": "linux", "architecture": "amd64"}, "auth": None,
               "plain_http": None, "root": str(tmp_path / "root"), "registry_config_dir": certs,
               "options": {"retry_backoff": 0.01}, "log_level": 20, "ppid": os.getpid()}
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(req).encode() + b"\n")
        proc.stdin.flush()
        conn, _ = srv.accept()          # the worker is pulling
        proc.stdin.close()
        proc.wait(timeout=60)
        conn.close()
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
        result = json.loads(out.decode().strip().splitlines()[-1])
        assert result["error"]["class"] == "CancelledError", err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        srv.close()


def _request(tmp_path, ref: str) -> bytes:  # type: ignore[no-untyped-def]
    req = {"ref": ref, "platform": {"os": "linux", "architecture": "amd64"}, "auth": None, "plain_http": None,
           "root": str(tmp_path / "root"), "registry_config_dir": None, "options": {}, "log_level": 20,
           "ppid": os.getpid()}
    return json.dumps(req).encode() + b"\n"


def test_the_worker_serves_requests_one_after_the_other(tmp_path) -> None:
    """Two requests on one stdin (invalid references: answered without a registry), two answers from one
    process; EOF while idle: exit 0."""
    exe, argv = pullworker._interpreter()
    proc = subprocess.Popen(argv, executable=exe, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(_request(tmp_path, "Bad//Ref") + _request(tmp_path, "Also//Bad"), timeout=60)
        answers = [json.loads(x) for x in out.decode().splitlines() if x.strip()]
        assert [a["error"]["class"] for a in answers] == ["InvalidReference"] * 2, err.decode()
        assert "Also//Bad" in answers[1]["error"]["message"]
        assert proc.returncode == 0, err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# A fake worker: answers each request line with its count; "die-busy" exits without answering (died after taking the request), "hang" waits
# for SIGTERM and answers it as the real worker does (a cancelled pull, then exit).
_FAKE = textwrap.dedent("""
    import json, os, signal, sys
    def term(*_):
        print(json.dumps({"error": {"module": "asyncio", "class": "CancelledError", "message": "cancelled",
                                    "attrs": {}}}), flush=True)
        sys.exit(2)
    signal.signal(signal.SIGTERM, term)
    n = 0
    for line in sys.stdin:
        n += 1
        ref = json.loads(line)["ref"]
        print("INFO fake: serving " + ref, file=sys.stderr, flush=True)
        if ref == "die-busy":
            sys.exit(5)
        if ref == "hang":
            signal.pause()
        if ref == "stubborn":       # stuck in its cleanup: SIGTERM does nothing
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print("INFO fake: stubborn", file=sys.stderr, flush=True)
            signal.pause()
        print(json.dumps({"id": ref, "served": n, "loaded": n == 1}), flush=True)
""")


@pytest.fixture
def fake(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """The fake worker as the pool's interpreter; the list collects the pids of the workers started."""
    started: list[int] = []
    real = asyncio.create_subprocess_exec

    async def spawn(*a, **kw):  # type: ignore[no-untyped-def]
        proc = await real(*a, **kw)
        started.append(proc.pid)
        return proc
    monkeypatch.setattr(pullworker, "_interpreter", lambda: (sys.executable, [sys.executable, "-c", _FAKE]))
    monkeypatch.setattr(pullworker.asyncio, "create_subprocess_exec", spawn)
    return started


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except (FileNotFoundError, ProcessLookupError):   # ESRCH: reaped while read
        return True


async def _pull(pool: pullworker.WorkerPool, ref: str) -> pullworker.WorkerResult:
    return await pool.pull(ref, None, mf.Platform("linux", "amd64"), None, "/nonexistent", None, {})


def test_pool_reuses_an_idle_worker_and_ends_it_after_the_idle_time(fake, monkeypatch) -> None:
    async def main() -> None:
        pool = pullworker.WorkerPool()
        try:
            monkeypatch.setattr(pullworker, "IDLE_S", 60.0)
            a = await _pull(pool, "a")
            b = await _pull(pool, "b")
            assert (a.pid, a.served, a.loaded) == (fake[0], 1, True)
            assert (b.pid, b.served, b.loaded) == (a.pid, 2, False) and len(fake) == 1
            # concurrent pulls: one worker each, both kept
            c, d = await asyncio.gather(_pull(pool, "c"), _pull(pool, "d"))
            assert c.pid != d.pid and {c.pid, d.pid} >= {a.pid} and sorted(pool.idle_pids()) == sorted(fake)
            monkeypatch.setattr(pullworker, "IDLE_S", 0.05)    # read when a worker becomes idle
            e = await _pull(pool, "e")
            await wait_for_async(lambda: _gone(e.pid) and e.pid not in pool.idle_pids(), 30,
                                 f"the idle worker {e.pid} to end")
            assert len(pool.idle_pids()) == 1
        finally:
            await pool.close()
        assert pool.idle_pids() == [] and all(_gone(p) for p in fake)
    asyncio.run(main())


def test_pool_beyond_max_workers_uses_one_shot_workers(fake, monkeypatch) -> None:
    monkeypatch.setattr(pullworker, "IDLE_S", 60.0)

    async def main() -> None:
        pool = pullworker.WorkerPool(max_workers=1)
        try:
            a, b = await asyncio.gather(_pull(pool, "a"), _pull(pool, "b"))
            assert a.pid != b.pid and len(pool.idle_pids()) == 1
            (kept,) = pool.idle_pids()
            gone = ({a.pid, b.pid} - {kept}).pop()
            await wait_for_async(lambda: _gone(gone), 30, f"the one-shot worker {gone} to end")
            assert (await _pull(pool, "c")).pid == kept
        finally:
            await pool.close()
        assert all(_gone(p) for p in fake)
    asyncio.run(main())


def test_pool_runs_at_most_max_pulls_at_once(fake, monkeypatch) -> None:
    monkeypatch.setattr(pullworker, "IDLE_S", 60.0)

    async def main() -> None:
        pool = pullworker.WorkerPool(max_workers=1, max_pulls=2)
        try:
            hung = [asyncio.ensure_future(_pull(pool, "hang")) for _ in range(2)]
            await wait_for_async(lambda: len(fake) == 2, 30, "two workers to start")
            third = asyncio.ensure_future(_pull(pool, "c"))
            for _ in range(20):         # let the loop run the third pull as far as it can go
                await asyncio.sleep(0)
            assert len(fake) == 2 and not third.done()      # waiting for a slot, no third worker
            hung[0].cancel()
            c = await asyncio.wait_for(third, 30)
            assert c.image_id == "c" and len(fake) == 3
            hung[1].cancel()
            await asyncio.gather(*hung, return_exceptions=True)
        finally:
            await pool.close()
        assert all(_gone(p) for p in fake)
    asyncio.run(main())


@pytest.mark.parametrize("seen", [True, False], ids=["death-seen", "request-refused"])
def test_pool_replaces_a_worker_that_died_idle(fake, monkeypatch, seen: bool) -> None:
    """Its death noticed by the event loop before the request, or (the loop blocked meanwhile) only when
    writing the request fails (EPIPE): either way the request was not taken and goes to a new worker."""
    monkeypatch.setattr(pullworker, "IDLE_S", 60.0)

    async def main() -> None:
        pool = pullworker.WorkerPool()
        try:
            a = await _pull(pool, "idle")
            os.kill(a.pid, signal.SIGKILL)
            if seen:
                await wait_for_async(lambda: _gone(a.pid), 30, f"the worker {a.pid} to die")
            else:
                wait_for(lambda: _gone(a.pid), 30, f"the worker {a.pid} to die")
            b = await _pull(pool, "b")      # the request goes to a new worker, once
            assert b.pid != a.pid and b.served == 1 and pool.idle_pids() == [b.pid]
        finally:
            await pool.close()
    asyncio.run(main())


def test_pool_reports_a_worker_that_died_with_the_request(fake, monkeypatch) -> None:
    monkeypatch.setattr(pullworker, "IDLE_S", 60.0)

    async def main() -> None:
        pool = pullworker.WorkerPool()
        try:
            a = await _pull(pool, "a")
            with pytest.raises(PullWorkerError, match=f"pid {a.pid}\\) exited with status 5 without a result"):
                await _pull(pool, "die-busy")   # sent to the idle worker, which took it: not retried
            assert len(fake) == 1 and pool.idle_pids() == []
            assert (await _pull(pool, "b")).pid != a.pid
        finally:
            await pool.close()
    asyncio.run(main())


def test_pool_does_not_reuse_a_cancelled_worker(fake, monkeypatch) -> None:
    monkeypatch.setattr(pullworker, "IDLE_S", 60.0)

    async def main() -> None:
        pool = pullworker.WorkerPool()
        try:
            a = await _pull(pool, "a")
            task = asyncio.ensure_future(_pull(pool, "hang"))   # takes the idle worker
            await wait_for_async(lambda: pool.idle_pids() == [], 30, "the idle worker to be taken")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert _gone(a.pid) and pool.idle_pids() == []
            b = await _pull(pool, "b")
            assert b.pid != a.pid and b.served == 1
        finally:
            await pool.close()
    asyncio.run(main())


def test_a_worker_stuck_in_its_cleanup_is_killed_after_the_pools_stop_timeout(fake, monkeypatch, caplog) -> None:
    """husk-cri stopping lowers the time a cancelled worker gets (ImageService.close): one that ignores SIGTERM
    is then killed instead of holding the stop for STOP_TIMEOUT_S."""
    monkeypatch.setattr(pullworker, "STOP_TIMEOUT_S", 3600.0)

    async def main() -> None:
        pool = pullworker.WorkerPool()
        pool.stop_timeout = 0.1
        task = asyncio.ensure_future(_pull(pool, "stubborn"))
        caplog.set_level(logging.INFO, logger=pullworker.__name__)
        await wait_for_async(lambda: any("fake: stubborn" in r.getMessage() for r in caplog.records), 30,
                             "the worker to take the request and ignore SIGTERM")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await pool.close()
        assert _gone(fake[0])
    asyncio.run(main())
