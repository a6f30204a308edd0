"""The containerd.task.v2.Task service (and husk.shim.v1.Shim) for one container and its exec processes.

Owns the process table, exit bookkeeping (exit files, Wait replies, TaskExit events) and the order of
events. It runs on the shim's single-threaded loop: handlers may block only on the runtime they call.
"""
from __future__ import annotations

import os
import signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from runtime.cgroups.manager import Manager

from shim import cgroup_watch, exitfile
from shim import ttrpc_wire as w
from shim.crilog import CriLogWriter
from shim.events import Publisher, ts_from_ns
from shim.loop import Loop
from shim.pb import events as ev
from shim.pb import google, husk as huskpb, runc_options, task as taskpb, task_types
from shim.record import REQUIRED, Record
from shim.runtime_driver import RuntimeDriver, RuntimeFailure, RuntimeOptions, make_driver
from shim.stdio import ProcessIO
from shim.ttrpc_server import PENDING, CallContext
from shim.log import get as get_logger

log = get_logger(__name__)

VERSION = "husk-shim 0.1.0"
_EXEC_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def valid_exec_id(exec_id: str) -> bool:
    """1-128 of [A-Za-z0-9_.-], not starting with . or - (it names files in the state dir)."""
    return 0 < len(exec_id) <= 128 and exec_id[0] not in ".-" and set(exec_id) <= _EXEC_ID_CHARS
S = task_types.Status


class ShimConfig(Record):
    """Everything a shim instance needs; the CLI, containerd's `start` and the spawner all build one.

    id: the container id this shim serves; address: the socket path it listens on; state_dir: its own
    files (exit records, attach sockets, pid files); runtime: "husk" (in-process) or a runc-compatible
    binary; ttrpc_address: containerd's ttrpc socket for events ("" = none); allowed_uids: peers allowed
    to connect (None = anyone); write_address_file: containerd mode, writes <bundle>/address.
    """
    __slots__ = ("id", "address", "state_dir", "namespace", "runtime", "runtime_root", "ttrpc_address",
                 "bundle", "allowed_uids", "write_address_file")
    FIELDS = (("id", REQUIRED), ("address", REQUIRED), ("state_dir", REQUIRED), ("namespace", "default"),
              ("runtime", "runc"), ("runtime_root", "/run/husk/runtime"), ("ttrpc_address", ""),
              ("bundle", ""), ("allowed_uids", None), ("write_address_file", False))

    def to_argv(self) -> list[str]:
        """name=value strings (the fresh-interpreter launcher passes the config without json)."""
        out = []
        for name, _ in self.FIELDS:
            v = getattr(self, name)
            if name == "allowed_uids":
                v = "-" if v is None else ",".join(str(u) for u in v)
            elif isinstance(v, bool):
                v = "1" if v else "0"
            out.append(f"{name}={v}")
        return out

    @classmethod
    def from_argv(cls, argv: list[str]) -> "ShimConfig":
        kw: dict[str, object] = {}
        for item in argv:
            name, _, v = item.partition("=")
            if name == "allowed_uids":
                kw[name] = None if v == "-" else tuple(int(u) for u in v.split(",") if u)
            elif name == "write_address_file":
                kw[name] = v == "1"
            else:
                kw[name] = v
        return cls(**kw)


class Proc(Record):
    """One process of the task: the init (exec_id "") or an exec."""
    __slots__ = ("exec_id", "io", "stdin", "stdout", "stderr", "terminal", "spec", "pid", "status", "exit",
                 "waiters")
    FIELDS = (("exec_id", REQUIRED), ("io", REQUIRED), ("stdin", ""), ("stdout", ""), ("stderr", ""),
              ("terminal", False), ("spec", None), ("pid", 0), ("status", S.CREATED), ("exit", None),
              ("waiters", []))


class TaskService:
    def __init__(self, loop: Loop, cfg: ShimConfig, publisher: Publisher,
                 on_shutdown: Callable[[], None]) -> None:
        self.loop = loop
        self.cfg = cfg
        self.events = publisher
        self.on_shutdown = on_shutdown
        self.init: Proc | None = None
        self.execs: dict[str, Proc] = {}
        self.driver: RuntimeDriver | None = None
        self.bundle = cfg.bundle
        self.rootfs_mounted = ""
        self.cgroup: Manager | None = None
        self.oom: cgroup_watch.OomWatcher | None = None
        self.oom_seen = False
        self.crilog: CriLogWriter | None = None
        self.deleted = False
        self.unclaimed: dict[int, tuple[int, int]] = {}     # pid -> (wait status, time) reaped before known
        self.shutting_down = False

    # --- helpers -------------------------------------------------------------------------
    def _check_id(self, cid: str) -> None:
        if cid != self.cfg.id:
            raise w.TtrpcError(w.NOT_FOUND, f"container {cid!r} not found (this shim serves {self.cfg.id!r})")

    def _proc(self, cid: str, exec_id: str) -> Proc:
        self._check_id(cid)
        if self.init is None or self.deleted:
            # after Delete of the init the task is gone, as in containerd-shim-runc-v2 ("container not created")
            raise w.TtrpcError(w.NOT_FOUND, f"container {cid!r}: task not created"
                               + (" (deleted)" if self.deleted else ""))
        if not exec_id:
            return self.init
        p = self.execs.get(exec_id)
        if p is None:
            raise w.TtrpcError(w.NOT_FOUND, f"container {cid!r}: exec {exec_id!r} not found")
        return p

    def _runtime_error(self, err: RuntimeFailure) -> w.TtrpcError:
        return w.TtrpcError(w.NOT_FOUND if err.not_found else w.UNKNOWN, str(err))

    def _attach_path(self, exec_id: str) -> str:
        return os.path.join(self.cfg.state_dir, f"attach-{exec_id}.sock" if exec_id else "attach.sock")

    # --- Create --------------------------------------------------------------------------
    def Create(self, ctx: CallContext, req: taskpb.CreateTaskRequest) -> taskpb.CreateTaskResponse:
        if req.id != self.cfg.id:
            raise w.TtrpcError(w.INVALID_ARGUMENT, f"this shim serves container {self.cfg.id!r}, not {req.id!r}")
        if self.init is not None:
            raise w.TtrpcError(w.ALREADY_EXISTS, f"container {req.id!r} already created")
        if req.checkpoint:
            raise w.TtrpcError(w.UNIMPLEMENTED, "restoring from a checkpoint is not supported by husk-shim")
        if not req.bundle or not os.path.isfile(os.path.join(req.bundle, "config.json")):
            raise w.TtrpcError(w.INVALID_ARGUMENT, f"bundle {req.bundle!r}: no config.json")
        runtime, root, opts, log_path, stdin_once = self._options(req.options)
        try:
            self.driver = make_driver(runtime, RuntimeOptions(root=root, **opts),
                                      os.path.join(self.cfg.state_dir, "runtime-log.json"))
        except (RuntimeFailure, ImportError) as err:
            raise w.TtrpcError(w.FAILED_PRECONDITION, f"runtime {runtime!r}: {err}") from err
        os.makedirs(root, mode=0o711, exist_ok=True)
        self.bundle = req.bundle
        if req.rootfs:
            from shim.rootfs import mount_rootfs   # ctypes: only when containerd passes mounts
            try:
                self.rootfs_mounted = mount_rootfs(req.bundle, list(req.rootfs))
            except (OSError, ValueError) as err:
                raise w.TtrpcError(w.INVALID_ARGUMENT, f"rootfs mounts: {err}") from err
        try:
            if log_path:
                self.crilog = CriLogWriter(log_path)
            io = ProcessIO(self.loop, self.cfg.id, stdin=req.stdin, stdout=req.stdout, stderr=req.stderr,
                           terminal=req.terminal, crilog=self.crilog, attach_path=self._attach_path(""),
                           console_dir=self.cfg.state_dir, stdin_once=stdin_once)
        except (OSError, ValueError) as err:
            self._undo_create()
            raise w.TtrpcError(w.INVALID_ARGUMENT, f"stdio: {err}") from err
        pid_file = os.path.join(self.cfg.state_dir, "init.pid")
        since = time.time_ns()
        try:
            pid = self.driver.create(self.cfg.id, req.bundle, io.child, pid_file)
        except RuntimeFailure as err:
            io.abandon()
            self._undo_create()
            raise self._runtime_error(err) from err
        try:
            io.started()
        except OSError as err:
            # e.g. the runtime never sent the console: the container cannot be used, remove it.
            io.abandon()
            try:
                self.driver.delete(self.cfg.id, force=True)
            except RuntimeFailure as derr:
                log.error("%s: removing the container after a stdio failure: %s", self.cfg.id, derr)
            self.reap()
            self._undo_create()
            raise w.TtrpcError(w.UNKNOWN, f"create {self.cfg.id}: stdio: {err}") from err
        proc = Proc("", io, req.stdin, req.stdout, req.stderr, req.terminal, pid=pid)
        self.init = proc
        try:
            self.cgroup = cgroup_watch.cgroup_of(pid)
            self.oom = cgroup_watch.OomWatcher(self.loop, self.cgroup, self._on_oom)
        except (OSError, ValueError) as err:
            log.warning("%s: cgroup of pid %d: %s", self.cfg.id, pid, err)
        self.events.publish(ev.TaskCreate(container_id=self.cfg.id, bundle=req.bundle, rootfs=list(req.rootfs),
                                          io=ev.TaskIO(stdin=req.stdin, stdout=req.stdout, stderr=req.stderr,
                                                       terminal=req.terminal), pid=pid))
        self._claim(proc, since)
        return taskpb.CreateTaskResponse(pid=pid)

    def _undo_create(self) -> None:
        if self.rootfs_mounted:
            from shim.rootfs import unmount_rootfs
            unmount_rootfs(self.rootfs_mounted)
            self.rootfs_mounted = ""
        if self.crilog is not None:
            self.crilog.close()
            self.crilog = None

    def _options(self, opts: google.Any | None) -> tuple[str, str, dict[str, bool], str, bool]:
        runtime, root = self.cfg.runtime, os.path.join(self.cfg.runtime_root)
        flags = {"no_pivot": False, "no_new_keyring": False, "systemd_cgroup": False}
        log_path, stdin_once = "", False
        if opts is not None and opts.type_url:
            try:
                if opts.type_url.endswith("containerd.runc.v1.Options"):
                    o = runc_options.Options.decode(opts.value)
                    runtime = o.binary_name or runtime
                    root = o.root or root
                    flags = {"no_pivot": o.no_pivot_root, "no_new_keyring": o.no_new_keyring,
                             "systemd_cgroup": o.systemd_cgroup}
                elif opts.type_url.endswith("husk.shim.v1.CreateOptions"):
                    h = huskpb.CreateOptions.decode(opts.value)
                    runtime = h.runtime or runtime
                    root = h.runtime_root or root
                    log_path = h.log_path
                    stdin_once = h.stdin_once
                    flags["systemd_cgroup"] = h.systemd_cgroup
                else:
                    raise w.TtrpcError(w.INVALID_ARGUMENT, f"unsupported options type {opts.type_url!r}")
            except ValueError as err:
                raise w.TtrpcError(w.INVALID_ARGUMENT, f"options {opts.type_url}: {err}") from err
        if self.cfg.namespace and root == self.cfg.runtime_root and self.cfg.write_address_file:
            root = os.path.join(root, self.cfg.namespace)
        return runtime, root, flags, log_path, stdin_once

    # --- Start ---------------------------------------------------------------------------
    def Start(self, ctx: CallContext, req: taskpb.StartRequest) -> taskpb.StartResponse:
        p = self._proc(req.id, req.exec_id)
        assert self.driver is not None
        if p.status != S.CREATED:
            raise w.TtrpcError(w.FAILED_PRECONDITION, f"{self._name(p)} is {S.NAMES[p.status].lower()}, not created")
        if not p.exec_id:
            try:
                self.driver.start(self.cfg.id)
            except RuntimeFailure as err:
                raise self._runtime_error(err) from err
            if p.exit is None:
                p.status = S.RUNNING
            self.events.publish(ev.TaskStart(container_id=self.cfg.id, pid=p.pid))
            return taskpb.StartResponse(pid=p.pid)
        if self.init is None or self.init.status not in (S.RUNNING, S.PAUSED):
            raise w.TtrpcError(w.FAILED_PRECONDITION, f"{self._name(p)}: container is not running")
        pid_file = os.path.join(self.cfg.state_dir, f"exec-{p.exec_id}.pid")
        since = time.time_ns()
        try:
            p.pid = self.driver.exec(self.cfg.id, p.spec or {}, p.io.child, pid_file)
        except RuntimeFailure as err:
            p.io.abandon()
            p.status = S.STOPPED
            p.exit = exitfile.ExitRecord(0, 255, time.time_ns())
            self._wake(p)
            raise self._runtime_error(err) from err
        finally:
            try:
                os.unlink(pid_file)
            except FileNotFoundError:
                pass
        try:
            p.io.started()
        except OSError as err:
            log.error("%s: stdio after exec: %s", self._name(p), err)
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.io.abandon()
        p.status = S.RUNNING
        self.events.publish(ev.TaskExecStarted(container_id=self.cfg.id, exec_id=p.exec_id, pid=p.pid))
        self._claim(p, since)
        return taskpb.StartResponse(pid=p.pid)

    def _name(self, p: Proc) -> str:
        return f"exec {p.exec_id!r}" if p.exec_id else f"container {self.cfg.id!r}"

    # --- Exec ----------------------------------------------------------------------------
    def Exec(self, ctx: CallContext, req: taskpb.ExecProcessRequest) -> google.Empty:
        self._proc(req.id, "")
        if not valid_exec_id(req.exec_id):
            raise w.TtrpcError(w.INVALID_ARGUMENT, f"exec id {req.exec_id!r}: want 1-128 of [A-Za-z0-9_.-]")
        if req.exec_id in self.execs:
            raise w.TtrpcError(w.ALREADY_EXISTS, f"exec {req.exec_id!r} already exists")
        if self.init is None or self.init.status in (S.STOPPED,):
            raise w.TtrpcError(w.FAILED_PRECONDITION, f"container {req.id!r} is not running")
        if req.spec is None or not req.spec.value:
            raise w.TtrpcError(w.INVALID_ARGUMENT, "exec: spec (the OCI process as JSON) is required")
        import json
        try:
            spec = json.loads(req.spec.value)
            if not isinstance(spec, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            raise w.TtrpcError(w.INVALID_ARGUMENT, f"exec spec: {err}") from err
        spec["terminal"] = bool(req.terminal)
        try:
            io = ProcessIO(self.loop, f"{self.cfg.id}/{req.exec_id}", stdin=req.stdin, stdout=req.stdout,
                           stderr=req.stderr, terminal=req.terminal, attach_path=self._attach_path(req.exec_id),
                           console_dir=self.cfg.state_dir, attach_backpressure=True)
        except (OSError, ValueError) as err:
            raise w.TtrpcError(w.INVALID_ARGUMENT, f"exec stdio: {err}") from err
        self.execs[req.exec_id] = Proc(req.exec_id, io, req.stdin, req.stdout, req.stderr, req.terminal, spec=spec)
        self.events.publish(ev.TaskExecAdded(container_id=self.cfg.id, exec_id=req.exec_id))
        return google.Empty()

    # --- State / Pids / Stats / Connect --------------------------------------------------
    def State(self, ctx: CallContext, req: taskpb.StateRequest) -> taskpb.StateResponse:
        p = self._proc(req.id, req.exec_id)
        if p is self.init and p.status in (S.RUNNING, S.PAUSED) and self.driver is not None:
            p.status = self._runtime_status(p)
        r = taskpb.StateResponse(id=req.exec_id or self.cfg.id, bundle=self.bundle, pid=p.pid, status=p.status,
                                 stdin=p.stdin, stdout=p.stdout, stderr=p.stderr, terminal=p.terminal,
                                 exec_id=req.exec_id)
        if p.exit is not None:
            r.exit_status = p.exit.exit_status
            r.exited_at = ts_from_ns(p.exit.exited_at_ns)
        return r

    def _runtime_status(self, p: Proc) -> int:
        """Paused/running as the cgroup freezer says (cheap; the runtime binary is not run)."""
        paused = cgroup_watch.paused(self.cgroup) if self.cgroup is not None else None
        if paused is not None:
            return S.PAUSED if paused else S.RUNNING
        return p.status

    def Pids(self, ctx: CallContext, req: taskpb.PidsRequest) -> taskpb.PidsResponse:
        self._proc(req.id, "")
        pids = cgroup_watch.pids(self.cgroup) if self.cgroup is not None else []
        if not pids and self.driver is not None and self.init is not None and self.init.exit is None:
            try:
                pids = self.driver.ps(self.cfg.id)
            except RuntimeFailure as err:
                raise self._runtime_error(err) from err
        by_pid = {p.pid: p.exec_id for p in self.execs.values() if p.pid}
        out = []
        for pid in pids:
            info = None
            if pid in by_pid:
                d = runc_options.ProcessDetails(exec_id=by_pid[pid])
                info = google.Any(type_url=d.FULL_NAME, value=d.encode())
            out.append(task_types.ProcessInfo(pid=pid, info=info))
        return taskpb.PidsResponse(processes=out)

    def Stats(self, ctx: CallContext, req: taskpb.StatsRequest) -> taskpb.StatsResponse:
        self._proc(req.id, "")
        if self.cgroup is None:
            raise w.TtrpcError(w.NOT_FOUND, f"container {req.id!r}: no cgroup known")
        m = cgroup_watch.metrics(self.cgroup)
        return taskpb.StatsResponse(stats=google.Any(type_url=m.FULL_NAME, value=m.encode()))

    def Connect(self, ctx: CallContext, req: taskpb.ConnectRequest) -> taskpb.ConnectResponse:
        return taskpb.ConnectResponse(shim_pid=os.getpid(), task_pid=self.init.pid if self.init else 0,
                                      version=VERSION)

    # --- Kill / Pause / Resume / Update / ResizePty / CloseIO ------------------------------
    def Kill(self, ctx: CallContext, req: taskpb.KillRequest) -> google.Empty:
        p = self._proc(req.id, req.exec_id)
        assert self.driver is not None
        if p.exit is not None and not (req.all and not p.exec_id):
            raise w.TtrpcError(w.NOT_FOUND, f"{self._name(p)}: process already finished")
        if p.exec_id:
            if p.status == S.CREATED:
                raise w.TtrpcError(w.FAILED_PRECONDITION, f"{self._name(p)} was not started")
            try:
                if req.all and os.getpgid(p.pid) == p.pid:
                    # husk's meaning of `all` for an exec: its process group (runtimes setsid the exec'd
                    # process), so a timed-out ExecSync takes the children it started with it.
                    os.killpg(p.pid, req.signal)
                else:
                    os.kill(p.pid, req.signal)
            except ProcessLookupError:
                raise w.TtrpcError(w.NOT_FOUND, f"{self._name(p)}: process already finished") from None
            return google.Empty()
        try:
            self.driver.kill(self.cfg.id, req.signal, all=req.all)
        except RuntimeFailure as err:
            if p.exit is not None or err.not_found:
                raise w.TtrpcError(w.NOT_FOUND, f"{self._name(p)}: process already finished") from err
            raise self._runtime_error(err) from err
        return google.Empty()

    def Pause(self, ctx: CallContext, req: taskpb.PauseRequest) -> google.Empty:
        p = self._proc(req.id, "")
        assert self.driver is not None
        try:
            self.driver.pause(self.cfg.id)
        except RuntimeFailure as err:
            raise self._runtime_error(err) from err
        p.status = S.PAUSED
        self.events.publish(ev.TaskPaused(container_id=self.cfg.id))
        return google.Empty()

    def Resume(self, ctx: CallContext, req: taskpb.ResumeRequest) -> google.Empty:
        p = self._proc(req.id, "")
        assert self.driver is not None
        try:
            self.driver.resume(self.cfg.id)
        except RuntimeFailure as err:
            raise self._runtime_error(err) from err
        if p.exit is None:
            p.status = S.RUNNING
        self.events.publish(ev.TaskResumed(container_id=self.cfg.id))
        return google.Empty()

    def Checkpoint(self, ctx: CallContext, req: taskpb.CheckpointTaskRequest) -> google.Empty:
        raise w.TtrpcError(w.UNIMPLEMENTED, "checkpoint is not supported by husk-shim (no CRIU support)")

    def Update(self, ctx: CallContext, req: taskpb.UpdateTaskRequest) -> google.Empty:
        self._proc(req.id, "")
        assert self.driver is not None
        if req.resources is None or not req.resources.value:
            raise w.TtrpcError(w.INVALID_ARGUMENT, "update: resources (OCI LinuxResources JSON) are required")
        import json
        try:
            resources = json.loads(req.resources.value)
        except ValueError as err:
            raise w.TtrpcError(w.INVALID_ARGUMENT, f"update resources: {err}") from err
        try:
            self.driver.update(self.cfg.id, resources)
        except RuntimeFailure as err:
            raise self._runtime_error(err) from err
        return google.Empty()

    def ResizePty(self, ctx: CallContext, req: taskpb.ResizePtyRequest) -> google.Empty:
        p = self._proc(req.id, req.exec_id)
        try:
            p.io.resize(req.width, req.height)
        except OSError as err:
            raise w.TtrpcError(w.FAILED_PRECONDITION, str(err)) from err
        return google.Empty()

    def CloseIO(self, ctx: CallContext, req: taskpb.CloseIORequest) -> google.Empty:
        p = self._proc(req.id, req.exec_id)
        if req.stdin:
            p.io.close_stdin()
        return google.Empty()

    # --- Wait / exits --------------------------------------------------------------------
    def Wait(self, ctx: CallContext, req: taskpb.WaitRequest) -> Any:
        p = self._proc(req.id, req.exec_id)
        if p.exit is not None:
            return taskpb.WaitResponse(exit_status=p.exit.exit_status, exited_at=ts_from_ns(p.exit.exited_at_ns))
        p.waiters.append(ctx)
        return PENDING

    def _wake(self, p: Proc) -> None:
        assert p.exit is not None
        resp = taskpb.WaitResponse(exit_status=p.exit.exit_status, exited_at=ts_from_ns(p.exit.exited_at_ns))
        for ctx in p.waiters:
            if ctx.alive:
                ctx.reply(resp)
        p.waiters.clear()

    def _claim(self, p: Proc, since_ns: int) -> None:
        """A process whose exit was reaped before we knew its pid (only exits reaped after its runtime
        call began count: an older entry is another process that had the same pid)."""
        early = self.unclaimed.pop(p.pid, None)
        if early is not None and early[1] >= since_ns:
            self._exited(p, early[0], early[1])

    def reap(self) -> None:
        """SIGCHLD: collect every exited child (we are a subreaper: orphans land here too)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            now = time.time_ns()
            p = self._by_pid(pid)
            if p is None:
                if len(self.unclaimed) > 1024:
                    self.unclaimed.pop(next(iter(self.unclaimed)))
                self.unclaimed[pid] = (status, now)
                continue
            self._exited(p, status, now)

    def _by_pid(self, pid: int) -> Proc | None:
        if self.init is not None and self.init.pid == pid and self.init.exit is None:
            return self.init
        for p in self.execs.values():
            if p.pid == pid and p.exit is None:
                return p
        return None

    def _exited(self, p: Proc, status: int, when_ns: int) -> None:
        p.io.drain()
        code = exitfile.status_from_wait(status)
        oom = False
        if p is self.init:
            if self.oom is not None:
                self.oom.check()     # the kill may race the eventfd: read the counter once more
            oom = self.oom_seen and code == 128 + signal.SIGKILL
        p.exit = exitfile.ExitRecord(p.pid, code, when_ns, oom)
        p.status = S.STOPPED
        try:
            exitfile.write(self.cfg.state_dir, p.exec_id, p.exit)
        except OSError as err:
            log.error("%s: writing exit record: %s", self._name(p), err)
        p.io.exited(code)
        log.info("%s: pid %d exited with status %d%s", self._name(p), p.pid, code, " (OOM killed)" if oom else "")
        if p is self.init:
            # Exec processes cannot outlive the container (the kernel does it for a private pid namespace).
            for e in self.execs.values():
                if e.exit is None and e.pid:
                    try:
                        os.kill(e.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        self.events.publish(ev.TaskExit(container_id=self.cfg.id, id=p.exec_id or self.cfg.id, pid=p.pid,
                                        exit_status=code, exited_at=ts_from_ns(when_ns),
                                        exit_reason=task_types.ExitReason.OOMKILLED if oom else 0))
        self._wake(p)

    def _on_oom(self) -> None:
        self.oom_seen = True
        log.warning("container %s: OOM kill in its cgroup", self.cfg.id)
        self.events.publish(ev.TaskOOM(container_id=self.cfg.id))

    # --- Delete / Shutdown ---------------------------------------------------------------
    def Delete(self, ctx: CallContext, req: taskpb.DeleteRequest) -> taskpb.DeleteResponse:
        p = self._proc(req.id, req.exec_id)
        if p.exec_id:
            if p.status not in (S.STOPPED, S.CREATED):
                raise w.TtrpcError(w.FAILED_PRECONDITION, f"{self._name(p)} is running; kill it first")
            p.io.close()
            del self.execs[p.exec_id]
            exitfile.remove(self.cfg.state_dir, p.exec_id)
            if p.exit is None:
                # Never started: its waiters must not wait forever.
                p.exit = exitfile.ExitRecord(p.pid, 0, time.time_ns())
                p.status = S.STOPPED
                self._wake(p)
            ex = p.exit
            self.events.publish(ev.TaskDelete(container_id=self.cfg.id, pid=p.pid, exit_status=ex.exit_status,
                                              exited_at=ts_from_ns(ex.exited_at_ns), id=p.exec_id))
            return taskpb.DeleteResponse(pid=p.pid, exit_status=ex.exit_status, exited_at=ts_from_ns(ex.exited_at_ns))
        if p.status not in (S.STOPPED, S.CREATED):
            raise w.TtrpcError(w.FAILED_PRECONDITION, f"{self._name(p)} is running; kill it first")
        assert self.driver is not None
        try:
            self.driver.delete(self.cfg.id, force=True)
        except RuntimeFailure as err:
            if not err.not_found:
                raise self._runtime_error(err) from err
        if p.exit is None:
            # A created-but-never-started init was killed by the forced delete; record it if not reaped yet.
            self.reap()
            if p.exit is None:
                p.exit = exitfile.ExitRecord(p.pid, 128 + signal.SIGKILL, time.time_ns())
                p.status = S.STOPPED
                self._wake(p)
        for e in list(self.execs.values()):
            e.io.close()
        self.execs.clear()
        p.io.close()
        if self.oom is not None:
            self.oom.close()
            self.oom = None
        if self.crilog is not None:
            self.crilog.close()
            self.crilog = None
        if self.rootfs_mounted:
            from shim.rootfs import unmount_rootfs
            unmount_rootfs(self.rootfs_mounted)
            self.rootfs_mounted = ""
        self.deleted = True
        exitfile.remove(self.cfg.state_dir, "")
        ex = p.exit
        self.events.publish(ev.TaskDelete(container_id=self.cfg.id, pid=p.pid, exit_status=ex.exit_status,
                                          exited_at=ts_from_ns(ex.exited_at_ns)))
        return taskpb.DeleteResponse(pid=p.pid, exit_status=ex.exit_status, exited_at=ts_from_ns(ex.exited_at_ns))

    def Shutdown(self, ctx: CallContext, req: taskpb.ShutdownRequest) -> google.Empty:
        self._check_id(req.id)
        live = self.init is not None and not self.deleted
        if live and not req.now:
            # containerd semantics: a shim with a task left keeps running.
            return google.Empty()
        ctx.reply(google.Empty())
        self.shutting_down = True
        self.loop.call_later(0, self.on_shutdown)
        return PENDING

    # --- husk.shim.v1.Shim ---------------------------------------------------------------
    def ReopenLog(self, ctx: CallContext, req: huskpb.ReopenLogRequest) -> google.Empty:
        self._proc(req.id, "")
        if self.crilog is None:
            raise w.TtrpcError(w.FAILED_PRECONDITION, f"container {req.id!r} has no CRI log file")
        try:
            self.crilog.reopen()
        except OSError as err:
            raise w.TtrpcError(w.UNKNOWN, f"reopen {self.crilog.path}: {err}") from err
        return google.Empty()

    def AttachInfo(self, ctx: CallContext, req: huskpb.AttachInfoRequest) -> huskpb.AttachInfoResponse:
        p = self._proc(req.id, req.exec_id)
        if p.io.attach is None:
            raise w.TtrpcError(w.NOT_FOUND, f"{self._name(p)}: no attach socket")
        return huskpb.AttachInfoResponse(path=p.io.attach.path)

    def cleanup(self) -> None:
        """The shim is exiting: close what is left (only after Delete, or on Shutdown(now))."""
        for e in list(self.execs.values()):
            e.io.close()
        if self.init is not None:
            self.init.io.close()
        if self.oom is not None:
            self.oom.close()
        if self.crilog is not None:
            self.crilog.close()
        if self.rootfs_mounted and self.deleted:
            from shim.rootfs import unmount_rootfs
            unmount_rootfs(self.rootfs_mounted)
