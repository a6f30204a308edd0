"""Pulls in a short-lived worker process, so that husk-cri never imports the registry client.

The registry client (registry.py: aiohttp, yarl, multidict, ..., 124 modules, and SSL contexts with the CA store)
costs ~10 MB of Pss for good once imported: neither closing the session nor malloc_trim gives it back. The daemon's
ImageService (`pull_worker=True`) therefore runs each pull that does the work here: a fresh `python -I -S`
(husk-cri's own interpreter, the protected one when it runs from it, as shim/spawner.py starts its zygote) that
builds an in-process ImageService on the same root and pulls (fetch, unpack, snapshots, meta.db), under the same
flock-based locks as the operator CLI, then exits.

Protocol:
  stdin   one JSON line: {"ref", "platform", "auth" (AuthConfig fields or null), "plain_http", "root",
          "registry_config_dir", "options" (ImageService keyword arguments), "log_level", "ppid"}; credentials
          travel only here, never in argv or the environment. The daemon keeps stdin open: its closing (husk-cri
          gone) cancels the pull, as SIGTERM and SIGINT do, and as husk-cri's death does (PR_SET_PDEATHSIG).
  stdout  one JSON line: {"id", "fetched" (layer bytes downloaded), "seconds"} or {"error": {"module",
          "class", "message", "attrs"}}; the daemon raises the same ImageError class with the same message.
  stderr  log lines `LEVEL logger: message`, relayed into husk-cri's log with the pull's id.
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
    total: float       # from starting the worker to its answer
    pull_id: str       # in husk-cri's log lines of this pull


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
              registry_config_dir: str | None, options: dict[str, Any]) -> WorkerResult:
    """Pull `ref` in a worker process on `root` (the root ImageService was given). Cancelling this cancels the
    worker's pull and waits for its cleanup."""
    pull_id = f"pull-{os.getpid()}-{next(_ids)}"
    t0 = time.monotonic()
    req = {"ref": ref, "platform": _platform_dict(platform), "auth": asdict(auth) if auth is not None else None,
           "plain_http": plain_http, "root": root, "registry_config_dir": registry_config_dir,
           "options": options, "log_level": logging.getLogger("cri_server.images").getEffectiveLevel(),
           "ppid": os.getpid()}
    exe, argv = _interpreter()
    proc = await asyncio.create_subprocess_exec(*argv, executable=exe, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                limit=_LINE_LIMIT)
    extra = {"image": ref, "pull": pull_id, "pid": proc.pid}
    log.debug("pull worker started", extra=extra)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    relay = asyncio.ensure_future(_relay(proc.stderr, extra))
    try:
        try:
            proc.stdin.write(json.dumps(req).encode() + b"\n")
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass    # it died at once: its exit status and stderr tell why
        out = await proc.stdout.read()
        await proc.wait()
        await relay
    except asyncio.CancelledError:
        await _stop(proc, extra)
        await asyncio.gather(relay, return_exceptions=True)
        raise
    finally:
        if proc.returncode is None:   # an unexpected error here: never leave the worker behind
            proc.kill()
        proc.stdin.close()
    lines = [x for x in out.splitlines() if x.strip()]
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise PullWorkerError(f"pulling {ref}: the pull worker (pid {proc.pid}) exited with status "
                              f"{proc.returncode} without a result (see husk-cri's log, pull={pull_id})")
    if "error" in doc:
        raise error_from(doc["error"])
    return WorkerResult(str(doc["id"]), int(doc.get("fetched", 0)), float(doc.get("seconds", 0.0)),
                        time.monotonic() - t0, pull_id)


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


async def _stop(proc: asyncio.subprocess.Process, extra: dict[str, Any]) -> None:
    """SIGTERM (the worker cancels its pull and cleans up), SIGKILL after STOP_TIMEOUT_S; waits for the exit
    even when cancelled again meanwhile (the caller re-raises its cancellation)."""
    if proc.returncode is None:
        proc.terminate()
    waiter = asyncio.ensure_future(proc.wait())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STOP_TIMEOUT_S
    while not waiter.done():
        try:
            await asyncio.wait_for(asyncio.shield(waiter), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            log.warning("pull worker did not stop in %gs: killing it", STOP_TIMEOUT_S, extra=extra)
            proc.kill()
            deadline = float("inf")
        except asyncio.CancelledError:
            continue
    log.info("pull worker cancelled", extra=extra)


# -- the worker's side ---------------------------------------------------------------------------------------
# -I -S leave no sys.path to speak of: it comes in argv (not secret), as the spawner's.
_BOOT = ("import sys;sys.path[:0]=sys.argv[1].split(__import__('os').pathsep);"
         "from cri_server.images.pullworker import worker_main;sys.exit(worker_main())")


def worker_main() -> int:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)               # stray writes to stdout (prints, tar) go to the log, not into the result
    line = sys.stdin.buffer.readline()
    if not line:
        return 1                # husk-cri went away before sending the request
    req = json.loads(line)
    from runtime.linux.syscalls import set_pdeathsig
    set_pdeathsig(signal.SIGTERM)
    if os.getppid() != req.get("ppid"):
        return 1                # husk-cri died before PR_SET_PDEATHSIG took effect
    logging.basicConfig(level=int(req.get("log_level", logging.INFO)), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        result = asyncio.run(_worker(req))
    except asyncio.CancelledError:
        result = {"error": {"module": "asyncio", "class": "CancelledError", "message": "cancelled", "attrs": {}}}
    except BaseException as e:  # noqa: BLE001 - reported to husk-cri, which raises it again
        if not isinstance(e, ImageError):
            logging.getLogger(__name__).exception("pull of %s failed", req.get("ref"))
        result = {"error": error_dict(e)}
    try:
        out.write(json.dumps(result) + "\n")
        out.flush()
    except OSError:             # husk-cri is gone (EPIPE): nobody to tell
        return 1
    return 0 if "error" not in result else 2


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
        try:
            data = os.read(0, 4096)
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(0)
            task.cancel()
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
