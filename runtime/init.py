"""Stage 3 of create: the container init. Builds the rootfs, blocks on the start socket, then execs the process.

May: mount inside its own mount namespace, pivot_root, set hostname/sysctls, allocate the console, run the
createContainer/startContainer hooks, drop privileges and execve. Must not: touch cgroups or the state dir
(other than the start socket it was handed), or return to the caller (it always execs or exits).
"""
from __future__ import annotations

import os
import _signal as signal  # the C module: `signal` builds enums on import (~2 ms)
TYPE_CHECKING = False  # `typing` costs ~4 ms (it imports re): annotations only

from runtime import devices, rootfs as rfs, stages
from runtime.errors import SetupError, describe
from runtime.linux import syscalls as sc

if TYPE_CHECKING:
    from runtime.parent import CreateContext
    from runtime.sync import Channel


INIT_NAME = "husk:[2:INIT]"


def run(ctx: "CreateContext", chan: "Channel") -> None:
    from runtime.linux.proctitle import set_title
    set_title(INIT_NAME)   # until the user process is exec'd (runc: "runc:[2:INIT]")
    fifo_w = -1
    try:
        # As pid 1 of its namespace the init only receives signals it handles; runc's init (Go) handles them all,
        # so `kill ID TERM` ends a created container there. Do the same until the user process is exec'd
        # (execve resets handled signals to their defaults).
        for sig in TERMINATING:
            signal.signal(sig, _exit_on_signal)
        os.setsid()
        # nothing of the host may stay open in the container's pid 1 while it waits to be started (a leaked
        # directory fd is a way out through /proc/1/fd or a cwd of /proc/self/fd/N): keep stdio, the preserved
        # fds and our own channels only
        from runtime.process import close_fds
        close_fds(3 + ctx.preserve_fds, keep=(chan.rfd, chan.wfd, ctx.fifo_fd, ctx.console_fd, ctx.listener_fd,
                                                       ctx.idmap_fd))
        _setup(ctx, chan)
        # runc's order: the process's user and capabilities (and a filter loaded without noNewPrivileges) are
        # taken before "ready" and the wait, so that whoever reaches the waiting init (a container given
        # CAP_SYS_PTRACE can ptrace it) finds only the container's credentials in it
        _take_credentials(ctx)
        chan.send("ready", stages.encode(ctx.stages))
        chan.close()
        # blocks until `start` connects to the start socket (runtime/sync.py); the connection closes on execve,
        # which `start` sees as EOF
        from runtime.sync import start_accept
        listen_fd, ctx.fifo_fd = ctx.fifo_fd, -1
        fifo_w = start_accept(listen_fd)
        os.write(fifo_w, b"0")
        _start(ctx, fifo_w)
    except BaseException as e:
        msg = describe(e)
        try:
            if fifo_w >= 0:
                os.write(fifo_w, msg.encode())
            elif chan.wfd >= 0:
                if ctx.stages:
                    chan.send("stages", stages.encode(ctx.stages))   # what ran before the failure
                chan.send("error", msg)
            else:
                os.write(2, f"husk init: {msg}\n".encode())
        finally:
            os._exit(1)
    os._exit(1)


def preload(cfg_raw: dict, timings: "list | None" = None) -> "object | None":
    """Imports every module the later stages need. Called before entering a user namespace (whose root may not
    read the interpreter's files) and before pivot_root/setns(mnt) (after which they are out of reach).
    Returns the seccomp program prepared from the host's cache and libseccomp (None without a profile):
    neither is reachable from inside the container. `timings` gets the "seccomp" stage (runtime/stages.py)."""
    import _socket  # noqa: F401 - the start socket (runtime/sync.py), accepted after pivot_root
    import resource  # noqa: F401
    import select  # noqa: F401
    import stat  # noqa: F401
    from runtime import capabilities, hooks, mountinfo, process, rootfs  # noqa: F401
    from runtime.cgroups import v1  # noqa: F401
    if any(m.get("type") == "cgroup" for m in cfg_raw.get("mounts") or []):
        from runtime import rootfs_cgroup  # noqa: F401
    if (cfg_raw.get("linux") or {}).get("sysctl"):
        from runtime import sysctl  # noqa: F401
    if any(n.get("type") == "network" and not n.get("path") for n in (cfg_raw.get("linux") or {}).get("namespaces") or []):
        from runtime import network  # noqa: F401
    if (cfg_raw.get("process") or {}).get("terminal"):
        from runtime import console  # noqa: F401
    from runtime.config import idmap_wanted
    if idmap_wanted(cfg_raw):
        from runtime import idmap  # noqa: F401 - idmap.receive, which runs inside the user namespace
        import socket  # noqa: F401 - the same
        from runtime import jsonload  # noqa: F401 - the same
    profile = (cfg_raw.get("linux") or {}).get("seccomp")
    if profile:
        t = stages.now()
        from runtime import seccomp
        compiled = seccomp.prepare(profile)
        if timings is not None:
            stages.since(timings, "seccomp", t)
        if compiled.needs_listener:
            from runtime import seccomp_notify  # noqa: F401 - json and socket, out of reach after pivot_root
        return compiled
    return None


TERMINATING = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2,
               signal.SIGALRM)


def _exit_on_signal(sig: int, _frame: object) -> None:
    os._exit(128 + sig)


def _setup(ctx: "CreateContext", chan: "Channel") -> None:
    """Everything before the wait on the start socket."""
    cfg = ctx.cfg
    if ctx.seccomp is None:
        ctx.seccomp = preload(cfg.raw, ctx.stages)
    linux = cfg.linux
    proc = cfg.process
    if cfg.new_ns("network"):
        from runtime.network import loopback_up
        loopback_up()
    t = stages.now()
    idmapped: dict[str, int] = {}
    if ctx.idmap_fd >= 0:  # made by the runtime in the host's user namespace (runtime/idmap.py)
        from runtime import idmap
        idmapped = idmap.receive(ctx.idmap_fd)
        ctx.idmap_fd = -1
    fs = rfs.RootFs(cfg.rootfs, cfg.bundle, userns=cfg.ns("user") is not None, cgroup_path=ctx.cgroup_path,
                    cgroupns=cfg.new_ns("cgroup"), netns_new=cfg.new_ns("network"), ipcns_new=cfg.new_ns("ipc"),
                    idmapped=idmapped)
    mounts = cfg.raw.get("mounts") or []
    fs.prepare_root(linux.get("rootfsPropagation"))
    fs.mount_all(mounts)
    dev_bind = any(os.path.normpath(m["destination"]) == "/dev" and
                   (m.get("type") == "bind" or "bind" in (m.get("options") or []) or
                    "rbind" in (m.get("options") or [])) for m in mounts)
    devices.create_devices(fs, linux.get("devices") or [], dev_is_tmpfs=not dev_bind)
    devices.setup_ptmx(fs)
    fs.make_cwd(proc.get("cwd") or "/")
    stages.since(ctx.stages, "rootfs", t)
    if proc.get("apparmorProfile") and not os.path.isdir("/sys/kernel/security/apparmor"):
        raise SetupError(f"process.apparmorProfile {proc['apparmorProfile']!r} is set but AppArmor is not enabled "
                         f"on this host")
    hooks = cfg.hooks
    if hooks.get("prestart") or hooks.get("createRuntime"):
        chan.send("hooks")
        chan.expect("hooksdone")
    if hooks.get("createContainer"):
        t = stages.now()
        from runtime import hooks as hk
        hk.run("createContainer", hooks["createContainer"], ctx.hook_state(_host_pid(), "created"),
               container_id=ctx.container_id)
        stages.since(ctx.stages, "hooks_container", t)
    ctx.host_pid = _host_pid()
    if ctx.listener_fd >= 0:
        # runc's record for the init: its pid, the state "creating"
        from runtime.seccomp_notify import Handoff
        ctx.handoff = Handoff(ctx.listener_fd, ctx.state(ctx.host_pid, "creating"), ctx.host_pid,
                              ctx.seccomp.listener_metadata)  # type: ignore[union-attr]
    t = stages.now()
    fs.pivot(ctx.no_pivot)
    if cfg.raw.get("hostname"):
        sc.sethostname(cfg.raw["hostname"])
    if cfg.raw.get("domainname"):
        sc.setdomainname(cfg.raw["domainname"])
    if linux.get("sysctl"):
        from runtime import sysctl
        for key, value in linux["sysctl"].items():
            sysctl.write(key, value)
    for p in linux.get("readonlyPaths") or []:
        rfs.readonly_path(p)
    for p in linux.get("maskedPaths") or []:
        rfs.mask_path(p)
    if (cfg.raw.get("root") or {}).get("readonly"):
        rfs.readonly_root()
    if linux.get("rootfsPropagation"):
        rfs.set_root_propagation(linux["rootfsPropagation"])
    stages.since(ctx.stages, "pivot_root", t)
    if proc.get("terminal"):
        _console(ctx, fs, proc)
    elif ctx.console_fd >= 0:
        os.close(ctx.console_fd)
    if proc.get("oomScoreAdj") is not None and cfg.ns("user") is None:  # else set before it (child.py)
        from runtime.process import set_oom_score_adj
        set_oom_score_adj(proc["oomScoreAdj"])
    if proc.get("rlimits"):
        # before "ready", as runc does: a limit the host cannot grant fails create, not start
        from runtime.process import set_rlimits
        set_rlimits(proc["rlimits"])
    if not ctx.no_new_keyring:
        try:
            serial = sc.join_session_keyring(f"_ses.{ctx.container_id}")
        except OSError as e:
            if e.errno not in (1, 13, 38):  # EPERM/EACCES/ENOSYS: keyrings unavailable here, as runc tolerates
                raise
        else:
            # searchable, so that `exec` joins it by name: runc's bits (owner search; with a user namespace
            # "other" search, which leaves an exec'd process, owner to the keyring, a fresh one, as in runc)
            try:
                sc.add_key_perm(serial, sc.KEY_OTH_SEARCH if cfg.ns("user") is not None else sc.KEY_USR_SEARCH)
            except OSError as e:
                raise SetupError(f"session keyring _ses.{ctx.container_id}: {e.strerror}") from None
    from runtime.process import build_env, find_executable
    ctx.env = build_env(proc, ctx.extra_env)
    ctx.exe = find_executable(proc["args"][0], ctx.env, proc.get("cwd") or "/")


def _start(ctx: "CreateContext", fifo_w: int) -> None:
    cfg = ctx.cfg
    if cfg.hooks.get("startContainer"):
        from runtime import hooks as hk
        hk.run("startContainer", cfg.hooks["startContainer"], ctx.hook_state(ctx.host_pid, "created"),
               container_id=ctx.container_id)
    from runtime.process import default_signals, exec_program
    default_signals()
    handoff = ctx.handoff
    exec_program(cfg.process, ctx.exe, ctx.env, seccomp=ctx.seccomp,
                 on_listener=handoff.send if handoff is not None else None)


def _take_credentials(ctx: "CreateContext") -> None:
    from runtime.process import take_credentials
    handoff = ctx.handoff
    take_credentials(ctx.cfg.process, seccomp=ctx.seccomp, preserve_fds=ctx.preserve_fds, rlimits_set=True,
                     personality=ctx.cfg.linux.get("personality"),
                     on_listener=handoff.send if handoff is not None else None)


def _console(ctx: "CreateContext", fs: rfs.RootFs, proc: dict) -> None:
    from runtime import console
    if ctx.console_fd < 0:
        raise SetupError("process.terminal is true but no --console-socket was given")
    master, slave, path = console.open_pty()
    try:
        size = proc.get("consoleSize")
        if size:
            console.set_size(master, size["height"], size["width"])
        fs.rootfs = "/"
        try:
            fs.rootfd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            devices.mount_console(fs, path)
        finally:
            if fs.rootfd >= 0:
                os.close(fs.rootfd)
                fs.rootfd = -1
        console.send_master(ctx.console_fd, master)
    finally:
        os.close(master)
        os.close(ctx.console_fd)
        ctx.console_fd = -1
    console.make_controlling(slave)
    os.close(slave)


def _host_pid() -> int:
    # before pivot_root /proc is still the host's procfs, where "self" names our pid in the host namespace
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return os.getpid()
