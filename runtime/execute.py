"""`husk exec`: runs an extra process inside a running container (every namespace and the cgroup joined).

The runtime process forks an intermediate child that becomes non-dumpable, joins the namespaces (user
first, mount last), does every privileged step and takes the process's credentials, then forks the process,
so it is inside the pid namespace (the intermediate itself never is: see _intermediate). Errors before execve
come back over the sync pipe; the pipe closing on execve means success.
"""
from __future__ import annotations

import os
import _signal as signal  # the C module: `signal` builds enums on import (~2 ms)
TYPE_CHECKING = False  # `typing` costs ~4 ms (it imports re): annotations only
if TYPE_CHECKING:
    from typing import Any

from runtime import state as st
from runtime.errors import InvalidState, SetupError, describe
from runtime.linux import syscalls as sc
from runtime.sync import Channel, pair

JOIN_ORDER = ("user", "ipc", "uts", "network", "pid", "cgroup", "time", "mount")


def spawn(root: str, container_id: str, process: dict[str, Any], *, console_socket: str | None,
          pid_file: str | None, detach: bool, preserve_fds: int,
          cgroup: "str | dict[str, str] | None", ignore_paused: bool = False) -> int:
    """Forks the stages that start `process` in the container (lifecycle.exec_process's work without the
    terminal proxy): its pid when `detach`, else its exit code once it is gone. `cgroup`: a sub-cgroup of the
    container's for every controller, or {controller or "": sub path}."""
    from runtime import config
    rec = st.load(root, container_id)
    status = st.status(root, rec)
    if status == "paused" and not ignore_paused:
        raise InvalidState(f"cannot exec in container {container_id!r}: it is paused (use --ignore-paused to "
                           f"override)")
    if status not in ("created", "running", "paused"):
        raise InvalidState(f"cannot exec in container {container_id!r}: it is {status}")
    config.check_process(process)
    process = _with_container_defaults(process, rec.config.get("process") or {})
    preserve_fds, process = _listen_fds(preserve_fds, process)
    if process.get("terminal") and not console_socket:
        raise SetupError("process.terminal is true: --console-socket is required")
    ns_fds = _open_namespaces(rec)
    console_fd = listener_fd = -1
    parent_chan, child_chan = pair()
    try:
        from runtime.parent import notify_listener
        listener = notify_listener((rec.config.get("linux") or {}).get("seccomp"))
        if listener:
            from runtime import seccomp_notify
            listener_fd = seccomp_notify.connect(listener)
        if process.get("terminal"):
            from runtime import console
            console_fd = console.connect(console_socket)  # type: ignore[arg-type]
        join_cgroup = _cgroup_joiner(rec.cgroup_path, cgroup)
        sc.set_child_subreaper(True)  # the exec'd process becomes our child once the intermediate exits
        pid1 = os.fork()
        if pid1 == 0:
            parent_chan.close()
            _intermediate(rec, process, ns_fds, child_chan, console_fd, preserve_fds, listener_fd)
        child_chan.close()
        for fd in ns_fds.values():
            os.close(fd)
        ns_fds = {}
        for fd in (console_fd, listener_fd):
            if fd >= 0:
                os.close(fd)
        console_fd = listener_fd = -1
        pid = 0
        try:
            join_cgroup(pid1)
            parent_chan.send("go")
            pid = int(parent_chan.expect("pid"))
            _, status1 = os.waitpid(pid1, 0)
            verb, text = parent_chan.recv()
            if verb == "error":
                raise SetupError(f"exec in container {container_id!r}: {text}")
            if verb != "eof":
                raise SetupError(f"sync protocol: unexpected {verb!r}")
        except BaseException:
            for p in (pid1, pid):
                if p:
                    try:
                        os.kill(p, signal.SIGKILL)
                        os.waitpid(p, 0)
                    except (ProcessLookupError, ChildProcessError):
                        pass
            raise
    finally:
        parent_chan.close()
        for fd in (*ns_fds.values(), console_fd, listener_fd):
            if fd >= 0:
                os.close(fd)
    if pid_file:
        st.write_pid_file(pid_file, pid)
    if detach:
        return pid
    from runtime.run import FORWARDED, _forward, _wait
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: _forward(pid, s))
    return _wait(pid)


def _with_container_defaults(process: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """As runc: an exec process without its own rlimits, AppArmor profile or oomScoreAdj gets the container's."""
    extra = {k: container[k] for k in ("rlimits", "apparmorProfile", "oomScoreAdj")
             if not process.get(k) and process.get(k) != 0 and container.get(k) is not None}
    return {**process, **extra} if extra else process


def _listen_fds(preserve_fds: int, process: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Socket activation as runc: when LISTEN_PID names us, the LISTEN_FDS fds after stdio go along too."""
    from runtime.parent import activated_fds
    listen = activated_fds()
    if not listen:
        return preserve_fds, process
    env = list(process.get("env") or []) + [f"LISTEN_FDS={listen}", "LISTEN_PID=1"]
    return preserve_fds + listen, {**process, "env": env}


def _cgroup_joiner(base: str, cgroup: "str | dict[str, str] | None") -> "Any":
    """A function that moves a pid into the container's cgroup, or into the sub-cgroup(s) --cgroup names."""
    from runtime.cgroups import manager_for
    from runtime.execflags import join_sub
    subs = {"": cgroup} if isinstance(cgroup, str) else dict(cgroup or {})
    if not subs:
        mgr = manager_for(base)
        if os.geteuid() != 0 and not mgr.exists():
            # a rootless container created without a cgroup (runtime/parent.py): nothing to join
            return lambda pid: None
        return mgr.apply
    if "" in subs:
        return manager_for(join_sub(base, subs[""])).apply
    mgr = manager_for(base)
    paths = {ctrl: join_sub(base, sub) for ctrl, sub in subs.items()}
    apply_split = getattr(mgr, "apply_split", None)
    if apply_split is None:
        raise SetupError(f"--cgroup {','.join(subs)}:...: per-controller sub-cgroups exist only on cgroup v1; "
                         f"give --cgroup PATH without a controller prefix")
    return lambda pid: apply_split(pid, paths)


def _open_namespaces(rec: st.Record) -> dict[str, int]:
    """O_RDONLY fds on the init's namespaces, skipping those we already share (setns into our own user
    namespace fails). The init's start time is checked after opening so a reused pid is never joined."""
    linux = rec.config.get("linux") or {}
    fds: dict[str, int] = {}
    try:
        for ns in linux.get("namespaces") or []:
            kind = ns["type"]
            name = sc.NAMESPACES[kind][1]
            path = f"/proc/{rec.pid}/ns/{name}"
            try:
                if os.stat(path).st_ino == os.stat(f"/proc/self/ns/{name}").st_ino:
                    continue
                fds[kind] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise InvalidState(f"container {rec.id!r} is not running") from None
            except PermissionError:
                if os.geteuid() == 0:
                    raise
                # an unprivileged runtime has no CAP_SYS_PTRACE: until it execs the container's program, the init
                # is the runtime itself, kept non-dumpable (CVE-2019-5736 class), so its namespaces are closed to us
                raise InvalidState(f"cannot exec in container {rec.id!r} before it is started: its init is not "
                                   f"reachable by an unprivileged runtime until then (start it first)") from None
        if not st.init_alive(rec):
            raise InvalidState(f"container {rec.id!r} is not running")
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


def _intermediate(rec: st.Record, process: dict[str, Any], ns_fds: dict[str, int], chan: Channel,
                  console_fd: int, preserve_fds: int, listener_fd: int = -1, reentered: bool = False) -> None:
    """Never returns. Joins the namespaces, does every privileged step, takes the process's credentials, forks
    the process, reports its pid and exits.

    setns(pid) makes only our children members of the container's pid namespace: we stay invisible from inside
    (no /proc entry, nothing to ptrace, even for a container given CAP_SYS_PTRACE) while we hold the host's
    capabilities and fds. The process we fork is visible; it already has the container's credentials and only
    takes its session and terminal, loads seccomp and execs (_process)."""
    try:
        sc.set_dumpable(False)  # CVE-2019-5736 class: the container must not reach /proc/<us>/exe
        from runtime.child import STAGE_NAME
        from runtime.linux.proctitle import set_title
        set_title(STAGE_NAME)  # the process we fork shows it until its exec: no host path on its command line
        from runtime import exeguard
        if not exeguard.is_protected():
            # and what it could reach is an interpreter on a detached read-only mount (runtime/exeguard.py)
            if reentered:
                raise SetupError("the runtime's interpreter is still writable after the protected re-exec")
            exeguard.reenter("exec", {"rec": rec.to_dict(), "process": process, "ns_fds": ns_fds,
                                      "chan": (chan.rfd, chan.wfd), "console_fd": console_fd,
                                      "preserve_fds": preserve_fds, "listener_fd": listener_fd},
                             [chan.rfd, chan.wfd, console_fd, listener_fd, *ns_fds.values()])
        from runtime.init import preload
        from runtime import process as pr
        seccomp = preload({"process": process, "linux": rec.config.get("linux") or {}})
        chan.expect("go")
        if process.get("oomScoreAdj") is not None:
            pr.set_oom_score_adj(process["oomScoreAdj"])  # as runc's nsexec: from the host, before any setns
        if "user" in ns_fds:  # a pod's network namespace is out of reach from inside its user namespace
            from runtime.child import join_before_userns
            ns_fds = dict(join_before_userns(list(ns_fds.items())))
        denied = False
        for kind in JOIN_ORDER:
            if kind == "mount":
                # in the container's mount namespace /proc is the procfs of a pid namespace we are no member of:
                # /proc/self names nothing there. Read now what needs it.
                denied = pr.setgroups_denied()
            fd = ns_fds.get(kind)
            if fd is None:
                continue
            try:
                sc.setns(fd, sc.NAMESPACES[kind][0])
            except OSError as e:
                raise SetupError(f"join the container's {kind} namespace: {e.strerror}") from None
        if "user" in ns_fds:
            os.setresgid(0, 0, 0)
            os.setresuid(0, 0, 0)
        # the process learns its own pid in our (the host's) pid namespace from us: a seccomp agent needs it
        pid_r, pid_w = os.pipe() if listener_fd >= 0 else (-1, -1)
        slave, env, exe, final_caps = _prepare(rec, process, chan, console_fd, preserve_fds, seccomp, denied,
                                               keep=(pid_r, pid_w, listener_fd))
        pid = os.fork()
        if pid == 0:
            handoff = None
            if listener_fd >= 0:
                os.close(pid_w)
                own = int(os.read(pid_r, 32) or b"0")
                os.close(pid_r)
                from runtime.seccomp_notify import Handoff
                state = {"ociVersion": st.OCI_VERSION, "id": rec.id, "status": "running", "pid": rec.pid,
                         "bundle": rec.bundle, "annotations": rec.annotations}
                handoff = Handoff(listener_fd, state, own, seccomp.listener_metadata)  # type: ignore[union-attr]
            _process(process, chan, slave, preserve_fds, seccomp, handoff, exe, env, final_caps)
        if pid_w >= 0:
            os.close(pid_r)
            os.write(pid_w, str(pid).encode())
            os.close(pid_w)
        chan.send("pid", str(pid))
        os._exit(0)
    except BaseException as e:
        try:
            chan.send("error", describe(e))
        finally:
            os._exit(1)


def _prepare(rec: st.Record, process: dict[str, Any], chan: Channel, console_fd: int, preserve_fds: int,
             seccomp: Any, denied: bool, keep: tuple[int, ...]) -> tuple[int, dict[str, str], str, Any]:
    """In the intermediate, inside every namespace but the pid namespace: keyring, console, fds, cwd, rlimits and
    scheduling, then the process's user, capabilities, no_new_privs and umask (all inherited by fork). Returns the
    pty slave (or -1), the environment, the executable and, when seccomp must still be loaded without
    no_new_privs by a process whose capabilities lack CAP_SYS_ADMIN, the final (eff, perm, inh) masks that the
    process sets once the filter is loaded (else None)."""
    from runtime import capabilities, process as pr
    from runtime.config import CAP_NUMBER, known_cap_mask
    if not rec.no_new_keyring:
        # the container's session keyring, not the caller's (runc's setns init)
        try:
            sc.join_session_keyring(f"_ses.{rec.id}")
        except OSError as e:
            if e.errno not in (1, 13, 38):  # EPERM/EACCES/ENOSYS: keyrings unavailable, as at create
                raise
    slave = -1
    if process.get("terminal"):
        from runtime import console
        master, slave, _path = console.open_pty()
        try:
            size = process.get("consoleSize")
            if size:
                console.set_size(master, size["height"], size["width"])
            console.send_master(console_fd, master)
        finally:
            os.close(master)
    if console_fd >= 0:
        os.close(console_fd)
    # nothing of the runtime's or its caller's beyond stdio and --preserve-fds may stay open in here:
    # not even long enough to be named as a cwd through /proc/self/fd (CVE-2024-21626 class)
    pr.close_fds(3 + preserve_fds, keep=(chan.wfd, slave, *keep))
    chan.rfd = -1
    env = pr.build_env(process)
    cwd = process.get("cwd") or "/"
    pr.enter_cwd(cwd)
    arg0 = process["args"][0]
    if arg0.startswith(("/proc/self/", "/proc/thread-self/")):
        exe = arg0  # names the process itself: only the forked one, in the pid namespace, resolves it (execve)
    else:
        exe = pr.find_executable(arg0, env, cwd)
    if process.get("rlimits"):
        pr.set_rlimits(process["rlimits"])
    pr.apply_scheduling(process)
    caps = process.get("capabilities") or {}
    user = process.get("user") or {}
    nnp = bool(process.get("noNewPrivileges"))
    admin = 1 << CAP_NUMBER["CAP_SYS_ADMIN"]
    final = None
    capabilities.drop_bounding(caps)
    pr.switch_user(user, denied)
    if seccomp is not None and not nnp and not known_cap_mask(caps.get("effective") or []) & admin:
        # the kernel demands CAP_SYS_ADMIN to load a filter without no_new_privs: the process keeps that one
        # (effective and permitted only: not in the bounding set, so not past execve) until the filter is loaded
        final = (known_cap_mask(caps.get("effective") or []), known_cap_mask(caps.get("permitted") or []),
                 known_cap_mask(caps.get("inheritable") or []))
        capabilities.apply({**caps, "effective": [*(caps.get("effective") or []), "CAP_SYS_ADMIN"],
                            "permitted": [*(caps.get("permitted") or []), "CAP_SYS_ADMIN"]})
    else:
        capabilities.apply(caps)
    if nnp:
        sc.set_no_new_privs()
    os.umask(user.get("umask", 0o022) if user.get("umask") is not None else 0o022)
    return slave, env, exe, final


def _process(process: dict[str, Any], chan: Channel, slave: int, preserve_fds: int, seccomp: Any, handoff: Any,
             exe: str, env: dict[str, str], final_caps: Any) -> None:
    """The visible stage: a session of its own, the terminal, seccomp (last) and execve. Holds nothing more than
    the process will (but CAP_SYS_ADMIN until the filter is loaded, see _prepare)."""
    try:
        # A session (and process group) of its own, as runc gives every exec'd process: signals meant
        # for it and its children (a timed-out ExecSync kills the group) reach nothing else.
        os.setsid()
        if slave >= 0:
            from runtime import console
            console.make_controlling(slave)
            os.close(slave)
        first = 3 + preserve_fds
        sc.close_range(first, 0xFFFFFFFF, sc.CLOSE_RANGE_CLOEXEC)
        # stdio and the preserved fds must survive execve even if the caller opened them close-on-exec
        for fd in range(first):
            try:
                os.set_inheritable(fd, True)
            except OSError:
                pass
        from runtime.process import default_signals, exec_program
        default_signals()
        on_listener = handoff.send if handoff is not None else None
        if seccomp is not None and not process.get("noNewPrivileges"):
            from runtime import seccomp as seccomp_mod
            seccomp_mod.install(seccomp, False, on_listener=on_listener)
            if final_caps is not None:
                sc.capset(*final_caps)
        if process.get("apparmorProfile"):
            from runtime.process import set_apparmor
            set_apparmor(process["apparmorProfile"])
        exec_program(process, exe, env, seccomp=seccomp, on_listener=on_listener)
    except BaseException as e:
        try:
            chan.send("error", describe(e))
        finally:
            os._exit(1)
    os._exit(1)


def continue_stage(payload: dict[str, Any]) -> None:
    """The protected re-exec continues here (runtime.exeguard.continue_stage); never returns."""
    chan = Channel(*payload["chan"])
    ns_fds = payload["ns_fds"]
    for fd in (chan.rfd, chan.wfd, payload["console_fd"], payload["listener_fd"], *ns_fds.values()):
        if fd >= 0:
            os.set_inheritable(fd, False)
    _intermediate(st.Record.from_dict(payload["rec"]), payload["process"], ns_fds, chan, payload["console_fd"],
                  payload["preserve_fds"], payload["listener_fd"], reentered=True)
