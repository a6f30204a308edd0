"""CVE-2019-5736 class: a process that enters a container must not run the host's interpreter from a mount the
container could ever write through (via /proc/<pid>/exe, or a `#!/proc/self/exe` program exec'd by the init).

Owns the protected interpreter: a read-only, nosuid, nodev bind mount of the running interpreter's file that is
detached from every mount namespace (open_tree + mount_setattr; runc 1.2 does the same with a sealed overlayfs
mount), or a sealed memfd copy when mounts cannot be made (runc 1.1's way), and the re-exec through it; and the
persistent protected interpreter the `husk` launcher execs so that no re-exec is needed (below). It does not
decide which stages need it (child.py and execute.py do); on the stages' path it imports only os, fcntl,
mountinfo and syscalls.

Why it holds: once the fd returned by open_tree is closed, the clone is unmounted but stays pinned as the
process's exe; nothing can remount it (it is in no namespace), so every open for writing fails with EROFS, from
any namespace, even for host root. A sealed memfd refuses writes by its seals and is not the host's file.
"""
from __future__ import annotations

import errno
import os

from runtime.errors import SetupError
from runtime.linux import syscalls as sc

_MEMFD_PREFIX = "/memfd:husk-interpreter"


def _exe_mount_id(fd: int) -> int | None:
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
            for line in f:
                if line.startswith(b"mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def is_protected(pid: "int | str" = "self") -> bool:
    """True when the executable of this process (or of `pid`) is a sealed memfd, a read-only file on a mount
    that is in no mount namespace (what protected_exe() makes), or the persistent protected interpreter (a
    read-only, nosuid, nodev, unbindable mount of this mount namespace owned by root: ensure_persistent()). Any
    other read-only mount is not enough (a copy of it may be in a container's mount namespace)."""
    try:
        fd = os.open(f"/proc/{pid}/exe", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if os.readlink(f"/proc/{pid}/exe").startswith(_MEMFD_PREFIX):
            import fcntl
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            need = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
            return seals & need == need
        if not os.fstatvfs(fd).f_flag & os.ST_RDONLY:
            return False
        mnt = _exe_mount_id(fd)
        if mnt is None:
            return False
        line = _mount_line("self", mnt)   # one read of the table: create's child runs this on its critical path
        if line is not None:
            return _is_persistent(fd, line)   # the persistent one is a mount of this namespace
        return pid == "self" or _mount_line(pid, mnt) is None
    except OSError:
        return False
    finally:
        os.close(fd)


def _mount_line(pid: "int | str", mnt: int) -> bytes | None:
    """The line of mount `mnt` in `pid`'s mount table, None when the mount is in no namespace there."""
    head = b"%d " % mnt
    with open(f"/proc/{pid}/mountinfo", "rb") as f:
        for line in f:
            if line.startswith(head):
                return line
    return None


# --- the persistent protected interpreter ------------------------------------------------------------------
# One read-only, nosuid, nodev bind mount of the interpreter's file per interpreter, made once in the host's mount
# namespace under a root directory (the launcher's: <venv>/husk-interpreter, runtime/launcher.py; the default
# below otherwise) by the `husk` launcher's first run as root (runtime/cli.py's launch) over a runnable copy of
# the interpreter (prepare_persistent), and named by the launcher's #! line, so that the kernel execs it and a
# CLI `create`/`exec` skips the per-container re-exec. It holds for
# the same reason as runc's memfd-bind (a sealed memfd bound over /usr/bin/runc in the host's namespace): a
# process in a container's mount namespace cannot remount, unmount or write through a mount of another mount
# namespace (the kernel's check_mnt: EINVAL), and /proc/<pid>/exe only ever leads to this mount. It is
# unbindable (and so is its directory), so no later rbind of a parent copies it into a container's namespace. A
# pyvenv.cfg beside it lets Python find its stdlib (`home`) and records the real file (`husk-interpreter`).
PERSISTENT_ROOT = "/run/husk-interpreter"
_PERSISTENT_FLAGS = os.ST_RDONLY | os.ST_NOSUID | os.ST_NODEV
_REAL_KEY = "husk-interpreter = "
_STAT_KEY = "husk-interpreter-stat = "      # the real file's size and mtime_ns when the copy was made


def persistent_path(real: str, root: str = PERSISTENT_ROOT) -> str:
    """Where the persistent protected interpreter for the interpreter file `real` (a real path) is mounted."""
    name = real.strip("/").replace("%", "%25").replace("/", "%2F")
    return os.path.join(root, name, "bin", "python")


def _is_persistent(fd: int, line: bytes) -> bool:
    """`line`: the exe's mount in /proc/self/mountinfo (or in the process's whose exe `fd` is)."""
    st = os.fstat(fd)
    if os.fstatvfs(fd).f_flag & _PERSISTENT_FLAGS != _PERSISTENT_FLAGS or st.st_uid != 0 or st.st_mode & 0o022:
        return False
    from runtime.mountinfo import parse_line
    m = parse_line(line.decode(errors="surrogateescape"))
    return m is not None and "unbindable" in m.optional


def recorded_interpreter(path: str) -> str | None:
    """The real interpreter file a persistent protected interpreter at `path` was made from (its pyvenv.cfg)."""
    try:
        with open(os.path.join(os.path.dirname(os.path.dirname(path)), "pyvenv.cfg")) as f:
            for line in f:
                if line.startswith(_REAL_KEY):
                    return line[len(_REAL_KEY):].strip()
    except OSError:
        return None
    return None


def persistent_ok(path: str, real: str) -> bool:
    """True when `path` is a usable persistent protected interpreter of `real`: read-only, nosuid, nodev, owned
    by root, and the same file as `real` today (a replaced interpreter leaves a stale mount to re-make)."""
    try:
        st = os.stat(path)
        rst = os.stat(real)
        return (os.statvfs(path).f_flag & _PERSISTENT_FLAGS == _PERSISTENT_FLAGS and st.st_uid == 0
                and (st.st_dev, st.st_ino) == (rst.st_dev, rst.st_ino))
    except OSError:
        return False


def prepare_persistent(real: str, path: str) -> None:
    """Makes the mount point of the persistent protected interpreter `path` (persistent_path) a runnable copy of
    the interpreter file `real`, with the pyvenv.cfg beside it: the `husk` launcher names `path` on its #! line,
    and while nothing is mounted there (after a reboot, before the first call as root mounts it) the copy runs,
    unprotected, and the stages re-exec from a detached mount (is_protected says no). Raises OSError."""
    d = os.path.dirname(os.path.dirname(path))
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    rst = os.stat(real)
    # The real file's size and mtime too: a rebuilt interpreter of the same size gets a new copy.
    cfg = f"home = {os.path.dirname(real)}\n{_REAL_KEY}{real}\n{_STAT_KEY}{rst.st_size} {rst.st_mtime_ns}\n"
    try:
        with open(os.path.join(d, "pyvenv.cfg")) as f:
            same = f.read() == cfg
    except OSError:
        same = False
    if not same:
        tmp = os.path.join(d, f".pyvenv.cfg.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, cfg.encode())
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(d, "pyvenv.cfg"))
    else:
        try:
            st = os.stat(path)
            if st.st_size == rst.st_size and st.st_mode & 0o111:
                return   # the copy (or, mounted, the interpreter itself)
        except FileNotFoundError:
            pass
    tmp = f"{path}.{os.getpid()}"
    src = os.open(real, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o755)
        try:
            while os.sendfile(dst, src, None, 1 << 24):
                pass
            os.fchmod(dst, 0o755)
        finally:
            os.close(dst)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)      # a partial copy (full disk) or one not put in place
        except FileNotFoundError:
            pass
        if e.errno != errno.EBUSY:
            raise
        # EBUSY: the interpreter is mounted there (ensure_persistent re-makes the mount when it is stale)
    finally:
        os.close(src)


def ensure_persistent(real: str, path: str) -> bool:
    """Makes (or re-makes, when stale) the persistent protected interpreter of `real` at `path` (persistent_path)
    in this process's mount namespace. Needs CAP_SYS_ADMIN there; returns False when it cannot be made (the
    callers then keep the per-container re-exec). Idempotent; concurrent callers at worst stack equal mounts."""
    if persistent_ok(path, real):
        return True
    from runtime.mountinfo import mount_at, read
    d = os.path.dirname(os.path.dirname(path))
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if mount_at(d) is None:
            # the directory becomes an unbindable mount of its own: what is mounted below it propagates nowhere
            # and an rbind of a parent (a container given /run) prunes it
            sc.mount(d, d, None, sc.MS_BIND)
            sc.mount(None, d, None, sc.MS_UNBINDABLE)
        for _ in range(16):  # a stale one (or several stacked by racing callers)
            if mount_at(path, read()) is None:
                break
            sc.umount2(path, sc.MNT_DETACH)
        prepare_persistent(real, path)   # the mount point: a runnable copy, and pyvenv.cfg
        tree = sc.open_tree(-100, real, sc.OPEN_TREE_CLONE | sc.OPEN_TREE_CLOEXEC)
        try:
            sc.mount_setattr("", sc.MOUNT_ATTR_RDONLY | sc.MOUNT_ATTR_NOSUID | sc.MOUNT_ATTR_NODEV, 0,
                             recursive=False, dirfd=tree)
            sc.move_mount(tree, -100, path)
        finally:
            os.close(tree)
        sc.mount(None, path, None, sc.MS_UNBINDABLE)
    except OSError:
        return False
    return persistent_ok(path, real)


def remove_persistent(path: str) -> None:
    """Unmounts a persistent protected interpreter and removes its directory (tests, uninstall)."""
    from runtime.mountinfo import mount_at, read
    import shutil
    d = os.path.dirname(os.path.dirname(path))
    for p in (path, d):
        for _ in range(16):
            if mount_at(p, read()) is None:
                break
            sc.umount2(p, sc.MNT_DETACH)
    shutil.rmtree(d, ignore_errors=True)


def real_interpreter() -> str:
    """The interpreter file this process runs: the one behind the persistent protected interpreter if that is
    what runs (its pyvenv.cfg says which), else /proc/self/exe's target."""
    exe = os.readlink("/proc/self/exe")
    return recorded_interpreter(exe) or exe


def protected_exe() -> int:
    """An fd (close-on-exec) that execve can run: the running interpreter behind a detached read-only mount, or a
    sealed memfd copy of it when this process may not create mounts (no CAP_SYS_ADMIN, old kernel)."""
    exe = real_interpreter()
    try:
        fd = sc.open_tree(-100, exe, sc.OPEN_TREE_CLONE | sc.OPEN_TREE_CLOEXEC)
    except OSError:
        return _sealed_copy()
    try:
        sc.mount_setattr("", sc.MOUNT_ATTR_RDONLY | sc.MOUNT_ATTR_NOSUID | sc.MOUNT_ATTR_NODEV, 0,
                         recursive=False, dirfd=fd)
    except OSError:
        os.close(fd)
        return _sealed_copy()
    return fd


def _sealed_copy() -> int:
    import fcntl
    src = os.open("/proc/self/exe", os.O_RDONLY | os.O_CLOEXEC)
    try:
        fd = os.memfd_create(_MEMFD_PREFIX[len("/memfd:"):], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            size = os.fstat(src).st_size
            done = 0
            while done < size:
                n = os.sendfile(fd, src, done, size - done)
                if n == 0:
                    raise SetupError(f"copying the interpreter into a memfd: short read at {done} of {size} bytes")
                done += n
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SEAL | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
        except BaseException:
            os.close(fd)
            raise
    except OSError as e:
        raise SetupError(f"protecting the interpreter (CVE-2019-5736): cannot make a sealed copy: "
                         f"{e.strerror}") from None
    finally:
        os.close(src)
    return fd


def python_argv() -> list[str]:
    """The interpreter for a re-exec'd stage: isolated and without site (the payload brings sys.path), and
    writing no bytecode if this one does not."""
    import sys
    argv = [sys.executable or "python3", "-I", "-S"]
    if sys.flags.dont_write_bytecode:
        argv.append("-B")
    return argv


def reexec_self() -> None:
    """For long-running callers (a shim, a daemon that forks the runtime): call first thing at start-up; re-runs
    the same command line from the protected interpreter unless already protected, so that every container
    created from this process's forks skips the per-container re-exec. Returns only when already protected."""
    import sys
    if is_protected():
        return
    os.execve(protected_exe(), list(sys.orig_argv), os.environ)


# The program the re-exec'd stage runs: read the payload (marshal, in a memfd: a config may be megabytes), put the
# caller's import path back, continue the stage. `-I -S` give no sys.path to speak of, so it comes with the payload.
_BOOT = ("import marshal,os,sys\n"
         "fd=int(sys.argv[1]);n=os.fstat(fd).st_size;b=bytearray()\n"
         "while len(b)<n:\n"
         " c=os.pread(fd,n-len(b),len(b))\n"
         " if not c:break\n"
         " b+=c\n"
         "os.close(fd);p=marshal.loads(bytes(b));sys.path[:0]=p['path']\n"
         "from runtime import exeguard;exeguard.continue_stage(p)\n")


def reenter(stage: str, payload: dict, keep_fds: list[int]) -> None:
    """Replaces this (forked, single-threaded) process with the protected interpreter running the continue_stage
    function of `stage` on `payload`. `keep_fds` stay open across the exec (the stage makes them close-on-exec again).
    Never returns; raises SetupError if the protected interpreter cannot be made."""
    import marshal
    import runtime
    import sys
    exe_fd = protected_exe()
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(runtime.__file__)))
    data = marshal.dumps({**payload, "stage": stage, "path": [pkg_parent, *sys.path]})
    mfd = os.memfd_create("husk-stage")  # inheritable on purpose: the new interpreter reads it
    os.set_inheritable(mfd, True)
    view = memoryview(data)
    while view:
        view = view[os.write(mfd, view):]
    for fd in keep_fds:
        if fd >= 0:
            os.set_inheritable(fd, True)
    os.execve(exe_fd, [*python_argv(), "-c", _BOOT, str(mfd)], os.environ)


def continue_stage(payload: dict) -> None:
    """Runs in the re-exec'd interpreter: continues the stage named in the payload (never returns)."""
    try:
        if payload["stage"] == "create":
            from runtime import child
            child.continue_stage(payload)
        elif payload["stage"] == "exec":
            from runtime import execute
            execute.continue_stage(payload)
    finally:
        os._exit(1)  # the stages exit or exec themselves; reaching this is a failure
