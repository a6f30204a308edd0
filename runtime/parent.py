"""Stage 1 of create: the runtime process. Owns the state dir, the cgroup, the uid/gid maps and the
prestart/createRuntime hooks; forks the intermediate child (child.py), which forks the init (init.py).

Sync protocol (runtime/sync.py), child -> parent: "maps" (write my uid/gid maps), "pid N" (the init's pid),
"hooks" (run prestart+createRuntime now), "ready" (init is about to block on the start socket), "error MSG".
"pid" and "ready" carry the sender's stage timings after the value, and "stages T" precedes an "error" (stages.py).
Parent -> child: "go" (you are in the cgroup; with ctx.cgroup_join the child joins it itself), "mapped",
"hooksdone", "error MSG".
Everything created is registered in an ExitStack at once, so a failure part-way leaves nothing behind.
"""
from __future__ import annotations

import os
import _signal as signal  # the C module: `signal` builds enums on import (~2 ms)
TYPE_CHECKING = False  # `typing` costs ~4 ms (it imports re): annotations only
if TYPE_CHECKING:
    from typing import Any

from runtime import logutil, stages, state as st
from runtime.config import Config
from runtime.errors import SetupError, describe
from runtime.linux import syscalls as sc
from runtime.sync import Channel, pair, start_listener

class CreateContext:
    """What the forked stages need; they inherit it through fork, nothing is serialised.
    (A plain class: `dataclasses` imports inspect, which costs create tens of milliseconds.)"""

    def __init__(self, cfg: Config, container_id: str, state_dir: str, fifo_path: str, cgroup_path: str,
                 fifo_fd: int = -1, console_fd: int = -1, no_pivot: bool = False, no_new_keyring: bool = False,
                 preserve_fds: int = 0, extra_env: dict[str, str] | None = None) -> None:
        self.cfg = cfg
        self.container_id = container_id
        self.state_dir = state_dir
        self.fifo_path = fifo_path
        self.cgroup_path = cgroup_path
        self.fifo_fd = fifo_fd
        self.console_fd = console_fd
        self.no_pivot = no_pivot
        self.no_new_keyring = no_new_keyring
        self.preserve_fds = preserve_fds
        self.extra_env = extra_env or {}
        self.host_pid = 0                    # the init's pid in the runtime's pid namespace
        self.env: dict[str, str] = {}        # the process environment, computed before the fifo
        self.exe = ""                        # args[0] resolved in the container
        self.seccomp: object | None = None   # runtime.seccomp.CompiledFilter, prepared before pivot_root
        self.listener_fd = -1                # connected to linux.seccomp.listenerPath (SCMP_ACT_NOTIFY)
        self.handoff: Any = None             # runtime.seccomp_notify.Handoff over listener_fd, in the init
        self.idmap_fd = -1                   # the init's end of the socket the idmapped mounts come on
        self.idmap_parent_fd = -1            # the runtime's end (runtime/idmap.py)
        self.stages: list = []               # (name, start ns, duration ns) of this process's stages (stages.py)
        # the intermediate child moves itself into the v1 cgroups (V1Manager.join_self) and forks the init into
        # a hybrid host's cgroup2 one (child.fork_init): no write to cgroup.procs, which waits for an RCU grace
        # period; else the runtime applies the intermediate child's pid everywhere before "go"
        self.cgroup_join = False
        self.cgroup_mgr: Any = None          # the runtime's manager, inherited through fork (not re-exec)
        self.cgroup_placed = False           # v2: the child was cloned into its cgroup (parent._fork_child)

    def to_payload(self) -> dict[str, Any]:
        """Plain values for the protected re-exec of the intermediate child (runtime.exeguard), which has not
        prepared anything yet: host_pid, env, exe and seccomp are still unset there."""
        return {"raw": self.cfg.raw, "bundle": self.cfg.bundle, "rootfs": self.cfg.rootfs,
                "namespaces": [(n.type, n.path) for n in self.cfg.namespaces], "id": self.container_id,
                "state_dir": self.state_dir, "fifo_path": self.fifo_path, "cgroup_path": self.cgroup_path,
                "fifo_fd": self.fifo_fd, "console_fd": self.console_fd, "no_pivot": self.no_pivot,
                "no_new_keyring": self.no_new_keyring, "preserve_fds": self.preserve_fds,
                "extra_env": self.extra_env, "listener_fd": self.listener_fd, "idmap_fd": self.idmap_fd,
                "cgroup_join": self.cgroup_join}

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> "CreateContext":
        from runtime.config import Namespace
        cfg = Config(p["raw"], p["bundle"], p["rootfs"])
        cfg.namespaces = [Namespace(t, path) for t, path in p["namespaces"]]
        ctx = cls(cfg=cfg, container_id=p["id"], state_dir=p["state_dir"], fifo_path=p["fifo_path"],
                  cgroup_path=p["cgroup_path"], fifo_fd=p["fifo_fd"], console_fd=p["console_fd"],
                  no_pivot=p["no_pivot"], no_new_keyring=p["no_new_keyring"], preserve_fds=p["preserve_fds"],
                  extra_env=p["extra_env"])
        ctx.listener_fd = p["listener_fd"]
        ctx.idmap_fd = p.get("idmap_fd", -1)
        ctx.cgroup_join = p.get("cgroup_join", False)
        return ctx

    def state(self, pid: int, status: str) -> dict[str, Any]:
        """The OCI state record (what hooks read on stdin and a seccomp agent receives)."""
        return {"ociVersion": st.OCI_VERSION, "id": self.container_id, "status": status, "pid": pid,
                "bundle": self.cfg.bundle, "annotations": self.cfg.raw.get("annotations") or {}}

    def hook_state(self, pid: int, status: str) -> str:
        return st.dumps_json(self.state(pid, status))


def activated_fds() -> int:
    """How many socket-activation fds (after stdio) were passed to this process: LISTEN_FDS, but only when
    LISTEN_PID names us, as systemd's protocol (and runc) require; a leftover from an ancestor is ignored."""
    listen, pid = os.environ.get("LISTEN_FDS", ""), os.environ.get("LISTEN_PID", "")
    if listen.isdigit() and int(listen) > 0 and pid == str(os.getpid()):
        return int(listen)
    return 0


def create(root: str, container_id: str, cfg: Config, *, console_socket: str | None, pid_file: str | None,
           no_pivot: bool, no_new_keyring: bool, preserve_fds: int, systemd_cgroup: bool = False) -> int:
    from runtime import cgroups
    if cfg.ns("mount") is None:
        raise SetupError("linux.namespaces: husk needs a mount namespace (new or joined by path) to set up "
                         "the rootfs; a container without one would change the host's mounts")
    if cfg.process.get("terminal") and not console_socket:
        raise SetupError("process.terminal is true: --console-socket is required")
    unit = None
    if systemd_cgroup:
        from runtime.cgroups import systemd
        unit = systemd.parse_path(cfg.linux.get("cgroupsPath"), container_id)
        systemd.check_host()
        if os.geteuid() != 0:
            raise SetupError("--systemd-cgroup: husk's systemd driver talks to the system instance (root only); "
                             "a rootless container uses the cgroupfs driver")
        cgroup_path = unit.path
    else:
        cgroup_path = cgroups.resolve_path(cfg.linux.get("cgroupsPath"), container_id)
    extra_env: dict[str, str] = {}
    listen = activated_fds()
    if listen:
        # socket activation: keep the activated fds right after stdio, as runc does
        preserve_fds += listen
        extra_env = {"LISTEN_FDS": str(listen), "LISTEN_PID": "1"}
    timings: list = []   # every stage's timing, written to <bundle>/.husk-stages if the caller asked (stages.py)
    try:
        return _create(root, container_id, cfg, console_socket=console_socket, pid_file=pid_file,
                       no_pivot=no_pivot, no_new_keyring=no_new_keyring, preserve_fds=preserve_fds, unit=unit,
                       cgroup_path=cgroup_path, extra_env=extra_env, timings=timings)
    finally:
        if timings:
            stages.write(cfg.bundle, timings)


def _create(root: str, container_id: str, cfg: Config, *, console_socket: str | None, pid_file: str | None,
            no_pivot: bool, no_new_keyring: bool, preserve_fds: int, unit: Any, cgroup_path: str,
            extra_env: dict[str, str], timings: list) -> int:
    from runtime import cgroups
    join = False   # the intermediate child joins the v1 cgroup itself (ctx.cgroup_join)
    with Undo() as undo:
        state_dir, lock = st.create_dir(root, container_id)
        undo.callback(_rmtree, state_dir)
        undo.callback(lock.release)
        fifo = os.path.join(state_dir, st.FIFO)
        # the start socket, listening here and inherited by the init, which accepts `start`'s connection (the
        # init may run as a uid that cannot reach the state dir); not a fifo: see runtime/sync.py
        fifo_fd = start_listener(fifo)
        undo.callback(_close, fifo_fd)
        mgr: Any = None
        limits: Any = None   # v2's prepared limits, written after the clone (V2Manager.prepare)
        t = stages.now()
        if unit is not None:
            from runtime.cgroups import systemd
            # the scope is started by apply(pid) below (systemd places the pid); until then set() only checks
            mgr = systemd.SystemdManager(unit, container_id, new=True)
            undo.callback(mgr.close)
            undo.callback(_destroy_cgroup, mgr)   # stops the unit only if this create started it
            mgr.set(cgroup_resources(cfg))
        elif os.geteuid() == 0 or cfg.linux.get("resources"):
            mgr = cgroups.manager_for(cgroup_path)
            existed = mgr.exists()
            if not existed:
                undo.callback(_destroy_cgroup, mgr)   # before procs.kill_all's: runs after it
            # a cgroup namespace's root is the cgroup the child is in when it makes or joins it, so that case (and
            # v2, systemd) keeps the runtime's apply before "go"; so do a user namespace (the child is not host
            # root when it forks the init) and an unprivileged runtime. Otherwise (V1Manager.join_self,
            # child.fork_init) the cgroup is made after the fork, while the child starts up.
            join = (getattr(mgr, "version", 0) == 1 and os.geteuid() == 0 and cfg.ns("cgroup") is None
                    and cfg.ns("user") is None)
            if not join:
                mgr.create()
                if getattr(mgr, "version", 0) == 2 and sc.clone3_usable():
                    # v2: the child is cloned straight into the cgroup (_fork_child) and the limits written
                    # while it starts up, before "go"; checked now, before anything is connected or forked
                    limits = mgr.prepare(cgroup_resources(cfg))
                else:
                    mgr.set(cgroup_resources(cfg))
        else:
            # as runc: an unprivileged runtime that is asked for no resource limits runs the container in its
            # caller's cgroup rather than failing on cgroup directories it may not create
            logutil.debug("rootless: no cgroup for container %s", container_id, container_id=container_id)
        if mgr is not None and not join:
            stages.since(timings, "cgroups", t)
        console_fd = -1
        if console_socket and cfg.process.get("terminal"):
            from runtime import console
            console_fd = console.connect(console_socket)
            undo.callback(_close, console_fd)
        ctx = CreateContext(cfg=cfg, container_id=container_id, state_dir=state_dir, fifo_path=fifo,
                            cgroup_path=cgroup_path, fifo_fd=fifo_fd, console_fd=console_fd, no_pivot=no_pivot,
                            no_new_keyring=no_new_keyring, preserve_fds=preserve_fds, extra_env=extra_env)
        ctx.stages = timings
        ctx.cgroup_join = join
        ctx.cgroup_mgr = mgr
        listener = notify_listener(cfg.linux.get("seccomp"))
        if listener:
            # connected now, while listenerPath is reachable; the init sends on it once its filter is loaded
            from runtime import seccomp_notify
            ctx.listener_fd = seccomp_notify.connect(listener)
            undo.callback(_close, ctx.listener_fd)
        parent_chan, child_chan = pair()
        undo.callback(parent_chan.close)
        from runtime.config import idmap_wanted
        if idmap_wanted(cfg.raw):
            from runtime import idmap
            ctx.idmap_parent_fd, ctx.idmap_fd = idmap.socketpair()
            undo.callback(_close, ctx.idmap_parent_fd)
            undo.callback(_close, ctx.idmap_fd)
        # the init becomes our child when the intermediate exits, so a failed create can kill and reap it;
        # once we exit it moves on to the next subreaper up (the shim) or to pid 1
        sc.set_child_subreaper(True)
        pid1, ctx.cgroup_placed = _fork_child(mgr if limits is not None else None, container_id)
        if pid1 == 0:
            # The child never returns into this function: unwinding would run the caller's Undo (removing the state
            # dir and cgroup the parent still owns) and then go on as a second copy of the caller.
            try:
                parent_chan.close()
                if ctx.idmap_parent_fd >= 0:
                    os.close(ctx.idmap_parent_fd)
                lock.release()  # a forked copy of the lock fd would keep the state dir locked for the container's life
                from runtime import child
                child.run(ctx, child_chan)  # never returns
            except BaseException as e:
                try:
                    child_chan.send("error", f"the intermediate process failed: {describe(e)}")
                except OSError:
                    pass
            finally:
                os._exit(1)
        child_chan.close()
        if ctx.idmap_fd >= 0:
            os.close(ctx.idmap_fd)
            ctx.idmap_fd = -1
        procs = _Procs(pid1, mgr)
        undo.callback(procs.kill_all)
        if join:
            t = stages.now()
            mgr.create()
            mgr.set(cgroup_resources(cfg))
            stages.since(timings, "cgroups", t)
        elif limits is not None:
            t = stages.now()
            mgr.write(limits)
            stages.since(timings, "cgroup_limits", t)
        init_pid = _drive(ctx, mgr, parent_chan, pid1, procs)
        rec = st.Record(id=container_id, pid=init_pid, pid_start=_start_time(init_pid), bundle=cfg.bundle,
                        rootfs=cfg.rootfs, created=st.now_rfc3339(), cgroup_path=cgroup_path, config=cfg.raw,
                        annotations=dict(cfg.raw.get("annotations") or {}), no_new_keyring=no_new_keyring)
        if unit is not None:
            rec.systemd_unit = unit.name
        elif mgr is not None and getattr(mgr, "version", 0) == 1:   # the hierarchies found, for the other verbs
            rec.cgroup_hier = dict(mgr.hier)
        elif mgr is not None and getattr(mgr, "version", 0) == 2:   # likewise the cgroup2 mount
            rec.cgroup2_mount = mgr.mountpoint
        st.save(state_dir, rec)
        if pid_file:
            st.write_pid_file(pid_file, init_pid)
        if console_fd >= 0:
            os.close(console_fd)
        if ctx.listener_fd >= 0:
            os.close(ctx.listener_fd)
        os.close(fifo_fd)
        if ctx.idmap_parent_fd >= 0:
            os.close(ctx.idmap_parent_fd)
        parent_chan.close()
        lock.release()
        undo.pop_all()
        if unit is not None:
            mgr.close()
    logutil.debug("created container %s, init pid %d", container_id, init_pid, container_id=container_id)
    return init_pid


def notify_listener(profile: dict[str, Any] | None) -> str | None:
    """linux.seccomp.listenerPath when the profile has a SCMP_ACT_NOTIFY rule (else None)."""
    if not profile or not profile.get("listenerPath"):
        return None
    if any(r.get("action") == "SCMP_ACT_NOTIFY" for r in profile.get("syscalls") or []):
        return str(profile["listenerPath"])
    return None


def cgroup_resources(cfg: Config) -> dict[str, Any]:
    """linux.resources with the device rules completed: the config's rules in order, then the defaults every
    container needs and an allow rule for each linux.devices entry (deny-all comes first in the managers)."""
    from runtime.config import DEFAULT_DEVICE_RULES
    resources = dict(cfg.linux.get("resources") or {})
    dev_rules = [{"allow": True, "type": "c" if d["type"] == "u" else d["type"], "major": d.get("major"),
                  "minor": d.get("minor"), "access": "rwm"}
                 for d in cfg.linux.get("devices") or [] if d["type"] in "cbu"]
    resources["devices"] = list(resources.get("devices") or []) + DEFAULT_DEVICE_RULES + dev_rules
    return resources


class Undo:
    """A small ExitStack (contextlib costs ~5 ms to import): callbacks run in reverse order on failure."""

    def __init__(self) -> None:
        self._callbacks: list[tuple[Any, tuple[Any, ...]]] = []

    def callback(self, fn: Any, *args: Any) -> None:
        self._callbacks.append((fn, args))

    def pop_all(self) -> None:
        self._callbacks = []

    def __enter__(self) -> "Undo":
        return self

    def __exit__(self, *exc: object) -> None:
        while self._callbacks:
            fn, args = self._callbacks.pop()
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - one failed undo must not stop the others
                logutil.warning("cleanup step %s failed: %s", getattr(fn, "__name__", fn), e)


def _fork_child(mgr: Any, container_id: str) -> tuple[int, bool]:
    """Forks the intermediate child; with `mgr` (a cgroup v2 manager whose cgroup exists) straight into its
    cgroup by clone3(CLONE_INTO_CGROUP): no write to cgroup.procs, which waits for an RCU grace period (11-14 ms
    measured on a v2 host). Returns (pid as os.fork's, whether the child was placed). A cgroup that cannot be
    opened or a refused clone3 (which forks nothing) falls back to a plain fork, placed by `mgr.apply` later.
    The child skips os.fork's at-fork handlers (syscalls.fork_into_cgroup): this process is single-threaded and
    the child only sets up namespaces, forks the init (os.fork, which does them) and exits."""
    if mgr is None:
        return os.fork(), False
    try:
        fd = os.open(mgr.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        logutil.debug("open cgroup %s: %s: forking, then placing the child", mgr.dir, describe(e),
                      container_id=container_id)
        return os.fork(), False
    try:
        pid, placed = sc.fork_placed(fd, any_refusal=True)   # no pid namespace is unshared in this process
    finally:
        os.close(fd)
    if pid and not placed:
        logutil.debug("clone3 into cgroup %s refused: forked, placing the child", mgr.dir, container_id=container_id)
    return pid, placed


class _Procs:
    """The processes a failed create must kill and reap: the intermediate child and, once known, the init."""

    def __init__(self, pid1: int, mgr: Any) -> None:
        self.pid1: int | None = pid1
        self.init: int | None = None
        self.mgr = mgr

    def reap_pid1(self) -> None:
        if self.pid1 is not None:
            _, status = os.waitpid(self.pid1, 0)
            self.pid1 = None
            if os.waitstatus_to_exitcode(status) != 0:
                raise SetupError(f"intermediate process failed (status {os.waitstatus_to_exitcode(status)})")

    def kill_all(self) -> None:
        for pid in (self.pid1, self.init):
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        # anything else in the cgroup (an init whose pid never reached us, its children): kill, then reap what
        # was reparented to us (we are a subreaper), so that the cgroup can be removed
        try:
            if self.mgr is None or not self.mgr.exists():
                return
            self.mgr.kill_all(signal.SIGKILL)
        except (OSError, SetupError):
            return
        import time
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass
            except ChildProcessError:
                pass
            if not self.mgr.pids():
                return
            time.sleep(0.005)


def _drive(ctx: CreateContext, mgr: Any, chan: Channel, pid1: int, procs: _Procs) -> int:
    """Runs the parent's side of the sync protocol; returns the init's pid once it reports ready."""
    try:
        return _protocol(ctx, mgr, chan, pid1, procs)
    except BrokenPipeError:
        # every reader is gone: what the child or the init said before it exited is the reason, if anything
        raise SetupError(_last_error(chan) or "the container init exited during setup") from None


def _last_error(chan: Channel) -> str:
    """The text of an "error" message still unread on `chan`, without waiting for more."""
    os.set_blocking(chan.rfd, False)
    try:
        while True:
            verb, text = chan.recv()
            if verb == "error":
                return text
            if verb == "eof":
                return ""
    except OSError:           # BlockingIOError: nothing more was written
        return ""


def _protocol(ctx: CreateContext, mgr: Any, chan: Channel, pid1: int, procs: _Procs) -> int:
    if mgr is not None and not ctx.cgroup_join and not ctx.cgroup_placed:
        t = stages.now()
        mgr.apply(pid1)
        stages.since(ctx.stages, "cgroup_apply", t)
    if ctx.idmap_parent_fd >= 0 and not ctx.cfg.new_ns("user"):
        user = ctx.cfg.ns("user")
        _send_idmapped(ctx, chan, user.path if user is not None else None)
    chan.send("go")
    init_pid = 0
    held: list[tuple[str, str]] = []
    while True:
        if held and init_pid:
            verb, text = held.pop(0)
        else:
            verb, text = chan.recv()
        if verb in ("hooks", "ready") and not init_pid:
            # the init shares the pipe with the intermediate child and may be quicker than its "pid" message
            held.append((verb, text))
            continue
        if verb == "maps":
            try:
                _write_id_maps(pid1, ctx.cfg)
            except OSError as e:
                chan.send("error", describe(e))
                raise SetupError(f"write uid/gid maps: {describe(e)}") from None
            if ctx.idmap_parent_fd >= 0:
                _send_idmapped(ctx, chan, f"/proc/{pid1}/ns/user")
            chan.send("mapped")
        elif verb == "pid":
            pid_text, _, timed = text.partition(" ")   # "N" and the child's stage timings
            init_pid = int(pid_text)
            ctx.stages.extend(stages.decode(timed))
            procs.init = init_pid
            procs.reap_pid1()
        elif verb == "hooks":
            t = stages.now()
            try:
                _create_hooks(ctx, init_pid)
                stages.since(ctx.stages, "hooks", t)
            except SetupError as e:
                chan.send("error", str(e))
                raise
            chan.send("hooksdone")
        elif verb == "ready":
            ctx.stages.extend(stages.decode(text))   # the init's stage timings
            return init_pid
        elif verb == "stages":
            ctx.stages.extend(stages.decode(text))   # a failing child's or init's timings, before its "error"
        elif verb == "error":
            raise SetupError(text)
        elif verb == "eof":
            raise SetupError("the container init exited during setup")
        else:
            raise SetupError(f"sync protocol: unexpected message {verb!r}")


def _send_idmapped(ctx: CreateContext, chan: Channel, userns_path: str | None) -> None:
    """Makes the idmapped mounts (runtime/idmap.py) and sends them to the init, which attaches them."""
    from runtime import idmap
    try:
        fds = idmap.prepare(ctx.cfg.raw, ctx.cfg.bundle, ctx.cfg.rootfs, userns_path)
    except SetupError as e:
        idmap.send_error(ctx.idmap_parent_fd, str(e))
        chan.send("error", str(e))
        raise
    try:
        idmap.send(ctx.idmap_parent_fd, fds)
    finally:
        for fd in fds.values():
            os.close(fd)


def _create_hooks(ctx: CreateContext, init_pid: int) -> None:
    from runtime import hooks as hk
    state_json = ctx.hook_state(init_pid, "created")
    for kind in ("prestart", "createRuntime"):
        if ctx.cfg.hooks.get(kind):
            hk.run(kind, ctx.cfg.hooks[kind], state_json, container_id=ctx.container_id)


def _write_id_maps(pid: int, cfg: Config) -> None:
    if os.geteuid() != 0:
        # an unprivileged writer may map its own ids only, and a gid_map only once setgroups(2) is denied in the
        # namespace (else the container could drop the writer's supplementary groups: negative-permission files)
        with open(f"/proc/{pid}/setgroups", "w") as f:
            f.write("deny")
    for kind, key in (("uid_map", "uidMappings"), ("gid_map", "gidMappings")):
        lines = "".join(f"{m['containerID']} {m['hostID']} {m['size']}\n" for m in cfg.linux.get(key) or [])
        with open(f"/proc/{pid}/{kind}", "w") as f:
            f.write(lines)


def _start_time(pid: int) -> int:
    s = st.proc_stat(pid)
    if s is None:
        raise SetupError(f"the container init (pid {pid}) is gone")
    return s[1]


def _rmtree(path: str) -> None:
    st.remove_dir(path)


def _destroy_cgroup(mgr: Any) -> None:
    try:
        mgr.destroy()
    except SetupError as e:
        logutil.warning("cleanup: %s", e)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
