"""The runtime's library API: create, start, state, kill, delete, exec, pause, resume, list (plain values in/out).

The CLI only parses flags and calls these; the shim's fast path forks and calls them directly. Spec state
transitions are enforced here. Heavy modules are imported inside the functions that need them.
"""
from __future__ import annotations

import os

from runtime import logutil, state as st
from runtime.errors import InvalidState, SetupError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

SIGKILL = 9  # not signal.SIGKILL: the signal module builds enums on import (~4 ms on every verb)


def create(root: str, container_id: str, bundle: str, *, console_socket: str | None = None,
           pid_file: str | None = None, no_pivot: bool = False, no_new_keyring: bool = False,
           preserve_fds: int = 0, systemd_cgroup: bool = False) -> int:
    """Sets up the container and returns the init's host pid; the init stays blocked until start().
    `systemd_cgroup`: the systemd cgroup driver (linux.cgroupsPath is "slice:prefix:name"; runc's
    --systemd-cgroup), else the cgroupfs driver.

    The calling process becomes a child subreaper (so a failed create can reap what it started); call it in a
    process that exits afterwards (the CLI, or a fork of the shim): the init then moves to the next subreaper
    up. The container's stdio is the caller's fds 0/1/2 (and 3.. with preserve_fds)."""
    from runtime import config, parent
    st.validate_id(container_id)
    bundle = os.path.abspath(bundle)
    cfg = config.load(bundle)
    if os.path.exists(os.path.join(root, container_id)):
        from runtime.errors import ContainerExists
        raise ContainerExists(container_id)
    return parent.create(root, container_id, cfg, console_socket=console_socket, pid_file=pid_file,
                         no_pivot=no_pivot, no_new_keyring=no_new_keyring, preserve_fds=preserve_fds,
                         systemd_cgroup=systemd_cgroup)


def start(root: str, container_id: str) -> None:
    """Releases the init blocked on the start socket (runtime/sync.py); returns once the user process has been
    exec'd."""
    with st.Lock(st.container_dir(root, container_id)):
        rec = st.load(root, container_id)
        status = st.status(root, rec)
        if status != "created":
            raise InvalidState(f"cannot start container {container_id!r}: it is {status}, "
                               f"only a created container can be started")
        sock = os.path.join(root, container_id, st.FIFO)
        legacy = os.path.join(root, container_id, st.LEGACY_FIFO)
        if not os.path.exists(sock) and os.path.exists(legacy):
            msg = _release(legacy, rec, opener=_open_legacy_fifo)   # created by an older husk
            sock = legacy
        else:
            msg = _release(sock, rec)
        try:
            os.unlink(sock)
        except FileNotFoundError:
            pass
        if msg is not None:
            raise SetupError(f"start container {container_id!r}: {msg}")
        hooks = (rec.config.get("hooks") or {}).get("poststart")
        if hooks:
            from runtime import hooks as hk
            state_json = st.dumps_json(_hook_state(rec, "running"))
            try:
                hk.run("poststart", hooks, state_json, container_id=container_id)
            except SetupError:
                # runtime-spec 1.2+: a failed poststart hook is an error and the container is stopped
                _kill_container(rec, SIGKILL)
                raise


def _open_legacy_fifo(path: str) -> int:
    """An older husk's init blocks opening exec.fifo for writing: opening it for reading releases it."""
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)


def _release(sock: str, rec: st.Record, opener: Callable[[str], int] | None = None) -> str | None:
    """Connects to the start socket (unblocking the init) and reads until the init execs (EOF); `opener`
    reaches another kind of start point (an older husk's fifo). Returns None on success, else the init's
    error message."""
    import select
    from runtime.sync import start_connect
    opener = opener or start_connect
    # The pidfd first: until we connect the init is blocked, so it cannot have exited and been
    # reaped yet. (Opened after connecting, a short-lived program could run, exit and be reaped by the
    # subreaper before pidfd_open, and a successful start would be reported as "init is gone".)
    try:
        pidfd = os.pidfd_open(rec.pid)  # os's, not ctypes': `start` then needs no ctypes import
    except OSError:
        return "the container init is gone"
    if not st.init_alive(rec):
        os.close(pidfd)
        return "the container init is gone"
    try:
        fd = opener(sock)
    except (ConnectionRefusedError, FileNotFoundError):
        os.close(pidfd)
        return "the container init is gone"
    except BaseException:
        os.close(pidfd)
        raise
    os.set_blocking(fd, False)
    try:
        try:
            data = b""
            init_gone = False
            while True:
                ready, _, _ = select.select([fd, pidfd], [], [])
                if fd in ready:
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        chunk = None
                    except ConnectionResetError:
                        chunk = b""  # the init died with our connection still queued on its socket
                    if chunk == b"":
                        break
                    if chunk:
                        data += chunk
                        continue
                if pidfd in ready:
                    if init_gone:
                        break
                    init_gone = True  # read once more: it may have written its error before exiting
                    os.set_blocking(fd, False)
        finally:
            os.close(pidfd)
    finally:
        os.close(fd)
    if data[:1] != b"0":
        return "the container init exited before the process started"
    if len(data) > 1:
        return data[1:].decode(errors="replace")
    return None


def state(root: str, container_id: str) -> dict[str, Any]:
    rec = st.load(root, container_id)
    return st.oci_state(root, rec)


# runc's exact words: containerd's shim matches "container not running" to report "process already finished"
NOT_RUNNING = "container not running"


def kill(root: str, container_id: str, sig: int, all: bool = False) -> None:
    rec = st.load(root, container_id)
    if all:
        # as runc: every process left in the cgroup, whatever the init's state (containerd sends
        # `kill --all` to stopped containers and expects success)
        mgr = st.cgroup_manager(rec)
        if mgr.exists():
            mgr.kill_all(sig)
        return
    if st.status(root, rec) == "stopped":
        raise InvalidState(NOT_RUNNING)
    _signal_init(rec, sig)


def _signal_init(rec: st.Record, sig: int) -> None:
    import _signal  # the C module: pidfd_send_signal without building the signal enums
    try:
        pidfd = os.pidfd_open(rec.pid)
    except ProcessLookupError:
        raise InvalidState(NOT_RUNNING) from None
    try:
        # the pidfd pins the process: check it is still our init (not a reused pid) before signalling
        if not st.init_alive(rec):
            raise InvalidState(NOT_RUNNING)
        _signal.pidfd_send_signal(pidfd, sig)
    finally:
        os.close(pidfd)


def _kill_container(rec: st.Record, sig: int) -> None:
    mgr = st.cgroup_manager(rec)
    try:
        if mgr.exists():
            mgr.kill_all(sig)
    except SetupError as e:
        logutil.warning("kill %s: %s", rec.id, e, container_id=rec.id)
    try:
        _signal_init(rec, sig)
    except (InvalidState, OSError):
        pass


def delete(root: str, container_id: str, force: bool = False) -> None:
    sdir = st.container_dir(root, container_id)
    with st.Lock(sdir):
        rec = st.load(root, container_id)
        status = st.status(root, rec)
        if status != "stopped":
            # A created container is killed and deleted without --force, as runc does (the runtime spec
            # says delete of a not-stopped container is an error): containerd's runc shim deletes a task
            # that was created but never started with a plain `delete ID` (createdState.Delete).
            if not force and status != "created":
                raise InvalidState(f"cannot delete container {container_id!r}: it is {status} "
                                   f"(stop it first, or use --force)")
            _kill_container(rec, SIGKILL)
            _wait_gone(rec)
        mgr = st.cgroup_manager(rec)
        if mgr.exists():
            linux = rec.config.get("linux") or {}
            own_pidns = any(n.get("type") == "pid" and not n.get("path") for n in linux.get("namespaces") or [])
            if not own_pidns and mgr.pids():
                mgr.kill_all(SIGKILL)  # without a pid namespace the init's death does not end the rest
        if rec.systemd_unit:
            _stop_unit(rec)   # before the rmdir: systemd removes the scope's cgroup itself
        if mgr.exists():
            _destroy(mgr)
        st.remove_dir(sdir)
    hooks = (rec.config.get("hooks") or {}).get("poststop")
    if hooks:
        from runtime import hooks as hk
        hk.run("poststop", hooks, st.dumps_json(_hook_state(rec, "stopped")), container_id=container_id,
               keep_going=True)


def _stop_unit(rec: st.Record) -> None:
    """Stops the container's systemd scope (waiting for the job) and resets it if it failed (e.g. after an
    OOM kill), so that no unit is left; a unit already gone is not an error."""
    from runtime.cgroups import manager_for
    mgr = manager_for(rec.cgroup_path, rec.systemd_unit)
    try:
        mgr.stop()
    finally:
        mgr.close()


def _destroy(mgr: Any) -> None:
    import time
    for _ in range(200):
        try:
            mgr.destroy()
            return
        except SetupError:
            if not mgr.pids():
                time.sleep(0.01)
                continue
            time.sleep(0.01)
    mgr.destroy()


def _wait_gone(rec: st.Record, timeout: float = 10.0) -> None:
    import select
    try:
        pidfd = os.pidfd_open(rec.pid)
    except ProcessLookupError:
        return
    try:
        stat = st.proc_stat(rec.pid)   # read once: the process may be reaped between two reads
        if stat is None or stat[1] != rec.pid_start:
            return
        ready, _, _ = select.select([pidfd], [], [], timeout)
        if not ready:
            raise SetupError(f"container {rec.id!r}: init (pid {rec.pid}) did not exit after SIGKILL")
    finally:
        os.close(pidfd)


def _hook_state(rec: st.Record, status: str) -> dict[str, Any]:
    return {"ociVersion": st.OCI_VERSION, "id": rec.id, "status": status,
            "pid": rec.pid if status != "stopped" else 0, "bundle": rec.bundle, "annotations": rec.annotations}


def pause(root: str, container_id: str) -> None:
    with st.Lock(st.container_dir(root, container_id)):
        rec = st.load(root, container_id)
        status = st.status(root, rec)
        if status != "running":
            raise InvalidState(f"cannot pause container {container_id!r}: it is {status}")
        st.cgroup_manager(rec).freeze()


def resume(root: str, container_id: str) -> None:
    with st.Lock(st.container_dir(root, container_id)):
        rec = st.load(root, container_id)
        status = st.status(root, rec)
        if status != "paused":
            raise InvalidState(f"cannot resume container {container_id!r}: it is {status}, not paused")
        st.cgroup_manager(rec).thaw()


def update(root: str, container_id: str, resources: dict[str, Any]) -> dict[str, Any]:
    """Changes the container's cgroup limits live from a `linux.resources` object, by runc's update rules
    (runtime/update.py: only the fields runc updates; 0 or "" leaves a value as it is), and records them in
    the state so later calls see them. Returns the container's resources afterwards."""
    from runtime import config, update as up
    from runtime.cgroups import manager_for
    from runtime.errors import ConfigError, HuskError
    try:
        config.check_schema({"ociVersion": "1.0.0", "linux": {"resources": resources}})
    except ConfigError as e:
        raise HuskError(f"update {container_id}: resources: {e.path[len('linux.resources.'):] or e.path}: "
                        f"{e.reason}") from None
    sdir = st.container_dir(root, container_id)
    with st.Lock(sdir):
        rec = st.load(root, container_id)
        if st.status(root, rec) == "stopped":
            raise InvalidState(NOT_RUNNING)
        change, ignored = up.changes(resources)
        if ignored:  # containerd's CRI plugin sends the whole linux.resources (devices too) on every update
            logutil.debug("update %s: left as they are (runc's update does not change them): %s", container_id,
                          ", ".join(ignored), container_id=container_id)
        linux = rec.config.setdefault("linux", {})
        apply, merged = up.plan(linux.get("resources") or {}, change)
        if apply:
            # under systemd: the unit's properties too (SetUnitProperties), then the files
            mgr = manager_for(rec.cgroup_path, rec.systemd_unit) if rec.systemd_unit else st.cgroup_manager(rec)
            try:
                mgr.set(apply)
            finally:
                if rec.systemd_unit:
                    mgr.close()
        linux["resources"] = merged
        st.save(sdir, rec)
    return merged


def list_containers(root: str) -> list[dict[str, Any]]:
    out = []
    for cid in st.list_ids(root):
        try:
            out.append(state(root, cid))
        except Exception as e:  # noqa: BLE001 - one broken state dir must not hide the others
            logutil.warning("list: skipping %s: %s", cid, e, container_id=cid)
    return out


def processes(root: str, container_id: str) -> list[int]:
    """Every pid in the container's cgroup (what `husk ps` shows)."""
    rec = st.load(root, container_id)
    if st.status(root, rec) == "stopped":
        return []
    return st.cgroup_manager(rec).pids()


def exec_process(root: str, container_id: str, process: dict[str, Any], *, console_socket: str | None = None,
                 pid_file: str | None = None, detach: bool = False, preserve_fds: int = 0,
                 cgroup: str | dict[str, str] | None = None, ignore_paused: bool = False) -> int:
    """Runs `process` (an OCI process object) inside the container; detach: its pid, else its exit code
    (128+signal if killed). A terminal process needs `console_socket`, except in the foreground, where the
    caller's own stdio is proxied to the pty (as runc does). `cgroup`: a sub-cgroup path, or
    {controller or "": path} (runc's --cgroup). Like create, this makes the caller a child subreaper."""
    from runtime import execute
    proxy = None
    if process.get("terminal") and not console_socket:
        if detach:
            raise SetupError("cannot allocate a tty for a detached exec without --console-socket")
        from runtime.run import ConsoleProxy
        proxy = ConsoleProxy()
        console_socket = proxy.path
    try:
        pid = execute.spawn(root, container_id, process, console_socket=console_socket, pid_file=pid_file,
                            detach=detach or proxy is not None, preserve_fds=preserve_fds, cgroup=cgroup,
                            ignore_paused=ignore_paused)
        if proxy is None:
            return pid  # detached: the pid; in the foreground execute waited and returned the exit code
        from runtime.run import forward_signals
        proxy.accept()
        forward_signals(pid)
        return proxy.pump(pid)
    finally:
        if proxy is not None:
            proxy.close()


def run(root: str, container_id: str, bundle: str, *, detach: bool = False, console_socket: str | None = None,
        pid_file: str | None = None, no_pivot: bool = False, no_new_keyring: bool = False,
        preserve_fds: int = 0, keep: bool = False, systemd_cgroup: bool = False) -> int:
    """create + start; without `detach`, waits and returns the exit code (128+signal) and deletes."""
    from runtime import run as run_verb  # runtime/run.py
    return run_verb.run(root, container_id, bundle, detach=detach, console_socket=console_socket,
                        pid_file=pid_file, no_pivot=no_pivot, no_new_keyring=no_new_keyring,
                        preserve_fds=preserve_fds, keep=keep, systemd_cgroup=systemd_cgroup)
