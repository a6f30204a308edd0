"""CVE-2019-5736 class: a process that enters a container must not run the host's interpreter from a mount the
container could ever write through (via /proc/<pid>/exe, or a `#!/proc/self/exe` program exec'd by the init).

Owns the protected interpreter: a read-only, nosuid, nodev bind mount of the running interpreter's file that is
detached from every mount namespace (open_tree + mount_setattr; runc 1.2 does the same with a sealed overlayfs
mount), or a sealed memfd copy when mounts cannot be made (runc 1.1's way), and the re-exec through it. It does
not decide which stages need it (child.py and execute.py do) and must not import more than os/fcntl/syscalls.

Why it holds: once the fd returned by open_tree is closed, the clone is unmounted but stays pinned as the
process's exe; nothing can remount it (it is in no namespace), so every open for writing fails with EROFS, from
any namespace, even for host root. A sealed memfd refuses writes by its seals and is not the host's file.
"""
from __future__ import annotations

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


def _mounted_ids(pid: "int | str") -> set[int]:
    with open(f"/proc/{pid}/mountinfo", "rb") as f:
        return {int(line.split(b" ", 1)[0]) for line in f if line.strip()}


def is_protected(pid: "int | str" = "self") -> bool:
    """True when the executable of this process (or of `pid`) is a sealed memfd or a read-only file on a mount
    that is in no mount namespace (what protected_exe() makes); a read-only host mount is not enough (host root
    may remount it)."""
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
        ids = _mounted_ids("self")
        if pid != "self":
            ids |= _mounted_ids(pid)
        return mnt not in ids
    except OSError:
        return False
    finally:
        os.close(fd)


def protected_exe() -> int:
    """An fd (close-on-exec) that execve can run: the running interpreter behind a detached read-only mount, or a
    sealed memfd copy of it when this process may not create mounts (no CAP_SYS_ADMIN, old kernel)."""
    exe = os.readlink("/proc/self/exe")
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
         "from runtime import exeguard;exeguard.resume(p)\n")


def reenter(stage: str, payload: dict, keep_fds: list[int]) -> None:
    """Replaces this (forked, single-threaded) process with the protected interpreter running `stage`'s resume
    function on `payload`. `keep_fds` stay open across the exec (the stage makes them close-on-exec again).
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


def resume(payload: dict) -> None:
    """Runs in the re-exec'd interpreter: continues the stage named in the payload (never returns)."""
    try:
        if payload["stage"] == "create":
            from runtime import child
            child.resume(payload)
        elif payload["stage"] == "exec":
            from runtime import execute
            execute.resume(payload)
    finally:
        os._exit(1)  # the stages exit or exec themselves; reaching this is a failure
