"""Stage 2 of create: the intermediate child. Joins (setns) and creates (unshare) the container's namespaces.

May: setns/unshare, ask the parent to write uid/gid maps, write time namespace offsets, fork the init.
Must not: touch the rootfs or cgroups, or outlive the fork of the init (it exits right after reporting its pid).
"""
from __future__ import annotations

import os
TYPE_CHECKING = False  # `typing` costs ~4 ms (it imports re): annotations only

from runtime import stages
from runtime.errors import SetupError, describe
from runtime.linux import syscalls as sc

if TYPE_CHECKING:
    from runtime.parent import CreateContext
    from runtime.sync import Channel

# setns order: user first (it grants the rights for the rest), mount last (it changes what paths mean)
JOIN_ORDER = ("user", "ipc", "uts", "network", "pid", "cgroup", "time", "mount")


def run(ctx: "CreateContext", chan: "Channel", reentered: bool = False) -> None:
    """Never returns: exits 0 after forking the init, 1 after reporting an error to the parent."""
    # comm and /proc/<pid>/cmdline become the stage's name alone: the command line is readable by anyone in the
    # container's pid namespace, and the one inherited (the launcher's `-c` code, --root, --bundle, --log) would
    # show it host paths until the exec
    from runtime.linux.proctitle import set_title
    set_title(STAGE_NAME)
    ctx.stages = []   # this process's own; the runtime's were copied by the fork
    try:
        from runtime import exeguard
        if not exeguard.is_protected():
            # CVE-2019-5736 class: we and the init we fork enter the container; continue from an interpreter the
            # container can never write to (see runtime/exeguard.py)
            if reentered:
                raise SetupError("the runtime's interpreter is still writable after the protected re-exec")
            exeguard.reenter("create", {"ctx": ctx.to_payload(), "chan": (chan.rfd, chan.wfd)},
                             [chan.rfd, chan.wfd, ctx.fifo_fd, ctx.console_fd, ctx.listener_fd, ctx.idmap_fd])
        cfg = ctx.cfg
        seen: set[str] = set()

        def wait_for(verb: str) -> None:
            # "go" (cgroup placed, or with ctx.cgroup_join made) and "mapped" may arrive in either order: the
            # parent places us in the cgroup while we import and join namespaces, so both run at once
            while verb not in seen:
                got, text = chan.recv()
                if got == "error":
                    raise SetupError(text)
                if got == "eof":
                    raise SetupError(f"the runtime exited before sending {verb!r}")
                seen.add(got)

        from runtime import init
        ctx.seccomp = init.preload(cfg.raw, ctx.stages)
        unified_fd = -1
        if ctx.cgroup_join:
            # before any namespace: the cgroup files are the host's, written with the host's credentials; the
            # runtime makes the cgroup while this process starts and imports
            wait_for("go")
            t_cg = stages.now()
            mgr = ctx.cgroup_mgr
            if mgr is None:  # the protected re-exec: the runtime's objects did not come along
                from runtime.cgroups import manager_for
                mgr = manager_for(ctx.cgroup_path)
            mgr.join_self()
            unified = mgr.dir("unified")
            if unified is not None:
                try:
                    unified_fd = os.open(unified, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                except OSError as e:
                    raise SetupError(f"open cgroup {unified}: {e.strerror}") from None
            stages.since(ctx.stages, "cgroup_apply", t_cg)  # the same stage, done here
        t_ns = stages.now()
        userns_new = cfg.new_ns("user")
        # CVE-2019-5736 class: nothing in the container may open /proc/<us>/exe (the host interpreter)
        sc.set_dumpable(False)
        if cfg.ns("user") is not None:
            _before_userns(cfg.process)
        fds = []
        for kind in JOIN_ORDER:
            ns = cfg.ns(kind)
            if ns is not None and ns.path:
                try:
                    fds.append((kind, os.open(ns.path, os.O_RDONLY | os.O_CLOEXEC)))
                except OSError as e:
                    raise OSError(e.errno, f"open namespace {kind} at {ns.path}: {e.strerror}") from None
        if fds and fds[0][0] == "user":
            fds = join_before_userns(fds)
        for kind, fd in fds:
            if kind == "cgroup":
                wait_for("go")  # a cgroup namespace's root is the cgroup we are in when we join or create it
            try:
                sc.setns(fd, sc.NAMESPACES[kind][0])
            except OSError as e:
                ns = cfg.ns(kind)
                raise OSError(e.errno, f"join {kind} namespace {ns.path if ns else ''}: {e.strerror}") from None
            finally:
                os.close(fd)
        user = cfg.ns("user")
        if user is not None and user.path:
            # root of the joined namespace (as runc): our host ids are not mapped there, and what we create in
            # the container's filesystems would fail (EOVERFLOW) or belong to nobody
            os.setresgid(0, 0, 0)
            os.setresuid(0, 0, 0)
        if userns_new:
            sc.unshare(sc.CLONE_NEWUSER)
            # the parent writes our /proc/<pid>/{uid,gid}_map and setgroups: a non-dumpable process's proc files
            # belong to host root, out of an unprivileged runtime's reach. Nothing of the container exists yet.
            sc.set_dumpable(True)
            chan.send("maps")
            wait_for("mapped")
            sc.set_dumpable(False)
            os.setresgid(0, 0, 0)
            os.setresuid(0, 0, 0)
        flags = 0
        for kind in ("mount", "uts", "ipc", "network", "pid", "time"):
            if cfg.new_ns(kind):
                flags |= sc.NAMESPACES[kind][0]
        if flags:
            try:
                sc.unshare(flags)
            except OSError as e:
                raise OSError(e.errno, f"unshare namespaces {flags:#x}: {e.strerror}") from None
        stages.since(ctx.stages, "namespaces", t_ns)
        wait_for("go")  # the init must be forked inside the container's cgroup
        if cfg.new_ns("cgroup"):
            sc.unshare(sc.CLONE_NEWCGROUP)
        offsets = cfg.linux.get("timeOffsets")
        if offsets and cfg.new_ns("time"):
            lines = "".join(f"{clock} {o.get('secs', 0)} {o.get('nanosecs', 0)}\n" for clock, o in offsets.items())
            with open("/proc/self/timens_offsets", "w") as f:
                f.write(lines)
        pid = fork_init(unified_fd)
        if pid == 0:
            ctx.stages = []
            init.run(ctx, chan)  # never returns
        chan.send("pid", f"{pid} {stages.encode(ctx.stages)}")
        os._exit(0)
    except BaseException as e:  # report anything, then exit: this process must never return to the caller
        try:
            if ctx.stages:
                chan.send("stages", stages.encode(ctx.stages))   # what ran before the failure
            chan.send("error", describe(e))
        finally:
            os._exit(1)



def fork_init(unified_fd: int) -> int:
    """Forks the init; with `unified_fd` (a hybrid host's cgroup2 directory of the container, when this process
    joined the v1 ones itself) straight into that cgroup: clone3(CLONE_INTO_CGROUP) needs no write to
    cgroup.procs, which waits for an RCU grace period (2-20 ms here). Where the kernel or a seccomp filter
    does not let clone3 through (syscalls.clone3_usable; ENOSYS, E2BIG: refused before any process exists), a
    plain fork and that write;
    any other failure is an error (it may come after the kernel gave a new pid namespace its pid 1, and that
    namespace then forks nothing more). The init needs none of os.fork's bookkeeping: this process is
    single-threaded and the init only sets up and execs (syscalls.fork_into_cgroup)."""
    if unified_fd < 0:
        return os.fork()
    try:
        pid, placed = sc.fork_placed(unified_fd)
    except OSError as e:
        raise SetupError(f"fork the init into its cgroup2 cgroup: {e.strerror}") from None
    if not placed and pid != 0:
        try:
            fd = os.open("cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=unified_fd)
            try:
                os.write(fd, str(pid).encode())
            finally:
                os.close(fd)
        except OSError as e:
            raise SetupError(f"add the init (pid {pid}) to its cgroup2 cgroup: {e.strerror}") from None
    os.close(unified_fd)
    return pid


def _before_userns(proc: dict) -> None:
    """What needs the host's privileges is set before entering the user namespace, as runc does (the init inherits
    it): lowering oom_score_adj and raising hard rlimits need CAP_SYS_RESOURCE in the host's namespace, and the
    init, in the container's, cannot even open its own /proc files for writing."""
    from runtime.process import set_oom_score_adj, set_rlimits
    if proc.get("oomScoreAdj") is not None:
        set_oom_score_adj(proc["oomScoreAdj"])
    if proc.get("rlimits"):
        set_rlimits(proc["rlimits"])


# Joined before the user namespace when we may: a namespace owned by an ancestor of the joined user namespace (a
# pod's network namespace, made by husk-cri in the host's) is out of reach once we are in it, as runc 1.2 does.
EARLY_JOIN = ("ipc", "uts", "network", "pid", "time")


def join_before_userns(fds: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Joins what it can of EARLY_JOIN now (closing those fds); returns the rest, the user namespace first."""
    rest = []
    for kind, fd in fds:
        if kind in EARLY_JOIN:
            try:
                sc.setns(fd, sc.NAMESPACES[kind][0])
            except OSError:
                rest.append((kind, fd))  # only reachable from inside the user namespace: joined after it
                continue
            os.close(fd)
        else:
            rest.append((kind, fd))
    return rest


def continue_stage(payload: dict) -> None:
    """The protected re-exec continues here (runtime.exeguard.continue_stage); never returns."""
    from runtime.parent import CreateContext
    from runtime.sync import Channel
    ctx = CreateContext.from_payload(payload["ctx"])
    chan = Channel(*payload["chan"])
    for fd in (chan.rfd, chan.wfd, ctx.fifo_fd, ctx.console_fd, ctx.listener_fd, ctx.idmap_fd):
        if fd >= 0:
            os.set_inheritable(fd, False)
    run(ctx, chan, reentered=True)


# What ps and pgrep show of the intermediate stage (runc: "runc:[1:CHILD]"; the init is "husk:[2:INIT]" until
# it execs the user process): not the name of the process that forked it (a shim, "husk-shim").
STAGE_NAME = "husk:[1:CHILD]"
