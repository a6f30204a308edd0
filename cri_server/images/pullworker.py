"""Pulls in worker processes, so that husk-cri never imports the registry client.

The registry client (registry.py: aiohttp, yarl, multidict, ..., 124 modules, and SSL contexts with the CA store)
costs ~10 MB of Pss for good once imported: neither closing the session nor malloc_trim gives it back. The daemon's
ImageService (`pull_worker=True`) therefore runs each pull that does the work here: a `python -I -S` (husk-cri's
own interpreter, the protected one when it runs from it, as shim/spawner.py starts its zygote) that builds an
in-process ImageService on the same root per request and pulls (fetch, unpack, snapshots, meta.db), under the same
flock-based locks as the operator CLI. A WorkerPool keeps a worker IDLE_S after its pull (at most MAX_WORKERS), so a
burst of pulls (kubelet's PullImage before each container start with imagePullPolicy Always) starts it once.

Protocol (one request at a time):
  stdin   a JSON line per request: {"ref", "platform", "auth" (AuthConfig fields or null), "plain_http", "root",
          "registry_config_dir", "options" (ImageService keyword arguments), "log_level", "ppid"}; credentials
          travel only here, never in argv or the environment. EOF while idle: the worker exits 0 (how the pool
          ends an idle worker). EOF during a pull cancels it, as SIGTERM and SIGINT do, and as husk-cri's death
          does (PR_SET_PDEATHSIG); after a cancelled pull the worker exits.
  stdout  a JSON line per request: {"id", "fetched" (layer bytes downloaded), "seconds", "served" (requests so
          far), "loaded" (first request: the image service imported)} or {"error": {"module", "class",
          "message", "attrs"}}; the daemon raises the same ImageError class with the same message.
  stderr  log lines `LEVEL logger: message`, relayed into husk-cri's log with the current pull's id.
A cancelled pull unwinds as it does in-process (no record, no half-unpacked layer; partials kept for a resume).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from . import errors as errmod
from .errors import ImageError

if TYPE_CHECKING:
    from . import manifest as mf
    from .auth import AuthConfig

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0       # a cancelled worker's cleanup (tar killed, unpack dirs removed) before SIGKILL
SHUTDOWN_STOP_TIMEOUT_S = 5.0   # the same while husk-cri stops (partial downloads are kept for the next pull)
IDLE_S = 10.0               # an idle worker is kept this long after its pull (read when it becomes idle)
MAX_WORKERS = 4             # workers kept by a pool; pulls beyond run in one-shot workers
MAX_PULLS = 2 * MAX_WORKERS # pulls running at once through a pool (kept and one-shot workers); more wait
_LINE_LIMIT = 1 << 20
_ids = itertools.count(1)


class PullWorkerError(ImageError):
    """The worker failed outside the image code (crash, bug, killed): what in-process would be INTERNAL."""

    code = "INTERNAL"


@dataclass(frozen=True)
class WorkerResult:
    image_id: str
    fetched: int       # bytes of layers downloaded from registries
    seconds: float     # the pull inside the worker
    total: float       # from taking or starting the worker to its answer
    pull_id: str       # in husk-cri's log lines of this pull
    pid: int = 0       # the worker's
    served: int = 1    # pulls this worker has served, this one included
    loaded: bool = True  # the worker imported the image service for this pull (its first)


# -- husk-cri's side -----------------------------------------------------------------------------------------
def _project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_exe: str | None = None


def _interpreter() -> tuple[str, list[str]]:
    """(executable, argv) for the worker: husk-cri's interpreter, isolated and without site; the import path
    comes in argv like the spawner's."""
    global _exe
    from runtime import exeguard
    if _exe is None:
        _exe = "/proc/self/exe" if exeguard.is_protected() else sys.executable
    root = _project_root()
    path = os.pathsep.join([root] + [p for p in sys.path if p and p != root])
    return _exe, exeguard.python_argv() + ["-c", _BOOT, path]


def _platform_dict(p: mf.Platform) -> dict[str, str]:
    return {"os": p.os, "architecture": p.architecture, "variant": p.variant, "os_version": p.os_version}


def error_from(d: dict[str, Any]) -> ImageError:
    """The exception a worker reported, as the same ImageError class (so the same gRPC code), message and
    attributes; anything else (a bug, an OSError other than a full disk) as PullWorkerError (INTERNAL)."""
    cls = getattr(errmod, str(d.get("class", "")), None) if d.get("module") == errmod.__name__ else None
    msg = str(d.get("message", ""))
    if not (isinstance(cls, type) and issubclass(cls, ImageError)):
        return PullWorkerError(f"{d.get('class', 'error')}: {msg}" if d.get("class") else msg)
    err = cls.__new__(cls)
    Exception.__init__(err, msg)
    attrs = d.get("attrs")
    if isinstance(attrs, dict):
        err.__dict__.update(attrs)
    return err


def error_dict(e: BaseException) -> dict[str, Any]:
    attrs = {}
    for k, v in vars(e).items():
        if isinstance(v, (str, int, float, bool, type(None))) or (
                isinstance(v, list) and all(isinstance(x, str) for x in v)):
            attrs[k] = v
    return {"module": type(e).__module__, "class": type(e).__name__, "message": str(e), "attrs": attrs}


async def run(ref: str, auth: AuthConfig | None, platform: mf.Platform, plain_http: bool | None, root: str,
              registry_config_dir: str | None, options: dict[str, Any],
              pool: WorkerPool | None = None) -> WorkerResult:
    """Pull `ref` in a worker process on `root` (the root ImageService was given): an idle one of `pool`, or a
    new one (without a pool: a one-shot worker). Cancelling this cancels the worker's pull and waits for its
    cleanup; that worker is not reused."""
    if pool is not None:
        return await pool.pull(ref, auth, platform, plain_http, root, registry_config_dir, options)
    one_shot = WorkerPool(max_workers=0)
    try:
        return await one_shot.pull(ref, auth, platform, plain_http, root, registry_config_dir, options)
    finally:
        await one_shot.close()


class _Worker:
    """One worker process: its stderr relayed for its whole life, tagged with the pull it serves (`extra`)."""

    def __init__(self, proc: asyncio.subprocess.Process, pooled: bool) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.stdin, self.stdout = proc.stdin, proc.stdout
        self.pooled = pooled        # counted in its pool's max_workers (else ended after one pull)
        self.extra: dict[str, Any] = {"pid": proc.pid}
        self.relay = asyncio.ensure_future(_relay(proc.stderr, self.extra))
        self.idle_timer: asyncio.TimerHandle | None = None

    def alive(self) -> bool:
        return self.proc.returncode is None and not self.stdout.at_eof()

    async def send(self, data: bytes) -> bool:
        """False when the worker is gone before taking the request (it never saw it). Written to the pipe
        directly (the transport's buffer is empty between requests): the transport would report a dead reader
        (EPIPE) only a few loop iterations later, too late to tell "not sent" from "sent, then died"."""
        if not self.alive() or self.stdin.transport.is_closing():
            return False
        try:
            n = os.write(self.stdin.transport.get_extra_info("pipe").fileno(), data)
        except BlockingIOError:
            n = 0
        except (BrokenPipeError, ConnectionResetError):
            return False
        if n < len(data):           # a request over the pipe's capacity: the rest through the transport
            try:
                self.stdin.write(data[n:])
                await self.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass                # it took part of it: its exit status tells why
        return True


class WorkerPool:
    """Idle workers kept for IDLE_S after a pull, so that a burst of pulls (kubelet's imagePullPolicy Always:
    a PullImage before each container start) pays the worker's start (~0.3 s) once. One worker serves one pull
    at a time; at most `max_workers` are kept (pulls beyond run in one-shot workers). An idle worker is ended
    here (its stdin closed: it exits), never by itself, so a request never races its timeout."""

    def __init__(self, max_workers: int = MAX_WORKERS, max_pulls: int = MAX_PULLS) -> None:
        self.max_workers = max_workers
        self._slots = asyncio.Semaphore(max(max_pulls, max_workers))   # ~30 MB a worker: bounded
        self._idle: list[_Worker] = []
        self._counted = 0           # pooled workers alive, busy or idle
        self._ending: set[asyncio.Task[None]] = set()
        self._closed = False
        self.stop_timeout: float | None = None     # a cancelled worker's time to clean up (None: STOP_TIMEOUT_S)

    def idle_pids(self) -> list[int]:
        return [w.proc.pid for w in self._idle]

    async def pull(self, ref: str, auth: AuthConfig | None, platform: mf.Platform, plain_http: bool | None,
                   root: str, registry_config_dir: str | None, options: dict[str, Any]) -> WorkerResult:
        """One pull in a worker: at most `max_pulls` at once (a kubelet without serialized pulls may ask for
        many images together; each worker is a process of ~30 MB), the others wait for a slot."""
        async with self._slots:
            if self._closed:
                raise PullWorkerError(f"pulling {ref}: husk-cri is stopping")
            return await self._pull(ref, auth, platform, plain_http, root, registry_config_dir, options)

    async def _pull(self, ref: str, auth: AuthConfig | None, platform: mf.Platform, plain_http: bool | None,
                    root: str, registry_config_dir: str | None, options: dict[str, Any]) -> WorkerResult:
        pull_id = f"pull-{os.getpid()}-{next(_ids)}"
        t0 = time.monotonic()
        req = {"ref": ref, "platform": _platform_dict(platform),
               "auth": asdict(auth) if auth is not None else None, "plain_http": plain_http, "root": root,
               "registry_config_dir": registry_config_dir, "options": options,
               "log_level": logging.getLogger("cri_server.images").getEffectiveLevel(), "ppid": os.getpid()}
        data = json.dumps(req).encode() + b"\n"
        for attempt in (0, 1):
            w = self._take()
            reused = w is not None
            if w is None:
                w = await self._start()
            w.extra.update(image=ref, pull=pull_id)
            log.debug("pull worker %s", "reused" if reused else "started", extra=w.extra)
            try:
                sent = await w.send(data)
            except BaseException:
                await self._abort(w)
                raise
            if sent or attempt:     # not sent twice: its exit status tells why below
                break
            log.info("pull worker died before the request: starting another", extra=w.extra)
            self._end(w)
        try:
            try:
                line = await w.stdout.readline()
            except ValueError:      # a line over the limit
                line = b"?"
        except BaseException:       # cancelled (deadline, RPC cancelled, close()) or unexpected: never reused
            await self._abort(w)
            raise
        doc: Any = None
        if line:
            try:
                doc = json.loads(line)
            except ValueError:
                doc = None
        if not isinstance(doc, dict) or ("error" not in doc and "id" not in doc):
            if line:                # an unreadable answer: this worker is not trusted again
                w.proc.kill()
            self._forget(w)
            await w.proc.wait()
            await asyncio.gather(w.relay, return_exceptions=True)
            raise PullWorkerError(f"pulling {ref}: the pull worker (pid {w.proc.pid}) exited with status "
                                  f"{w.proc.returncode} without a result (see husk-cri's log, pull={pull_id})")
        if "error" in doc:
            err = doc["error"] if isinstance(doc["error"], dict) else {}
            if err.get("class") == "CancelledError":    # it exits after a cancelled pull
                self._end(w)
            else:
                self._put(w)
            raise error_from(err)
        self._put(w)
        return WorkerResult(str(doc["id"]), int(doc.get("fetched", 0)), float(doc.get("seconds", 0.0)),
                            time.monotonic() - t0, pull_id, w.proc.pid, int(doc.get("served", 1)),
                            bool(doc.get("loaded", True)))

    async def close(self) -> None:
        """End the idle workers and wait for every worker this pool is ending (busy ones are ended by the
        cancellation of their pulls)."""
        self._closed = True
        for w in list(self._idle):
            self._end(w)
        while self._ending:
            await asyncio.gather(*self._ending, return_exceptions=True)

    async def _start(self) -> _Worker:
        pooled = not self._closed and self._counted < self.max_workers
        if pooled:                  # counted before the await: concurrent starts see it
            self._counted += 1
        exe, argv = _interpreter()
        try:
            proc = await asyncio.create_subprocess_exec(*argv, executable=exe, stdin=asyncio.subprocess.PIPE,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE, limit=_LINE_LIMIT)
        except BaseException:
            if pooled:
                self._counted -= 1
            raise
        return _Worker(proc, pooled)

    def _take(self) -> _Worker | None:
        while self._idle:
            w = self._idle.pop()    # the most recently used
            if w.idle_timer is not None:
                w.idle_timer.cancel()
                w.idle_timer = None
            if w.alive():
                return w
            log.info("idle pull worker died (status %s): dropped", w.proc.returncode, extra=w.extra)
            self._end(w)
        return None

    def _put(self, w: _Worker) -> None:
        if self._closed or not w.pooled or not w.alive():
            self._end(w)
            return
        w.idle_timer = asyncio.get_running_loop().call_later(IDLE_S, self._end, w)
        self._idle.append(w)

    def _forget(self, w: _Worker) -> None:
        if w in self._idle:
            self._idle.remove(w)
        if w.idle_timer is not None:
            w.idle_timer.cancel()
            w.idle_timer = None
        if w.pooled:
            w.pooled = False
            self._counted -= 1

    def _end(self, w: _Worker) -> None:
        """Close its stdin (an idle worker exits at once) and reap it in the background."""
        self._forget(w)
        t = asyncio.ensure_future(self._retire(w))
        self._ending.add(t)
        t.add_done_callback(self._ending.discard)

    async def _retire(self, w: _Worker) -> None:
        w.stdin.close()
        await _stop(w.proc, w.extra, terminate=False, timeout=self.stop_timeout)
        await asyncio.gather(w.relay, return_exceptions=True)

    async def _abort(self, w: _Worker) -> None:
        self._forget(w)
        await _stop(w.proc, w.extra, timeout=self.stop_timeout)
        w.stdin.close()
        await asyncio.gather(w.relay, return_exceptions=True)


async def _relay(stream: asyncio.StreamReader, extra: dict[str, Any]) -> None:
    while True:
        try:
            line = await stream.readline()
        except ValueError:      # a line over the limit: its part was dropped
            continue
        if not line:
            return
        text = line.decode(errors="replace").rstrip()
        if not text:
            continue
        level, _, rest = text.partition(" ")
        levelno = logging.getLevelName(level)
        if isinstance(levelno, int) and rest:
            log.log(levelno, "pull worker: %s", rest, extra=extra)
        else:                   # a traceback or anything not from logging
            log.warning("pull worker: %s", text, extra=extra)


async def _stop(proc: asyncio.subprocess.Process, extra: dict[str, Any], terminate: bool = True,
                timeout: float | None = None) -> None:
    """SIGTERM (the worker cancels its pull and cleans up; without `terminate`, its stdin was closed: it exits),
    SIGKILL after `timeout` (default STOP_TIMEOUT_S); waits for the exit even when cancelled again meanwhile (the caller re-raises
    its cancellation)."""
    if terminate and proc.returncode is None:
        proc.terminate()
    waiter = asyncio.ensure_future(proc.wait())
    loop = asyncio.get_running_loop()
    limit = STOP_TIMEOUT_S if timeout is None else timeout
    deadline = loop.time() + limit
    while not waiter.done():
        try:
            await asyncio.wait_for(asyncio.shield(waiter), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            log.warning("pull worker did not stop in %gs: killing it", limit, extra=extra)
            proc.kill()
            deadline = float("inf")
        except asyncio.CancelledError:
            continue
    if terminate:
        log.info("pull worker cancelled", extra=extra)
    else:
        log.debug("pull worker ended (status %s)", proc.returncode, extra=extra)


# -- the worker's side ---------------------------------------------------------------------------------------
# -I -S leave no sys.path to speak of: it comes in argv (not secret), as the spawner's.
_BOOT = ("import sys;sys.path[:0]=sys.argv[1].split(__import__('os').pathsep);"
         "from cri_server.images.pullworker import worker_main;sys.exit(worker_main())")


_stdin = bytearray()            # read from fd 0, not yet a whole request line
_stdin_eof = False


def _read_stdin() -> bool:
    """Read what fd 0 has (blocking if nothing) into _stdin; False at EOF (husk-cri closed it or died)."""
    global _stdin_eof
    try:
        data = os.read(0, 65536)
    except OSError:
        data = b""
    if not data:
        _stdin_eof = True
        return False
    _stdin.extend(data)
    return True


def _next_request() -> bytes | None:
    while b"\n" not in _stdin:
        if _stdin_eof or not _read_stdin():
            return None
    i = _stdin.index(b"\n")
    line = bytes(_stdin[:i])
    del _stdin[:i + 1]
    return line


def worker_main() -> int:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)               # stray writes to stdout (prints, tar) go to the log, not into the result
    served = 0
    while True:                 # one request after another; EOF on stdin while idle: exit
        line = _next_request()
        if line is None:
            return 0 if served else 1   # 1: husk-cri went away before sending a request
        req = json.loads(line)
        if not served:
            from runtime.linux.syscalls import set_pdeathsig
            set_pdeathsig(signal.SIGTERM)
            if os.getppid() != req.get("ppid"):
                return 1        # husk-cri died before PR_SET_PDEATHSIG took effect
            logging.basicConfig(level=int(req.get("log_level", logging.INFO)), stream=sys.stderr,
                                format="%(levelname)s %(name)s: %(message)s")
        served += 1
        loaded = "cri_server.images.service" not in sys.modules
        cancelled = False
        try:
            result = asyncio.run(_worker(req))
            result.update(served=served, loaded=loaded)
        except asyncio.CancelledError:
            cancelled = True
            result = {"error": {"module": "asyncio", "class": "CancelledError", "message": "cancelled",
                                "attrs": {}}}
        except BaseException as e:  # noqa: BLE001 - reported to husk-cri, which raises it again
            if not isinstance(e, ImageError):
                logging.getLogger(__name__).exception("pull of %s failed", req.get("ref"))
            result = {"error": error_dict(e)}
        try:
            out.write(json.dumps(result) + "\n")
            out.flush()
        except OSError:         # husk-cri is gone (EPIPE): nobody to tell
            return 1
        if cancelled:           # SIGTERM or stdin closed: husk-cri does not reuse a cancelled worker
            return 2


async def _worker(req: dict[str, Any]) -> dict[str, Any]:
    from . import manifest as mf
    from . import pull as pullmod
    from .auth import AuthConfig
    from .service import ImageService
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)

    def on_stdin() -> None:     # husk-cri closed its end (or died): stop
        if not _read_stdin():
            loop.remove_reader(0)
            task.cancel()
    if _stdin_eof:
        task.cancel()
    else:
        loop.add_reader(0, on_stdin)
    fetched = 0

    def count(n: int) -> None:
        nonlocal fetched
        fetched += n
    pullmod.on_fetched = count
    auth = AuthConfig(**req["auth"]) if req.get("auth") else None
    svc = ImageService(req["root"], req.get("registry_config_dir"), platform=mf.Platform(**req["platform"]),
                       **req.get("options", {}))
    t0 = time.monotonic()
    try:
        rec = await svc.pull(req["ref"], auth, plain_http=req.get("plain_http"))
    finally:
        await svc.close()
    return {"id": rec.id, "fetched": fetched, "seconds": time.monotonic() - t0}
