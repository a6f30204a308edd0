"""The containerd.task.v2.Task service (and husk.shim.v1.Shim): the tasks (containers) one shim serves.

A shim serves one task or, grouped as containerd-shim-runc-v2 groups a pod, several: the pod's pause
container and its containers, each keyed by its id, with its own processes (init and execs), stdio, CRI
log, exit files, attach sockets, cgroup and OOM watcher. Owns the process tables, exit bookkeeping (exit
files, Wait replies, TaskExit events) and the order of events. It runs on the shim's single-threaded loop:
handlers may block only on the runtime they call.
"""
from __future__ import annotations

import os
import signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

from shim import cgroup_watch, exitfile
from shim import ttrpc_wire as w
from shim.crilog import CriLogWriter
from shim.events import Publisher, ts_from_ns
from shim.loop import Loop
from shim.pb import events as ev
from shim.pb import cgroups_v1, google, husk as huskpb, runc_options, task as taskpb, task_types
from shim.record import REQUIRED, Record
from shim.runtime_driver import RuntimeFailure, RuntimeOptions, call_in_child, make_driver
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

    id: the first task's id (the pod's sandbox id when grouped; the shim's name); address: the socket path
    it listens on; state_dir: the first task's files (exit records, attach sockets, pid files) and the
    shim's; runtime: "husk" (in-process) or a runc-compatible binary; ttrpc_address: containerd's ttrpc
    socket for events ("" = none); allowed_uids: peers allowed to connect (None = anyone);
    write_address_file: containerd mode, writes <bundle>/address (and a grouped task's files go to its
    bundle, as containerd's shims keep them).
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
    """One process of a task: the init (exec_id "") or an exec; `cid` is its task's id."""
    __slots__ = ("cid", "exec_id", "io", "stdin", "stdout", "stderr", "terminal", "spec", "pid", "status", "exit",
                 "waiters")
    FIELDS = (("cid", REQUIRED), ("exec_id", REQUIRED), ("io", REQUIRED), ("stdin", ""), ("stdout", ""),
              ("stderr", ""), ("terminal", False), ("spec", None), ("pid", 0), ("status", S.CREATED),
              ("exit", None), ("waiters", []))


class Task(Record):
    """One container the shim serves: its runtime driver, init and exec processes, files and cgroup.
    state_dir holds its exit files, attach sockets, pid files and runtime log."""
    __slots__ = ("id", "state_dir", "bundle", "driver", "init", "execs", "rootfs_mounted", "cgroup", "oom",
                 "oom_seen", "crilog", "made_state_dir")
    FIELDS = (("id", REQUIRED), ("state_dir", REQUIRED), ("bundle", ""), ("driver", None), ("init", None),
              ("execs", {}), ("rootfs_mounted", ""), ("cgroup", None), ("oom", None), ("oom_seen", False),
              ("crilog", None), ("made_state_dir", False))


class TaskService:
    def __init__(self, loop: Loop, cfg: ShimConfig, publisher: Publisher,
                 on_shutdown: Callable[[], None]) -> None:
        self.loop = loop
        self.cfg = cfg
        self.events = publisher
        self.on_shutdown = on_shutdown
        self.tasks: dict[str, Task] = {}     # created and not yet deleted, by container id
        self.unclaimed: dict[int, tuple[int, int]] = {}     # pid -> (wait status, time) reaped before known
        self.shutting_down = False

    # --- helpers -------------------------------------------------------------------------
    def live(self) -> bool:
        """Some task's init has not exited (the shim then ignores SIGTERM: it is their parent)."""
        return any(t.init is not None and t.init.exit is None for t in self.tasks.values())

    def _task(self, cid: str) -> Task:
        t = self.tasks.get(cid)
        if t is None or t.init is None:
            # never created, or deleted: as containerd-shim-runc-v2 answers ("container not created")
            raise w.TtrpcError(w.NOT_FOUND, f"container {cid!r}: task not created")
        return t

    def _proc(self, cid: str, exec_id: str) -> Proc:
        t = self._task(cid)
        if not exec_id:
            return t.init
        p = t.execs.get(exec_id)
        if p is None:
            raise w.TtrpcError(w.NOT_FOUND, f"container {cid!r}: exec {exec_id!r} not found")
        return p

    def _runtime_error(self, err: RuntimeFailure) -> w.TtrpcError:
        return w.TtrpcError(w.NOT_FOUND if err.not_found else w.UNKNOWN, str(err))

    def _attach_path(self, t: Task, exec_id: str) -> str:
        return os.path.join(t.state_dir, f"attach-{exec_id}.sock" if exec_id else "attach.sock")

    def _state_dir(self, cid: str, option: str, bundle: str) -> tuple[str, bool]:
        """Where a task's files go, and whether the shim made the directory: the shim's own for its first
        task; for a grouped task the Create options' state_dir, else (containerd) its bundle, else a
        subdirectory of the shim's."""
        if cid == self.cfg.id:
            return self.cfg.state_dir, False
        if option:
            if not os.path.isabs(option):
                raise w.TtrpcError(w.INVALID_ARGUMENT, f"options state_dir {option!r}: not an absolute path")
            d = option
        elif self.cfg.write_address_file:
            return bundle, False
        else:
            d = os.path.join(self.cfg.state_dir, cid)
        made = not os.path.isdir(d)
        os.makedirs(d, mode=0o711, exist_ok=True)
        return d, made

    # --- Create --------------------------------------------------------------------------
    def Create(self, ctx: CallContext, req: taskpb.CreateTaskRequest) -> taskpb.CreateTaskResponse:
        if req.checkpoint:
            raise w.TtrpcError(w.UNIMPLEMENTED, "restoring from a checkpoint is not supported by husk-shim")
        if not req.bundle or not os.path.isfile(os.path.join(req.bundle, "config.json")):
            raise w.TtrpcError(w.INVALID_ARGUMENT, f"bundle {req.bundle!r}: no config.json")
        if not valid_exec_id(req.id):
            raise w.TtrpcError(w.INVALID_ARGUMENT, f"container id {req.id!r}: want 1-128 of [A-Za-z0-9_.-]")
        if req.id in self.tasks:
            raise w.TtrpcError(w.ALREADY_EXISTS, f"container {req.id!r} already created")
        if self.shutting_down:
            raise w.TtrpcError(w.FAILED_PRECONDITION, f"create {req.id}: the shim is shutting down")
        runtime, root, opts, log_path, stdin_once = self._options(req.options)
        state_dir, made = self._state_dir(req.id, self._state_dir_option(req.options), req.bundle)
        t = Task(req.id, state_dir, req.bundle, made_state_dir=made)
        try:
            t.driver = make_driver(runtime, RuntimeOptions(root=root, **opts),
                                   os.path.join(state_dir, "runtime-log.json"))
        except (RuntimeFailure, ImportError) as err:
            self._undo_create(t)
            raise w.TtrpcError(w.FAILED_PRECONDITION, f"runtime {runtime!r}: {err}") from err
        os.makedirs(root, mode=0o711, exist_ok=True)
        if req.rootfs:
            from shim.rootfs import mount_rootfs   # ctypes: only when containerd passes mounts
            try:
                t.rootfs_mounted = mount_rootfs(req.bundle, list(req.rootfs))
            except (OSError, ValueError) as err:
                self._undo_create(t)
                raise w.TtrpcError(w.INVALID_ARGUMENT, f"rootfs mounts: {err}") from err
        try:
            if log_path:
                t.crilog = CriLogWriter(log_path)
            io = ProcessIO(self.loop, req.id, stdin=req.stdin, stdout=req.stdout, stderr=req.stderr,
                           terminal=req.terminal, crilog=t.crilog, attach_path=self._attach_path(t, ""),
                           console_dir=state_dir, stdin_once=stdin_once)
        except (OSError, ValueError) as err:
            self._undo_create(t)
            raise w.TtrpcError(w.INVALID_ARGUMENT, f"stdio: {err}") from err
        pid_file = os.path.join(state_dir, "init.pid")
        since = time.time_ns()
        try:
            pid = t.driver.create(req.id, req.bundle, io.child, pid_file)
        except RuntimeFailure as err:
            io.abandon()
            self._undo_create(t)
            raise self._runtime_error(err) from err
        try:
            io.started()
        except OSError as err:
            # e.g. the runtime never sent the console: the container cannot be used, remove it.
            io.abandon()
            try:
                t.driver.delete(req.id, force=True)
            except RuntimeFailure as derr:
                log.error("%s: removing the container after a stdio failure: %s", req.id, derr)
            self.reap()
            self._undo_create(t)
            raise w.TtrpcError(w.UNKNOWN, f"create {req.id}: stdio: {err}") from err
        proc = Proc(req.id, "", io, req.stdin, req.stdout, req.stderr, req.terminal, pid=pid)
        t.init = proc
        self.tasks[req.id] = t
        try:
            t.cgroup = cgroup_watch.cgroup_of(pid)
            t.oom = cgroup_watch.OomWatcher(self.loop, t.cgroup, lambda: self._on_oom(t))
        except (OSError, ValueError) as err:
            log.warning("%s: cgroup of pid %d: %s", req.id, pid, err)
        self.events.publish(ev.TaskCreate(container_id=req.id, bundle=req.bundle, rootfs=list(req.rootfs),
                                          io=ev.TaskIO(stdin=req.stdin, stdout=req.stdout, stderr=req.stderr,
                                                       terminal=req.terminal), pid=pid))
        self._claim(proc, since)
        return taskpb.CreateTaskResponse(pid=pid)

    def _undo_create(self, t: Task) -> None:
        if t.rootfs_mounted:
            from shim.rootfs import unmount_rootfs
            unmount_rootfs(t.rootfs_mounted)
            t.rootfs_mounted = ""
        if t.crilog is not None:
            t.crilog.close()
            t.crilog = None
        self._remove_task_files(t)

    def _remove_task_files(self, t: Task) -> None:
        """A grouped task's directory made by the shim goes with the task (the first task's is the shim's)."""
        if t.made_state_dir:
            import shutil
            shutil.rmtree(t.state_dir, ignore_errors=True)

    def _state_dir_option(self, opts: google.Any | None) -> str:
        """husk.shim.v1.CreateOptions.state_dir ("" otherwise; `_options` has checked the options)."""
        if opts is None or not opts.type_url.endswith("husk.shim.v1.CreateOptions"):
            return ""
        return huskpb.CreateOptions.decode(opts.value).state_dir

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
        t = self._task(req.id)
        p = self._proc(req.id, req.exec_id)
        if p.status != S.CREATED:
            raise w.TtrpcError(w.FAILED_PRECONDITION, f"{self._name(p)} is {S.NAMES[p.status].lower()}, not created")
        if not p.exec_id:
            try:
                t.driver.start(t.id)
            except RuntimeFailure as err:
                raise self._runtime_error(err) from err
            if p.exit is None:
                p.status = S.RUNNING
            self.events.publish(ev.TaskStart(container_id=t.id, pid=p.pid))
            return taskpb.StartResponse(pid=p.pid)
        if t.init.status not in (S.RUNNING, S.PAUSED):
            raise w.TtrpcError(w.FAILED_PRECONDITION, f"{self._name(p)}: container is not running")
        pid_file = os.path.join(t.state_dir, f"exec-{p.exec_id}.pid")
        since = time.time_ns()
        try:
            p.pid = t.driver.exec(t.id, p.spec or {}, p.io.child, pid_file)
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
        self.events.publish(ev.TaskExecStarted(container_id=t.id, exec_id=p.exec_id, pid=p.pid))
        self._claim(p, since)
        return taskpb.StartResponse(pid=p.pid)

    def _name(self, p: Proc) -> str:
        return f"container {p.cid!r} exec {p.exec_id!r}" if p.exec_id else f"container {p.cid!r}"

    # --- Exec ----------------------------------------------------------------------------
    def Exec(self, ctx: CallContext, req: taskpb.ExecProcessRequest) -> google.Empty:
        t = self._task(req.id)
        if not valid_exec_id(req.exec_id):
            raise w.TtrpcError(w.INVALID_ARGUMENT, f"exec id {req.exec_id!r}: want 1-128 of [A-Za-z0-9_.-]")
        if req.exec_id in t.execs:
            raise w.TtrpcError(w.ALREADY_EXISTS, f"exec {req.exec_id!r} already exists")
        if t.init.status in (S.STOPPED,):
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
            io = ProcessIO(self.loop, f"{t.id}/{req.exec_id}", stdin=req.stdin, stdout=req.stdout,
                           stderr=req.stderr, terminal=req.terminal, attach_path=self._attach_path(t, req.exec_id),
                           console_dir=t.state_dir, attach_backpressure=True)
        except (OSError, ValueError) as err:
            raise w.TtrpcError(w.INVALID_ARGUMENT, f"exec stdio: {err}") from err
        t.execs[req.exec_id] = Proc(t.id, req.exec_id, io, req.stdin, req.stdout, req.stderr, req.terminal,
                                    spec=spec)
        self.events.publish(ev.TaskExecAdded(container_id=t.id, exec_id=req.exec_id))
        return google.Empty()

    # --- State / Pids / Stats / Connect --------------------------------------------------
    def State(self, ctx: CallContext, req: taskpb.StateRequest) -> taskpb.StateResponse:
        t = self._task(req.id)
        p = self._proc(req.id, req.exec_id)
        if p is t.init and p.status in (S.RUNNING, S.PAUSED):
            p.status = self._runtime_status(t, p)
        r = taskpb.StateResponse(id=req.exec_id or t.id, bundle=t.bundle, pid=p.pid, status=p.status,
                                 stdin=p.stdin, stdout=p.stdout, stderr=p.stderr, terminal=p.terminal,
                                 exec_id=req.exec_id)
        if p.exit is not None:
            r.exit_status = p.exit.exit_status
            r.exited_at = ts_from_ns(p.exit.exited_at_ns)
        return r

    def _runtime_status(self, t: Task, p: Proc) -> int:
        """Paused/running as the cgroup freezer says (cheap; the runtime binary is not run)."""
        paused = cgroup_watch.paused(t.cgroup) if t.cgroup is not None else None
        if paused is not None:
            return S.PAUSED if paused else S.RUNNING
        return p.status

    def Pids(self, ctx: CallContext, req: taskpb.PidsRequest) -> taskpb.PidsResponse:
        t = self._task(req.id)
        pids = cgroup_watch.pids(t.cgroup) if t.cgroup is not None else []
        if not pids and t.init.exit is None:
            try:
                pids = t.driver.ps(t.id)
            except RuntimeFailure as err:
                raise self._runtime_error(err) from err
        by_pid = {p.pid: p.exec_id for p in t.execs.values() if p.pid}
        out = []
        for pid in pids:
            info = None
            if pid in by_pid:
                d = runc_options.ProcessDetails(exec_id=by_pid[pid])
                info = google.Any(type_url=d.FULL_NAME, value=d.encode())
            out.append(task_types.ProcessInfo(pid=pid, info=info))
        return taskpb.PidsResponse(processes=out)

    def Stats(self, ctx: CallContext, req: taskpb.StatsRequest) -> taskpb.StatsResponse:
        t = self._task(req.id)
        if t.cgroup is None:
            raise w.TtrpcError(w.NOT_FOUND, f"container {req.id!r}: no cgroup known")
        # read and encoded in a forked child: the cgroup reader's objects are not written in the shim (-0.28 MB
        # private per shim: shim/README.md, "Memory")
        try:
            value = call_in_child("stats", req.id, _encoded_metrics, t.cgroup)
        except RuntimeFailure as err:
            raise w.TtrpcError(w.UNKNOWN, str(err)) from err
        return taskpb.StatsResponse(stats=google.Any(type_url=_METRICS_TYPE, value=value))

    def Connect(self, ctx: CallContext, req: taskpb.ConnectRequest) -> taskpb.ConnectResponse:
        t = self.tasks.get(req.id) or self.tasks.get(self.cfg.id)
        return taskpb.ConnectResponse(shim_pid=os.getpid(), task_pid=t.init.pid if t and t.init else 0,
                                      version=VERSION)

    # --- Kill / Pause / Resume / Update / ResizePty / CloseIO ------------------------------
    def Kill(self, ctx: CallContext, req: taskpb.KillRequest) -> google.Empty:
        t = self._task(req.id)
        p = self._proc(req.id, req.exec_id)
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
            t.driver.kill(t.id, req.signal, all=req.all)
        except RuntimeFailure as err:
            if p.exit is not None or err.not_found:
                raise w.TtrpcError(w.NOT_FOUND, f"{self._name(p)}: process already finished") from err
            raise self._runtime_error(err) from err
        return google.Empty()

    def Pause(self, ctx: CallContext, req: taskpb.PauseRequest) -> google.Empty:
        t = self._task(req.id)
        try:
            t.driver.pause(t.id)
        except RuntimeFailure as err:
            raise self._runtime_error(err) from err
        t.init.status = S.PAUSED
        self.events.publish(ev.TaskPaused(container_id=t.id))
        return google.Empty()

    def Resume(self, ctx: CallContext, req: taskpb.ResumeRequest) -> google.Empty:
        t = self._task(req.id)
        try:
            t.driver.resume(t.id)
        except RuntimeFailure as err:
            raise self._runtime_error(err) from err
        if t.init.exit is None:
            t.init.status = S.RUNNING
        self.events.publish(ev.TaskResumed(container_id=t.id))
        return google.Empty()

    def Checkpoint(self, ctx: CallContext, req: taskpb.CheckpointTaskRequest) -> google.Empty:
        raise w.TtrpcError(w.UNIMPLEMENTED, "checkpoint is not supported by husk-shim (no CRIU support)")

    def Update(self, ctx: CallContext, req: taskpb.UpdateTaskRequest) -> google.Empty:
        t = self._task(req.id)
        if req.resources is None or not req.resources.value:
            raise w.TtrpcError(w.INVALID_ARGUMENT, "update: resources (OCI LinuxResources JSON) are required")
        import json
        try:
            resources = json.loads(req.resources.value)
        except ValueError as err:
            raise w.TtrpcError(w.INVALID_ARGUMENT, f"update resources: {err}") from err
        try:
            t.driver.update(t.id, resources)
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
        for t in self.tasks.values():
            if t.init is not None and t.init.pid == pid and t.init.exit is None:
                return t.init
            for p in t.execs.values():
                if p.pid == pid and p.exit is None:
                    return p
        return None

    def _exited(self, p: Proc, status: int, when_ns: int) -> None:
        t = self.tasks.get(p.cid)
        if t is None:
            return
        p.io.drain()
        code = exitfile.status_from_wait(status)
        oom = False
        if p is t.init:
            if t.oom is not None:
                t.oom.check()     # the kill may race the eventfd: read the counter once more
            oom = t.oom_seen and code == 128 + signal.SIGKILL
        p.exit = exitfile.ExitRecord(p.pid, code, when_ns, oom)
        p.status = S.STOPPED
        try:
            exitfile.write(t.state_dir, p.exec_id, p.exit)
        except OSError as err:
            log.error("%s: writing exit record: %s", self._name(p), err)
        p.io.exited(code)
        log.info("%s: pid %d exited with status %d%s", self._name(p), p.pid, code, " (OOM killed)" if oom else "")
        if p is t.init:
            # Exec processes cannot outlive the container (the kernel does it for a private pid namespace).
            for e in t.execs.values():
                if e.exit is None and e.pid:
                    try:
                        os.kill(e.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        self.events.publish(ev.TaskExit(container_id=t.id, id=p.exec_id or t.id, pid=p.pid,
                                        exit_status=code, exited_at=ts_from_ns(when_ns),
                                        exit_reason=task_types.ExitReason.OOMKILLED if oom else 0))
        self._wake(p)

    def _on_oom(self, t: Task) -> None:
        t.oom_seen = True
        log.warning("container %s: OOM kill in its cgroup", t.id)
        self.events.publish(ev.TaskOOM(container_id=t.id))

    # --- Delete / Shutdown ---------------------------------------------------------------
    def Delete(self, ctx: CallContext, req: taskpb.DeleteRequest) -> taskpb.DeleteResponse:
        t = self._task(req.id)
        p = self._proc(req.id, req.exec_id)
        if p.exec_id:
            if p.status not in (S.STOPPED, S.CREATED):
                raise w.TtrpcError(w.FAILED_PRECONDITION, f"{self._name(p)} is running; kill it first")
            p.io.close()
            del t.execs[p.exec_id]
            exitfile.remove(t.state_dir, p.exec_id)
            if p.exit is None:
                # Never started: its waiters must not wait forever.
                p.exit = exitfile.ExitRecord(p.pid, 0, time.time_ns())
                p.status = S.STOPPED
                self._wake(p)
            ex = p.exit
            self.events.publish(ev.TaskDelete(container_id=t.id, pid=p.pid, exit_status=ex.exit_status,
                                              exited_at=ts_from_ns(ex.exited_at_ns), id=p.exec_id))
            return taskpb.DeleteResponse(pid=p.pid, exit_status=ex.exit_status, exited_at=ts_from_ns(ex.exited_at_ns))
        if p.status not in (S.STOPPED, S.CREATED):
            raise w.TtrpcError(w.FAILED_PRECONDITION, f"{self._name(p)} is running; kill it first")
        try:
            t.driver.delete(t.id, force=True)
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
        self._close_task(t)
        del self.tasks[t.id]
        exitfile.remove(t.state_dir, "")
        self._remove_task_files(t)
        ex = p.exit
        self.events.publish(ev.TaskDelete(container_id=t.id, pid=p.pid, exit_status=ex.exit_status,
                                          exited_at=ts_from_ns(ex.exited_at_ns)))
        return taskpb.DeleteResponse(pid=p.pid, exit_status=ex.exit_status, exited_at=ts_from_ns(ex.exited_at_ns))

    def _close_task(self, t: Task) -> None:
        for e in list(t.execs.values()):
            e.io.close()
        t.execs.clear()
        if t.init is not None:
            t.init.io.close()
        if t.oom is not None:
            t.oom.close()
            t.oom = None
        if t.crilog is not None:
            t.crilog.close()
            t.crilog = None
        if t.rootfs_mounted:
            from shim.rootfs import unmount_rootfs
            unmount_rootfs(t.rootfs_mounted)
            t.rootfs_mounted = ""

    def Shutdown(self, ctx: CallContext, req: taskpb.ShutdownRequest) -> google.Empty:
        # containerd semantics: a shim with a task left keeps running. `now`: the task `id` (deleted or not)
        # does not hold the shim; the pod's other tasks still do (husk's own shims only).
        left = [cid for cid in self.tasks if not (req.now and cid == req.id)]
        if left:
            return google.Empty()
        ctx.reply(google.Empty())
        self.shutting_down = True
        self.loop.call_later(0, self.on_shutdown)
        return PENDING

    # --- husk.shim.v1.Shim ---------------------------------------------------------------
    def ReopenLog(self, ctx: CallContext, req: huskpb.ReopenLogRequest) -> google.Empty:
        t = self._task(req.id)
        if t.crilog is None:
            raise w.TtrpcError(w.FAILED_PRECONDITION, f"container {req.id!r} has no CRI log file")
        try:
            t.crilog.reopen()
        except OSError as err:
            raise w.TtrpcError(w.UNKNOWN, f"reopen {t.crilog.path}: {err}") from err
        return google.Empty()

    def AttachInfo(self, ctx: CallContext, req: huskpb.AttachInfoRequest) -> huskpb.AttachInfoResponse:
        p = self._proc(req.id, req.exec_id)
        if p.io.attach is None:
            raise w.TtrpcError(w.NOT_FOUND, f"{self._name(p)}: no attach socket")
        return huskpb.AttachInfoResponse(path=p.io.attach.path)

    def cleanup(self) -> None:
        """The shim is exiting: close what is left (tasks left only on Shutdown(now)); a left task's rootfs
        stays mounted (its container may still run)."""
        for t in self.tasks.values():
            t.rootfs_mounted = ""
            self._close_task(t)


_METRICS_TYPE = cgroups_v1.Metrics.FULL_NAME


def _encoded_metrics(cg: Any) -> bytes:
    return cgroup_watch.metrics(cg).encode()
