"""The one place that calls libc: namespaces, mounts, pivot_root, prctl, capabilities.

Everything above this module takes these functions by name (or the whole module as a
parameter) so that logic can be unit-tested without root. Imports only ctypes and os:
this module is on every container start's hot path.
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct  # already loaded by ctypes

_libc = ctypes.CDLL(None, use_errno=True)

# --- clone / namespace flags (linux/sched.h) -------------------------------------------
CLONE_NEWTIME = 0x00000080
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

# OCI namespace type -> (clone flag, /proc/<pid>/ns/<name>)
NAMESPACES: dict[str, tuple[int, str]] = {
    "pid": (CLONE_NEWPID, "pid"),
    "network": (CLONE_NEWNET, "net"),
    "mount": (CLONE_NEWNS, "mnt"),
    "ipc": (CLONE_NEWIPC, "ipc"),
    "uts": (CLONE_NEWUTS, "uts"),
    "user": (CLONE_NEWUSER, "user"),
    "cgroup": (CLONE_NEWCGROUP, "cgroup"),
    "time": (CLONE_NEWTIME, "time"),
}

# --- mount flags (linux/mount.h) --------------------------------------------------------
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_SYNCHRONOUS = 16
MS_REMOUNT = 32
MS_MANDLOCK = 64
MS_DIRSYNC = 128
MS_NOSYMFOLLOW = 256
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 16384
MS_SILENT = 32768
MS_POSIXACL = 1 << 16
MS_UNBINDABLE = 1 << 17
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MS_RELATIME = 1 << 21
MS_KERNMOUNT = 1 << 22
MS_I_VERSION = 1 << 23
MS_STRICTATIME = 1 << 24
MS_LAZYTIME = 1 << 25

MNT_FORCE = 1
MNT_DETACH = 2
MNT_EXPIRE = 4
UMOUNT_NOFOLLOW = 8

# --- prctl (linux/prctl.h) --------------------------------------------------------------
PR_SET_PDEATHSIG = 1
PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
PR_GET_KEEPCAPS = 7
PR_SET_KEEPCAPS = 8
PR_SET_NAME = 15
PR_GET_SECCOMP = 21
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_IS_SET = 1
PR_CAP_AMBIENT_RAISE = 2
PR_CAP_AMBIENT_LOWER = 3
PR_CAP_AMBIENT_CLEAR_ALL = 4

# --- x86_64 syscall numbers for calls glibc 2.36 has no wrapper for ---------------------
SYS_pivot_root = 155
SYS_capget = 125
SYS_capset = 126
SYS_seccomp = 317
SYS_bpf = 321
SYS_pidfd_send_signal = 424
SYS_open_tree = 428
SYS_move_mount = 429
SYS_pidfd_open = 434
SYS_clone3 = 435
SYS_close_range = 436
SYS_openat2 = 437
SYS_mount_setattr = 442

_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_libc.setdomainname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def _fs(path: str | bytes | None) -> bytes | None:
    if path is None:
        return None
    return os.fsencode(path)


def _check(ret: int, what: str, path: str | bytes | None = None) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        if path is not None:
            raise OSError(err, f"{what}: {os.strerror(err)}", os.fsdecode(path))
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, nstype: int = 0) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def mount(source: str | bytes | None, target: str | bytes, fstype: str | bytes | None,
          flags: int = 0, data: str | bytes | None = None) -> None:
    """mount(2). The error names the target and the flags, as crun's messages do."""
    ret = _libc.mount(_fs(source), _fs(target), _fs(fstype), flags, _fs(data))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {os.fsdecode(source or b'none')!r} to {os.fsdecode(target)!r} "
                           f"(type {os.fsdecode(fstype or b'none')}, flags {flags:#x}): {os.strerror(err)}",
                      os.fsdecode(target))


def umount2(target: str | bytes, flags: int = 0) -> None:
    _check(_libc.umount2(_fs(target), flags), "umount2", target)


def pivot_root(new_root: str | bytes, put_old: str | bytes) -> None:
    _check(_libc.syscall(SYS_pivot_root, _fs(new_root), _fs(put_old)), "pivot_root", new_root)


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return _check(_libc.prctl(option, arg2, arg3, arg4, arg5), f"prctl({option})")


def sethostname(name: str) -> None:
    b = name.encode()
    _check(_libc.sethostname(b, len(b)), "sethostname")


def setdomainname(name: str) -> None:
    b = name.encode()
    _check(_libc.setdomainname(b, len(b)), "setdomainname")


def set_child_subreaper(on: bool = True) -> None:
    prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def set_pdeathsig(sig: int) -> None:
    prctl(PR_SET_PDEATHSIG, sig)


def set_dumpable(on: bool) -> None:
    prctl(PR_SET_DUMPABLE, 1 if on else 0)


def set_no_new_privs() -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def set_keepcaps(on: bool) -> None:
    prctl(PR_SET_KEEPCAPS, 1 if on else 0)


def set_name(name: str) -> None:
    """Sets the thread's comm (what ps shows), at most 15 bytes."""
    buf = ctypes.create_string_buffer(name.encode()[:15])
    _check(_libc.prctl(PR_SET_NAME, ctypes.cast(buf, ctypes.c_void_p).value or 0, 0, 0, 0), "prctl(PR_SET_NAME)")


def environ_to_heap(lo: int, hi: int) -> None:
    """Points every entry of libc's `environ` whose string lies in [lo, hi) at a heap copy (never freed), so that
    the memory there can be reused (the process title, shim/proctitle.py) while getenv keeps working."""
    strdup = _libc.strdup
    strdup.restype, strdup.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    environ = ctypes.POINTER(ctypes.c_void_p).in_dll(_libc, "environ")
    i = 0
    while environ[i]:
        p = environ[i]
        if lo <= p < hi:
            copy = strdup(p)
            if not copy:
                raise OSError(12, "strdup of an environment string: out of memory")
            environ[i] = copy
        i += 1


# --- capabilities (linux/capability.h, version 3: two 32-bit words per set) -------------
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def capget(pid: int = 0) -> tuple[int, int, int]:
    """Returns (effective, permitted, inheritable) as 64-bit masks."""
    hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, pid)
    data = (_CapData * 2)()
    _check(_libc.syscall(SYS_capget, ctypes.byref(hdr), ctypes.byref(data)), "capget")
    return (data[0].effective | data[1].effective << 32,
            data[0].permitted | data[1].permitted << 32,
            data[0].inheritable | data[1].inheritable << 32)


def capset(effective: int, permitted: int, inheritable: int) -> None:
    hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    for i, shift in ((0, 0), (1, 32)):
        data[i].effective = (effective >> shift) & 0xFFFFFFFF
        data[i].permitted = (permitted >> shift) & 0xFFFFFFFF
        data[i].inheritable = (inheritable >> shift) & 0xFFFFFFFF
    _check(_libc.syscall(SYS_capset, ctypes.byref(hdr), ctypes.byref(data)), "capset")


def capbset_read(cap: int) -> bool:
    return prctl(PR_CAPBSET_READ, cap) == 1


def capbset_drop(cap: int) -> None:
    prctl(PR_CAPBSET_DROP, cap)


def ambient_raise(cap: int) -> None:
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap)


def ambient_clear_all() -> None:
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)


def last_cap() -> int:
    """The highest capability number the running kernel knows."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        return int(f.read())


# --- pidfd, close_range ------------------------------------------------------------------
def pidfd_open(pid: int, flags: int = 0) -> int:
    return _check(_libc.syscall(SYS_pidfd_open, ctypes.c_int(pid), ctypes.c_uint(flags)), "pidfd_open")


def pidfd_send_signal(pidfd: int, sig: int) -> None:
    _check(_libc.syscall(SYS_pidfd_send_signal, ctypes.c_int(pidfd), ctypes.c_int(sig),
                         None, ctypes.c_uint(0)), "pidfd_send_signal")


CLOSE_RANGE_CLOEXEC = 4


def close_range(first: int, last: int = 0xFFFFFFFF, flags: int = 0) -> None:
    _check(_libc.syscall(SYS_close_range, ctypes.c_uint(first), ctypes.c_uint(last),
                         ctypes.c_uint(flags)), "close_range")


CLONE_INTO_CGROUP = 0x200000000
SIGCHLD = 17                # the exit signal field of clone_args; signal.SIGCHLD's value on x86 and arm
_clone3_ok: bool | None = None


def clone3_usable() -> bool:
    """Whether clone3 reaches the kernel: called with no arguments the kernel answers EINVAL (size below its
    first version) and creates nothing; ENOSYS (before 5.3) or whatever a seccomp filter answers for a call it
    does not allow (often EPERM) means no. Asked once per process."""
    global _clone3_ok
    if _clone3_ok is None:
        r = _libc.syscall(SYS_clone3, None, ctypes.c_size_t(0))
        _clone3_ok = r == -1 and ctypes.get_errno() == 22     # EINVAL
    return _clone3_ok


def fork_into_cgroup(cgroup_fd: int) -> int:
    """fork(2) whose child starts in the cgroup2 directory `cgroup_fd` (clone3 with CLONE_INTO_CGROUP, Linux
    5.7+): no write to cgroup.procs, which waits for an RCU grace period. Returns like os.fork; OSError when
    the kernel (or a seccomp filter) refuses, then nothing was forked. Only for a single-threaded caller about
    to hand the child to code that does not need CPython's or glibc's fork bookkeeping: the child skips
    os.fork's at-fork handlers, and glibc keeps the parent's thread id cached in the child (pthread_kill and
    raise would aim at it; getpid, kill, fork and execve are unaffected)."""
    args = struct.pack("=11Q", CLONE_INTO_CGROUP, 0, 0, 0, SIGCHLD, 0, 0, 0, 0, 0, cgroup_fd)
    buf = ctypes.create_string_buffer(args, len(args))
    return _check(_libc.syscall(SYS_clone3, buf, ctypes.c_size_t(len(args))), "clone3(CLONE_INTO_CGROUP)")


def fork_placed(cgroup_fd: int, any_refusal: bool = False) -> tuple[int, bool]:
    """Forks, straight into the cgroup2 directory `cgroup_fd` where clone3 allows (fork_into_cgroup, with its
    caveats): (pid as os.fork's, whether the child starts in that cgroup; if not, the caller places it). A
    plain fork when clone3 cannot be used at all (clone3_usable) or refuses with ENOSYS or E2BIG; any other
    refusal (nothing was forked) is raised, unless `any_refusal` falls back to the fork for it too: only a
    caller that has not unshared a pid namespace may, since a refused clone there can use up its pid 1."""
    if clone3_usable():
        try:
            return fork_into_cgroup(cgroup_fd), True
        except OSError as e:
            if not any_refusal and e.errno not in (errno.ENOSYS, errno.E2BIG):
                raise
    return os.fork(), False


def raw_syscall(number: int, *args: object) -> int:
    """For the few callers (seccomp, bpf) that build their own argument structures."""
    return _check(_libc.syscall(number, *args), f"syscall({number})")


# --- bpf(2): loading and attaching the cgroup v2 device program (linux/bpf.h) -------------
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_GET_FD_BY_ID = 13
BPF_PROG_QUERY = 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6          # enum bpf_attach_type
BPF_F_ALLOW_OVERRIDE = 1
BPF_F_ALLOW_MULTI = 2
BPF_F_REPLACE = 4
_BPF_ATTR_SIZE = 128           # bigger than every layout used here; the kernel wants the unused tail zeroed


def _bpf(cmd: int, attr: ctypes.Array, what: str) -> int:
    return _check(_libc.syscall(SYS_bpf, ctypes.c_int(cmd), attr, ctypes.c_uint(len(attr))), what)


def bpf_prog_load(prog_type: int, insns: bytes, license: str = "Apache", expected_attach_type: int = 0,
                  name: str = "", log_size: int = 65536) -> int:
    """Loads a program (8-byte instructions in `insns`); returns its fd. A verifier rejection raises OSError
    whose message carries the verifier's log."""
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(license.encode())
    log = ctypes.create_string_buffer(log_size)
    attr = ctypes.create_string_buffer(_BPF_ATTR_SIZE)
    # prog_type, insn_cnt, insns, license, log_level, log_size, log_buf, kern_version, prog_flags,
    # prog_name[16], prog_ifindex, expected_attach_type
    struct.pack_into("<IIQQIIQII16sII", attr, 0, prog_type, len(insns) // 8, ctypes.addressof(code),
                     ctypes.addressof(lic), 1, log_size, ctypes.addressof(log), 0, 0,
                     name.encode()[:15], 0, expected_attach_type)
    ret = _libc.syscall(SYS_bpf, ctypes.c_int(BPF_PROG_LOAD), attr, ctypes.c_uint(len(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        verifier = log.value.decode(errors="replace").strip()
        raise OSError(err, f"bpf(BPF_PROG_LOAD): {os.strerror(err)}" + (f"; verifier: {verifier}" if verifier else ""))
    return ret


def bpf_prog_attach(target_fd: int, prog_fd: int, attach_type: int, flags: int = 0, replace_fd: int = 0) -> None:
    attr = ctypes.create_string_buffer(_BPF_ATTR_SIZE)
    struct.pack_into("<IIIII", attr, 0, target_fd, prog_fd, attach_type, flags, replace_fd)
    _bpf(BPF_PROG_ATTACH, attr, "bpf(BPF_PROG_ATTACH)")


def bpf_prog_detach(target_fd: int, prog_fd: int, attach_type: int) -> None:
    attr = ctypes.create_string_buffer(_BPF_ATTR_SIZE)
    struct.pack_into("<III", attr, 0, target_fd, prog_fd, attach_type)
    _bpf(BPF_PROG_DETACH, attr, "bpf(BPF_PROG_DETACH)")


def bpf_prog_query(target_fd: int, attach_type: int, max_progs: int = 64) -> tuple[int, list[int]]:
    """The programs attached directly to the cgroup `target_fd`: (attach_flags, program ids)."""
    ids = (ctypes.c_uint32 * max_progs)()
    attr = ctypes.create_string_buffer(_BPF_ATTR_SIZE)
    # target_fd, attach_type, query_flags, attach_flags, prog_ids, prog_cnt
    struct.pack_into("<IIIIQI", attr, 0, target_fd, attach_type, 0, 0, ctypes.addressof(ids), max_progs)
    _bpf(BPF_PROG_QUERY, attr, "bpf(BPF_PROG_QUERY)")
    attach_flags = struct.unpack_from("<I", attr, 12)[0]
    count = struct.unpack_from("<I", attr, 24)[0]
    return attach_flags, list(ids[:min(count, max_progs)])


def bpf_prog_get_fd_by_id(prog_id: int) -> int:
    attr = ctypes.create_string_buffer(_BPF_ATTR_SIZE)
    struct.pack_into("<I", attr, 0, prog_id)
    return _bpf(BPF_PROG_GET_FD_BY_ID, attr, "bpf(BPF_PROG_GET_FD_BY_ID)")


# --- inotify (the v2 OOM notification watches memory.events) -----------------------------
IN_MODIFY = 0x00000002
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]


def inotify_init1(flags: int = IN_CLOEXEC) -> int:
    return _check(_libc.inotify_init1(flags), "inotify_init1")


def inotify_add_watch(fd: int, path: str | bytes, mask: int) -> int:
    return _check(_libc.inotify_add_watch(fd, _fs(path), mask), "inotify_add_watch", path)


# --- openat2 (linux/openat2.h): path resolution confined to a directory ------------------
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: str | bytes, flags: int, mode: int = 0, resolve: int = 0) -> int:
    """openat2(2): opens `path` relative to `dirfd` with the RESOLVE_* restrictions; returns the fd."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    return _check(_libc.syscall(SYS_openat2, ctypes.c_int(dirfd), _fs(path), ctypes.byref(how),
                                ctypes.c_size_t(ctypes.sizeof(how))), "openat2", path)


# --- mount_setattr (linux/mount.h): recursive mount attributes -----------------------------
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8
MOUNT_ATTR_NOATIME = 0x10
MOUNT_ATTR_STRICTATIME = 0x20
MOUNT_ATTR_NODIRATIME = 0x80
MOUNT_ATTR_IDMAP = 0x100000
MOUNT_ATTR_NOSYMFOLLOW = 0x200000
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def mount_setattr(path: str | bytes, attr_set: int, attr_clr: int = 0, recursive: bool = True,
                  dirfd: int = -100, userns_fd: int = 0) -> None:
    """mount_setattr(2) on `path` relative to `dirfd`; an empty path with a dirfd means the fd's own mount.
    With MOUNT_ATTR_IDMAP in attr_set, `userns_fd` names the user namespace whose mappings the mount takes."""
    attr = _MountAttr(attr_set, attr_clr, 0, userns_fd)
    flags = AT_RECURSIVE if recursive else 0
    if not path:
        flags |= AT_EMPTY_PATH
    _check(_libc.syscall(SYS_mount_setattr, ctypes.c_int(dirfd), _fs(path) or b"", ctypes.c_uint(flags),
                         ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))), "mount_setattr", path)


# --- open_tree (linux/mount.h): a detached copy of a mount, not attached to any mount namespace --------
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC


def open_tree(dirfd: int, path: str | bytes, flags: int) -> int:
    """open_tree(2): with OPEN_TREE_CLONE, an O_PATH fd on a new detached bind mount of `path`."""
    return _check(_libc.syscall(SYS_open_tree, ctypes.c_int(dirfd), _fs(path), ctypes.c_uint(flags)),
                  "open_tree", path)


# --- move_mount (linux/mount.h): attach a detached mount (open_tree) -----------------------------------
MOVE_MOUNT_F_EMPTY_PATH = 0x00000004
MOVE_MOUNT_T_EMPTY_PATH = 0x00000040


def move_mount(from_fd: int, to_fd: int, to_path: str | bytes = "") -> None:
    """move_mount(2) of the mount `from_fd` names onto `to_path` relative to `to_fd` (or onto `to_fd` itself
    when `to_path` is empty: no symlink on the way is followed again)."""
    flags = MOVE_MOUNT_F_EMPTY_PATH | (0 if to_path else MOVE_MOUNT_T_EMPTY_PATH)
    _check(_libc.syscall(SYS_move_mount, ctypes.c_int(from_fd), b"", ctypes.c_int(to_fd), _fs(to_path) or b"",
                         ctypes.c_uint(flags)), "move_mount", to_path or f"fd {to_fd}")


# --- keyctl: a fresh session keyring per container (runc's behaviour without --no-new-keyring)
SYS_keyctl = 250
KEYCTL_SETPERM = 5
KEYCTL_DESCRIBE = 6
KEYCTL_JOIN_SESSION_KEYRING = 1
KEY_USR_SEARCH = 0x00080000
KEY_OTH_SEARCH = 0x00000008


def join_session_keyring(name: str) -> int:
    """Joins the session keyring called `name` (created if none is searchable); returns its serial."""
    return _check(_libc.syscall(SYS_keyctl, ctypes.c_int(KEYCTL_JOIN_SESSION_KEYRING), _fs(name)),
                  "keyctl(JOIN_SESSION_KEYRING)")


def add_key_perm(serial: int, bits: int) -> None:
    """Adds permission bits to a key's (KEYCTL_DESCRIBE gives "type;uid;gid;perm;description", perm in hex)."""
    buf = ctypes.create_string_buffer(4096)
    n = _check(_libc.syscall(SYS_keyctl, ctypes.c_int(KEYCTL_DESCRIBE), ctypes.c_int32(serial), buf,
                             ctypes.c_size_t(len(buf))), "keyctl(DESCRIBE)")
    perm = int(buf.raw[:max(0, n - 1)].split(b";")[3], 16)
    _check(_libc.syscall(SYS_keyctl, ctypes.c_int(KEYCTL_SETPERM), ctypes.c_int32(serial),
                         ctypes.c_uint32(perm | bits)), "keyctl(SETPERM)")


# --- personality, ioprio -----------------------------------------------------------------
SYS_personality = 135
SYS_ioprio_set = 251
PER_LINUX = 0x0000
PER_LINUX32 = 0x0008
IOPRIO_WHO_PROCESS = 1
IOPRIO_CLASS_SHIFT = 13


def personality(persona: int) -> int:
    return _check(_libc.syscall(SYS_personality, ctypes.c_ulong(persona)), "personality")


def ioprio_set(ioclass: int, level: int) -> None:
    value = (ioclass << IOPRIO_CLASS_SHIFT) | level
    _check(_libc.syscall(SYS_ioprio_set, ctypes.c_int(IOPRIO_WHO_PROCESS), ctypes.c_int(0), ctypes.c_int(value)),
           "ioprio_set")
