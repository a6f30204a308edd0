"""The spawner (zygote): a single-threaded process started by husk-cri before any gRPC thread exists, with
runtime/ and shim/ imported, one shim run dry in it (`_warm_up`, twice: the code it runs is packed on few pages
in between, `_warm_up_packed`), pymalloc's free blocks taken (`_fill_pool_holes`) and everything gc-frozen;
it forks every shim (double fork + setsid: shims outlive husk-cri).

It is a fresh interpreter (fork + exec of `python -I -S`, from the protected interpreter when husk-cri runs
from it), not a plain fork of husk-cri: a fork would carry husk-cri's whole heap (click, its config, logging...)
into every shim, where the objects a shim touches lie scattered among them. Measured with 20 pods (shim/README.md,
"memory"): 15.3 MB RSS and 3.5 MB PSS per shim instead of 20.2 MB and 3.9 MB.

Protocol on a SOCK_SEQPACKET socketpair, one `marshal`-encoded dict per packet (marshal runs no Python code:
JSON's decoder and encoder wrote ~20 pages of the zygote per spawn, each a private page of the shim before):
  request  {"cfg": {ShimConfig fields}, "log_path": str, "debug": bool}
  response {"pid": int, "address": "unix://..."} or {"error": str}
The zygote exits when husk-cri closes its end. It must never start threads (it forks).
"""
from __future__ import annotations

import gc
import marshal
import os
import signal
import socket
import sys

from shim.log import get as get_logger
from shim.record import REQUIRED, Record
from shim.service import ShimConfig

log = get_logger(__name__)
MAX_MSG = 1 << 16
SPAWNER_NAME = "husk-cri-spawner"


class SpawnError(Exception):
    """The zygote could not start a shim; the text says why."""


class Spawned(Record):
    """The shim's pid and its ttrpc address (unix://...)."""
    __slots__ = ("pid", "address")
    FIELDS = (("pid", REQUIRED), ("address", REQUIRED))


class Spawner:
    def __init__(self) -> None:
        import threading    # husk-cri's side only: in the zygote, threading's at-fork hook would run in every shim
        self._sock: socket.socket | None = None
        self.pid = 0
        self._lock = threading.Lock()

    def start(self, preload: tuple[str, ...] = ()) -> None:
        """Starts the zygote (fork + exec; spawn() waits while it imports). Call before any thread exists in
        this process. `preload`: modules the zygote imports besides RUNTIME_MODULES (SYSTEMD_MODULES when the
        shims' runtime uses the systemd cgroup driver), so that no container start imports them."""
        import threading
        if threading.active_count() > 1:
            raise SpawnError("Spawner.start() must run before any other thread is started")
        from runtime import exeguard
        from shim.daemon import project_root
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        root = project_root()
        path = os.pathsep.join([root] + [p for p in sys.path if p and p != root])
        argv = exeguard.python_argv() + ["-c", _BOOT, path, ",".join(preload)]
        # the protected interpreter (runtime/exeguard.py) is this process's own executable once husk-cri runs
        # from it: the zygote and every shim then inherit it; otherwise they re-execute per container as before
        exe = "/proc/self/exe" if exeguard.is_protected() else sys.executable
        pid = os.fork()
        if pid == 0:
            try:
                import fcntl
                os.dup2(fcntl.fcntl(child.fileno(), fcntl.F_DUPFD_CLOEXEC, 10), 3)   # the channel is fd 3
                os.closerange(4, 1 << 16)
                os.execve(exe, argv, os.environ)
            except BaseException:  # the zygote reports, then leaves without running the parent's handlers
                log.exception("spawner zygote: cannot execute %s", exe)
            finally:
                os._exit(127)
        child.close()
        self._sock = parent
        self.pid = pid

    def spawn(self, cfg: ShimConfig, log_path: str = "", debug: bool = False, timeout: float = 30.0) -> Spawned:
        if self._sock is None:
            raise SpawnError("spawner not started")
        d = cfg.as_dict()
        if d["allowed_uids"] is not None:
            d["allowed_uids"] = list(d["allowed_uids"])
        req = marshal.dumps({"cfg": d, "log_path": log_path, "debug": debug})
        with self._lock:
            self._sock.settimeout(timeout)
            try:
                self._sock.send(req)
                data = self._sock.recv(MAX_MSG)
            except OSError as err:
                raise SpawnError(f"spawner: {err}") from err
        if not data:
            raise SpawnError("spawner exited")
        resp = marshal.loads(data)
        if "error" in resp:
            raise SpawnError(resp["error"])
        return Spawned(int(resp["pid"]), resp["address"])

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.pid:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = 0


# The zygote's program: sys.path from argv (-I -S leave none to speak of), the channel is fd 3.
_BOOT = ("import os,socket,sys;sys.path[:0]=sys.argv[1].split(os.pathsep);"
         "from shim.spawner import _zygote_main;"
         "os._exit(_zygote_main(socket.socket(fileno=3),tuple(filter(None,sys.argv[2].split(',')))))")

# What the in-process runtime imports lazily while it creates a container: loaded once in the zygote so that
# the shims share them instead of importing them in every container start, and because the container's init
# imports some after pivot_root, where the host's Python library directory is out of reach ("No module named
# '_sha256'" for a seccomp profile).
RUNTIME_MODULES = ("runtime.lifecycle", "runtime.parent", "runtime.child", "runtime.init", "runtime.sync",
                   "runtime.state", "runtime.config", "runtime.jsonload", "runtime.capabilities",
                   "runtime.process", "runtime.rootfs", "runtime.hooks", "runtime.network", "runtime.console",
                   "runtime.cgroups.v1", "runtime.cgroups.v2", "runtime.seccomp", "runtime.seccomp_lib",
                   "runtime.seccomp_notify", "runtime.schema.validator", "runtime.execute", "runtime.execflags",
                   "runtime.exeguard", "runtime.update", "runtime.rootfs_cgroup", "runtime.sysctl",
                   "runtime.mountinfo", "resource", "_sha256", "_sha2", "hashlib")
# The systemd cgroup driver's, with its D-Bus client (runtime/linux/dbus.py, ~1-2 ms: shared pages rather than
# an import in every container start).
SYSTEMD_MODULES = ("runtime.cgroups.systemd", "runtime.cgroups.systemd_dbus", "runtime.linux.dbus")


def _preload(extra: tuple[str, ...] = ()) -> None:
    """Everything a shim needs, imported once in the zygote so every forked shim shares the pages."""
    import importlib
    import runtime.linux.syscalls  # noqa: F401
    import shim.cgroup_watch  # noqa: F401
    import shim.daemon  # noqa: F401
    import shim.events  # noqa: F401
    import shim.pb.cgroups_v1  # noqa: F401
    import shim.rootfs  # noqa: F401
    import shim.runtime_driver  # noqa: F401
    import shim.ttrpc_server  # noqa: F401
    for name in RUNTIME_MODULES + extra:
        try:
            importlib.import_module(name)
        except (ImportError, OSError):
            pass


def _zygote_main(chan: socket.socket, preload: tuple[str, ...] = ()) -> int:
    from runtime.linux.proctitle import set_title
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # comm "husk-cri-spawne" (15 bytes): neither `pgrep -x husk-cri` (the daemon) nor `pgrep husk-shim` match it
    set_title(SPAWNER_NAME)
    # Keep only stdio and the channel: the zygote must not hold husk-cri's sockets or files open.
    keep = chan.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    _preload(preload)
    global _FILLER
    _FILLER = _warm_up_packed()
    gc.freeze()
    while True:
        try:
            data = chan.recv(MAX_MSG)
        except InterruptedError:
            continue
        except ConnectionResetError:
            data = b""
        if not data:
            return 0  # husk-cri closed its end (stopped, or died): the zygote's work is over
        try:
            resp = _spawn_one(marshal.loads(data), chan)
        except Exception as err:  # every failure is an answer, never the zygote's end
            resp = {"error": f"{type(err).__name__}: {err}"}
        try:
            chan.send(marshal.dumps(resp))
        except (BrokenPipeError, ConnectionResetError):
            # husk-cri went away mid-spawn (killed, or stopped while a container was being created): one line,
            # no traceback. The shim started for it (if any) keeps running, as every shim outlives husk-cri.
            log.warning("spawner: husk-cri went away before the answer %s; exiting", _brief(resp))
            return 0


def _brief(resp: dict) -> str:
    if "pid" in resp:
        return f"(shim pid {resp['pid']} at {resp.get('address', '')})"
    return f"(error: {resp.get('error', '')})"


def _spawn_one(req: dict, chan: socket.socket) -> dict:
    from shim.daemon import serve, setup_logging
    from shim.ttrpc_server import listen_unix
    c = dict(req["cfg"])
    if c.get("allowed_uids") is not None:
        c["allowed_uids"] = tuple(c["allowed_uids"])
    cfg = ShimConfig(**c)
    os.makedirs(cfg.state_dir, mode=0o711, exist_ok=True)
    os.makedirs(os.path.dirname(cfg.address) or ".", mode=0o711, exist_ok=True)
    log_path = req.get("log_path") or os.path.join(cfg.state_dir, "shim.log")
    listener = listen_unix(cfg.address)   # bound here: errors are reported synchronously
    r, w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            chan.close()
            os.close(r)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            # Only stdio, the listener (3) and the ready pipe (4) survive: nothing of husk-cri's leaks.
            import fcntl
            lfd = listener.detach()     # the socket object must not close fd 3 when it is dropped
            srcs = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (
                os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC),
                os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640),
                lfd, w)]
            for target, src in zip((0, 1, 3, 4), srcs):
                os.dup2(src, target, inheritable=False)
            os.dup2(1, 2, inheritable=False)
            os.closerange(5, 1 << 16)
            listener = socket.socket(fileno=3)
            os.chdir(cfg.bundle or "/")
            setup_logging(cfg.id, bool(req.get("debug")))
            code = serve(cfg, listener=listener, ready_fd=4)
        except BaseException:
            get_logger("husk-shim").exception("shim failed")
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    listener.close()
    os.waitpid(pid, 0)
    data = b""
    while True:
        b = os.read(r, 64)
        if not b:
            break
        data += b
    os.close(r)
    text = data.strip()
    if not text.isdigit():
        try:
            os.unlink(cfg.address)
        except OSError:
            pass
        raise SpawnError(f"shim for {cfg.id} exited before serving (log: {log_path})")
    return {"pid": int(text), "address": f"unix://{cfg.address}"}


# --- before the first fork: a dry run, then the allocator's holes filled ------------------------------------
# Measured per shim with 10 pods under husk-cri (shim/README.md, "Memory"): the dry run -6.7 % Private_Dirty,
# filling the pools' free blocks another -7 %.

WARM_ID = "husk-spawner-warm-up"
WARM_TIMEOUT = 10.0
# The dry run's runtime: a runc stand-in. `create` starts a process that writes a line on stdout and one on
# stderr, then sleeps (reparented to the zygote, a subreaper during the run); `kill` kills it; `state` reports it.
_WARM_RUNTIME = """#!/bin/sh
root= pidf= verb= id=
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root=$2; shift 2;;
    --pid-file) pidf=$2; shift 2;;
    --log|--log-format|--bundle|--console-socket|--format|--process|--resources) shift 2;;
    -*) shift;;
    *) if [ -z "$verb" ]; then verb=$1; elif [ -z "$id" ]; then id=$1; fi; shift;;
  esac
done
case "$verb" in
  create) (echo warm-up; echo warm-up >&2; exec sleep 30) & echo $! > "$pidf"; echo $! > "$root/$id.pid";;
  kill) kill -9 "$(cat "$root/$id.pid")";;
  state) printf '{"ociVersion":"1.0.2","id":"%s","status":"running","pid":%s,"bundle":"/"}' "$id" "$(cat "$root/$id.pid")";;
esac
"""


class _WarmUpTimeout(Exception):
    """The dry run's shim did not get its Shutdown in time."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _WarmUpTimeout(f"no Shutdown within {WARM_TIMEOUT:.0f} s")


def _warm_up() -> bool:
    """Runs one shim in the zygote itself before the first fork (serve() on a listener in a private temp dir,
    driven by a forked client as husk-cri drives a pod's shim: `_warm_client`), then puts back what serve()
    set (signals, wakeup fd, subreaper, log prefix) and closes the fds it left.

    CPython 3.11 writes into the code objects it runs (warm-up counters, quickening, specialization caches)
    and into strings whose hash it computes: done here once, those pages stay shared with every shim instead
    of being copied into each on its first request. Nothing is left behind: no files, processes, fds or
    threads. Best effort: a failure is logged and the zygote goes on unwarmed. Returns True when it ran."""
    from runtime.linux import syscalls as sc
    from shim import log as shim_log
    from shim.daemon import serve, setup_logging
    from shim.ttrpc_server import listen_unix
    fds = set(os.listdir("/proc/self/fd"))
    saved_err = os.dup(2)
    client = 0
    ok = False
    d = ""
    try:
        # A fresh directory of our own (random name, made 0700 by mkdir: nothing planted there beforehand can be
        # followed, scanned or removed). On a noexec TMPDIR the stand-in runtime cannot run: skipped, logged.
        d = _private_dir("husk-spawner-warm-")
        # "c": the grouped container's state dir, made by husk-cri before its Create (cri_server/shims.py
        # task_dir), so the shim does not remove it either (nor import shutil into the zygote to do so)
        for sub in ("bundle", "state", "root", "c"):
            os.mkdir(os.path.join(d, sub), 0o700)
        with open(os.path.join(d, "bundle", "config.json"), "w") as f:
            f.write("{}")
        rt = os.path.join(d, "runtime")
        with open(rt, "w") as f:
            f.write(_WARM_RUNTIME)
        os.chmod(rt, 0o700)
        cfg = ShimConfig(id=WARM_ID, address=os.path.join(d, "s.sock"), state_dir=os.path.join(d, "state"),
                         namespace="k8s.io", runtime=rt, runtime_root=os.path.join(d, "root"),
                         bundle=os.path.join(d, "bundle"), allowed_uids=(os.getuid(),))
        listener = listen_unix(cfg.address)
        client = os.fork()
        if client == 0:
            code = 1
            try:
                listener.close()
                _warm_client(cfg, os.path.join(d, "container.log"))
                with open(os.path.join(d, "client.ok"), "w"):
                    pass
                code = 0
            except BaseException as err:  # the zygote reports the failure (client.err): it is not fatal
                try:
                    with open(os.path.join(d, "client.err"), "w") as f:
                        f.write(f"{type(err).__name__}: {err}")
                except OSError:
                    pass
                try:
                    os.kill(os.getppid(), signal.SIGTERM)   # ends serve() when no task runs (else the alarm)
                except OSError:
                    pass
            finally:
                os._exit(code)
        nul = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        os.dup2(nul, 2)     # the dry run's log lines are not husk-cri's
        os.close(nul)
        old_alarm = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, WARM_TIMEOUT)
        try:
            setup_logging(WARM_ID, False)
            serve(cfg, listener=listener, title=False)   # the zygote keeps its own name throughout
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_alarm)
        ok = True
    except Exception as err:  # best effort: an unwarmed zygote works, its shims are only bigger
        os.dup2(saved_err, 2)
        log.warning("spawner: warm-up skipped: %s: %s", type(err).__name__, err)
    finally:
        os.dup2(saved_err, 2)
        os.close(saved_err)
        # The client and the stand-in runtime's processes end first, while serve()'s handlers are still in place:
        # a failing client signals us (SIGTERM), which must not meet the default action (it would end the zygote).
        root = os.path.join(d, "root") if d else ""
        for name in (os.listdir(root) if root and os.path.isdir(root) else ()):
            _kill_pid_file(os.path.join(root, name))      # after a failure: the stand-in containers
        if client > 0 and not ok:
            _kill_pid(client)
        while True:          # serve() may have reaped some
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
        # what serve() set in this process goes back to the zygote's settings
        signal.set_wakeup_fd(-1)
        for sig, how in ((signal.SIGCHLD, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_DFL),
                         (signal.SIGINT, signal.SIG_IGN), (signal.SIGPIPE, signal.SIG_IGN)):
            signal.signal(sig, how)
        sc.set_child_subreaper(False)
        shim_log._state.update(level=shim_log.INFO, prefix="husk-shim")
        if ok and not (d and os.path.exists(os.path.join(d, "client.ok"))):
            try:
                with open(os.path.join(d, "client.err")) as f:
                    why = f.read()
            except OSError:
                why = "the client did not finish"
            log.warning("spawner: warm-up incomplete: %s", why)
            ok = False
        for fd in set(os.listdir("/proc/self/fd")) - fds:    # the loop's signal pipe, anything serve() left
            try:
                os.close(int(fd))
            except OSError:
                pass
        if d:
            try:
                _remove_tree(d)
            except OSError as err:
                log.warning("spawner: warm-up: removing %s: %s", d, err)
    return ok


def _private_dir(prefix: str) -> str:
    """A new directory of our own (0700, random name) in $TMPDIR or /tmp: tempfile.mkdtemp without importing
    tempfile, whose `random` registers an at-fork hook that would then run in every shim."""
    base = os.environ.get("TMPDIR") or "/tmp"
    for _ in range(100):
        path = os.path.join(base, prefix + os.urandom(8).hex())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{base}: no free name for a directory {prefix}*")


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_pid_file(path: str) -> None:
    try:
        with open(path) as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return
    if pid > 0:
        _kill_pid(pid)


def _remove_tree(d: str) -> None:
    if not os.path.isdir(d):
        return
    for top, dirs, files in os.walk(d, topdown=False):
        for n in files:
            os.unlink(os.path.join(top, n))
        for n in dirs:
            os.rmdir(os.path.join(top, n))
    os.rmdir(d)


def _warm_client(cfg: ShimConfig, log_path: str) -> None:
    """The dry run's husk-cri (in a forked child of the zygote): its calls on a container's shim, on one
    connection, with the Wait answered after the Kill."""
    from shim import ttrpc_wire as w
    from shim.pb import google, husk as huskpb, task as taskpb
    from shim.ttrpc_call import make_request, read_result
    from shim.unixpath import connect_unix
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(WARM_TIMEOUT)
    connect_unix(sock, cfg.address)
    reader = w.FrameReader()
    answers: dict[int, bytes | None] = {}
    next_sid = [1]
    md = {w.NAMESPACE_KEY: cfg.namespace}

    def send(method: str, req: object) -> int:
        sid = next_sid[0]
        next_sid[0] += 2
        sock.sendall(w.frame(sid, w.TYPE_REQUEST, make_request("containerd.task.v2.Task", method, req, None, md)))
        return sid

    def answer(sid: int, resp_type: type, must: bool = True) -> object:
        while sid not in answers:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("the warm-up shim closed the connection")
            reader.feed(data)
            for fsid, _mtype, _flags, payload in reader.frames():
                answers[fsid] = payload
        payload = answers.pop(sid)
        if payload is None:
            raise ValueError(f"stream {sid}: answer too large")
        try:
            return read_result(payload, resp_type)
        except w.TtrpcError:
            if must:
                raise
            return None

    def create(cid: str, **kw: object) -> bool:
        """Create + Start + a pending Wait; False when the shim serves one task only (no grouping)."""
        opts = huskpb.CreateOptions(**kw)
        if answer(send("Create", taskpb.CreateTaskRequest(
                id=cid, bundle=cfg.bundle, stdout="attach:" if "log_path" in kw else "",
                stderr="attach:" if "log_path" in kw else "",
                options=google.Any(type_url=huskpb.CreateOptions.FULL_NAME, value=opts.encode()))),
                taskpb.CreateTaskResponse, must=cid == cfg.id) is None:
            return False
        answer(send("Start", taskpb.StartRequest(id=cid)), taskpb.StartResponse)
        waits[cid] = send("Wait", taskpb.WaitRequest(id=cid))
        return True

    def remove(cid: str) -> None:
        answer(send("Kill", taskpb.KillRequest(id=cid, signal=signal.SIGKILL)), google.Empty)
        answer(waits[cid], taskpb.WaitResponse)
        answer(send("Delete", taskpb.DeleteRequest(id=cid)), taskpb.DeleteResponse)

    # as husk-cri: the pod's sandbox (no stdio), then a container of the pod in the same shim, with a CRI log
    waits: dict[str, int] = {}
    cids = [cfg.id]
    create(cfg.id)
    if create(cfg.id + "-c", log_path=log_path, state_dir=os.path.join(os.path.dirname(cfg.state_dir), "c")):
        cids.append(cfg.id + "-c")
    for _ in range(3):      # kubelet's relisting: state and stats (Stats fails where the cgroup is not readable)
        for cid in cids:
            answer(send("State", taskpb.StateRequest(id=cid)), taskpb.StateResponse)
            answer(send("Stats", taskpb.StatsRequest(id=cid)), taskpb.StatsResponse, must=False)
    for cid in reversed(cids):
        remove(cid)
    answer(send("Shutdown", taskpb.ShutdownRequest(id=cfg.id)), google.Empty, must=False)


# The blocks the pools had free when the zygote froze, now taken: kept alive, never touched again.
_FILLER: list[object] | None = None


def _warm_up_packed() -> list[object]:
    """The dry run twice, then the pools' holes filled (returns the blocks to keep). The first run goes under a
    profile hook that notes each code object it runs: those (~230, ~120 kB, over ~150 pages among code no shim
    runs) are then copied next to each other into fresh pools, with the functions that run them (`_pack_code`),
    and the second run warms the copies up. A shim writes into the code it runs (warm-up and specialization
    counters; a call raises the code's and the function's reference counts): those writes now land on ~60
    pages instead of ~150 (shim/README.md, "Memory")."""
    seen: dict[int, object] = {}

    def note(frame: object, event: str, arg: object) -> None:
        if event == "call":
            seen.setdefault(id(frame.f_code), frame.f_code)    # type: ignore[attr-defined]

    sys.setprofile(note)
    try:
        warmed = _warm_up()
    finally:
        sys.setprofile(None)
    gc.collect()
    codes = list(seen.values())
    seen.clear()
    if not warmed or not codes:
        return _fill_pool_holes()
    # Fresh pools for the copies: the size classes of code objects first (larger ones are malloc's).
    keep = _fill_pool_holes(min(sys.getsizeof(c) for c in codes) // 16 * 16)
    _pack_code(codes)
    del codes
    _warm_up()
    gc.collect()
    return keep + _fill_pool_holes()


def _pack_code(codes: list) -> int:
    """Copies `codes` one after the other (a nested code constant before its parent) and points every function
    that runs one of them at its copy; then moves those functions (`_pack_functions`). Returns how many
    functions were moved."""
    import types
    hot = {id(c): c for c in codes}
    copies: dict[int, types.CodeType] = {}

    def copy(c: types.CodeType) -> types.CodeType:
        n = copies.get(id(c))
        if n is None:
            consts = tuple(copy(k) if id(k) in hot else k for k in c.co_consts)
            same = all(a is b for a, b in zip(consts, c.co_consts))
            n = copies[id(c)] = c.replace() if same else c.replace(co_consts=consts)
        return n

    for c in codes:
        c.co_code   # made (and cached on the original) now: no temporary bytes between the copies
    for c in codes:
        copy(c)
    funcs = []
    for f in gc.get_objects():
        if type(f) is types.FunctionType:
            n = copies.get(id(f.__code__))
            if n is not None:
                f.__code__ = n
                funcs.append(f)
    return _pack_functions(funcs)


def _pack_functions(funcs: list) -> int:
    """Copies, one after the other, those of `funcs` that nothing but module and class dicts refer to (counted
    against their reference counts), and puts the copies in those dicts. Returns how many were moved."""
    import types
    want = {id(f): f for f in funcs}
    holders: dict[int, tuple[object, dict]] = {}
    for m in list(sys.modules.values()):
        d = getattr(m, "__dict__", None)
        if type(d) is dict:
            holders[id(d)] = (m, d)
    for t in gc.get_objects():
        if isinstance(t, type):
            holders[id(t)] = (t, t.__dict__)    # type: ignore[assignment]
    where: dict[int, list[tuple[object, str]]] = {}
    for owner, d in holders.values():
        for k, v in d.items():
            if want.get(id(v)) is v:
                where.setdefault(id(v), []).append((owner, k))
    holders.clear()
    # A function's references here: the loop's name, `funcs`, `want` and getrefcount's argument (the probe's
    # count also has `probe`); any more than its holders' and something else refers to it: left where it is.
    probe = types.FunctionType(_pack_functions.__code__, {})
    funcs.append(probe)
    want[id(probe)] = probe
    base = 0
    for f in funcs:
        if f is probe:
            base = sys.getrefcount(f) - 1
    movable = []
    for f in funcs:
        refs = where.get(id(f), ())
        if f is not probe and refs and sys.getrefcount(f) - base == len(refs):
            movable.append(f)
    del f, probe
    funcs.clear()
    want.clear()
    copies = []
    for f in movable:
        n = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
        n.__kwdefaults__ = f.__kwdefaults__
        n.__qualname__ = f.__qualname__
        n.__module__ = f.__module__
        n.__doc__ = f.__doc__
        if f.__dict__:
            n.__dict__.update(f.__dict__)
        copies.append(n)
    moved = 0
    for f, n in zip(movable, copies):
        n.__annotations__ = f.__annotations__
        done: list[tuple[object, str]] = []
        try:
            for owner, k in where[id(f)]:
                setattr(owner, k, n)
                done.append((owner, k))
            moved += 1
        except (AttributeError, TypeError):     # a holder that refuses it: the original stays everywhere
            for owner, k in done:
                setattr(owner, k, f)
    return moved


def _fill_pool_holes(min_size: int = 0) -> list[object]:
    """Takes every free block of pymalloc's used pools (sizes from sys._debugmallocstats(); of `min_size` bytes
    or more), twice (the first
    pass's own garbage leaves a few). A shim's new objects then go to fresh pools of its own instead of into
    free blocks scattered over pages it shares with the zygote, each of which its first allocation would copy.
    Costs the zygote ~0.3-0.5 MB (shared, not per shim). A no-op when the stats cannot be read (PYTHONMALLOC)."""
    keep: list[object] = []
    for _ in range(2):
        avail = _pool_free_blocks()
        for size, n in avail.items():
            if size >= min_size:
                keep.extend(_block(size, i) for i in range(n))
    return keep


def _pool_free_blocks() -> dict[int, int]:
    """size class (bytes) -> free blocks in used pools, from sys._debugmallocstats() (written to fd 2)."""
    fd = os.memfd_create("husk-mallocstats", os.MFD_CLOEXEC)
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        text = os.pread(fd, size, 0).decode(errors="replace")
    finally:
        os.close(fd)
    out: dict[int, int] = {}
    for line in text.splitlines():     # "class size num-pools blocks-in-use avail-blocks"
        p = line.split()
        if len(p) == 5 and all(x.isdigit() for x in p) and int(p[4]) > 0:
            out[int(p[1])] = int(p[4])
    return out


def _block(size: int, i: int) -> object:
    """An object that takes one block of `size` bytes (pymalloc size classes are multiples of 16)."""
    if size <= 16:
        return object()
    if size <= 32:
        return 10 ** 6 + i          # 28 bytes
    return b"\x01" * (size - 33)    # a bytes object is 33 bytes + its length
