"""Mount options as fstab, OCI configs and containerd's Mount records spell them: the one table of what each
option means to mount(2) (a flag to set or clear, a propagation change, a recursive attribute, or filesystem
data), and the one translation of a (type, source, options) mount into mount(2) calls.

Used by the container init (rootfs.py), the shim (a task's rootfs from containerd) and husk-cri's snapshots.
No I/O except `mount()`, which calls mount(2) through runtime.linux.syscalls.
"""
from __future__ import annotations

from runtime.linux import syscalls as sc

# option -> (clear?, flag)
FLAGS: dict[str, tuple[bool, int]] = {
    "async": (True, sc.MS_SYNCHRONOUS), "atime": (True, sc.MS_NOATIME), "bind": (False, sc.MS_BIND),
    "defaults": (False, 0), "dev": (True, sc.MS_NODEV), "diratime": (True, sc.MS_NODIRATIME),
    "dirsync": (False, sc.MS_DIRSYNC), "exec": (True, sc.MS_NOEXEC), "iversion": (False, sc.MS_I_VERSION),
    "lazytime": (False, sc.MS_LAZYTIME), "loud": (True, sc.MS_SILENT), "mand": (False, sc.MS_MANDLOCK),
    "noatime": (False, sc.MS_NOATIME), "nodev": (False, sc.MS_NODEV), "nodiratime": (False, sc.MS_NODIRATIME),
    "noexec": (False, sc.MS_NOEXEC), "noiversion": (True, sc.MS_I_VERSION), "nolazytime": (True, sc.MS_LAZYTIME),
    "nomand": (True, sc.MS_MANDLOCK), "norelatime": (True, sc.MS_RELATIME),
    "nostrictatime": (True, sc.MS_STRICTATIME), "nosuid": (False, sc.MS_NOSUID),
    "nosymfollow": (False, sc.MS_NOSYMFOLLOW), "rbind": (False, sc.MS_BIND | sc.MS_REC),
    "relatime": (False, sc.MS_RELATIME), "remount": (False, sc.MS_REMOUNT), "ro": (False, sc.MS_RDONLY),
    "rw": (True, sc.MS_RDONLY), "silent": (False, sc.MS_SILENT), "strictatime": (False, sc.MS_STRICTATIME),
    "suid": (True, sc.MS_NOSUID), "sync": (False, sc.MS_SYNCHRONOUS),
}
PROPAGATION = {
    "private": sc.MS_PRIVATE, "rprivate": sc.MS_PRIVATE | sc.MS_REC, "shared": sc.MS_SHARED,
    "rshared": sc.MS_SHARED | sc.MS_REC, "slave": sc.MS_SLAVE, "rslave": sc.MS_SLAVE | sc.MS_REC,
    "unbindable": sc.MS_UNBINDABLE, "runbindable": sc.MS_UNBINDABLE | sc.MS_REC,
}
# recursive mount attributes (mount_setattr): option -> (set?, attr)
RATTRS: dict[str, tuple[bool, int]] = {
    "rro": (True, sc.MOUNT_ATTR_RDONLY), "rrw": (False, sc.MOUNT_ATTR_RDONLY),
    "rnosuid": (True, sc.MOUNT_ATTR_NOSUID), "rsuid": (False, sc.MOUNT_ATTR_NOSUID),
    "rnodev": (True, sc.MOUNT_ATTR_NODEV), "rdev": (False, sc.MOUNT_ATTR_NODEV),
    "rnoexec": (True, sc.MOUNT_ATTR_NOEXEC), "rexec": (False, sc.MOUNT_ATTR_NOEXEC),
    "rnoatime": (True, sc.MOUNT_ATTR_NOATIME), "ratime": (False, sc.MOUNT_ATTR_NOATIME),
    "rnodiratime": (True, sc.MOUNT_ATTR_NODIRATIME), "rdiratime": (False, sc.MOUNT_ATTR_NODIRATIME),
    "rnosymfollow": (True, sc.MOUNT_ATTR_NOSYMFOLLOW), "rsymfollow": (False, sc.MOUNT_ATTR_NOSYMFOLLOW),
}
IGNORED = frozenset({"tmpcopyup", "copy-symlink", "notmpcopyup"})  # crun extensions, meaningless here
IDMAP_OPTIONS = ("idmap", "ridmap")  # made by the runtime parent (runtime/idmap.py), attached by rootfs.py

# what a bind mount takes only through a remount (the kernel ignores them on the first MS_BIND)
_PER_MOUNT = ~(sc.MS_BIND | sc.MS_REC | sc.MS_REMOUNT)


class MountOptions:
    """A mount's options split into mount(2) flags, propagation changes, recursive attributes and data."""
    __slots__ = ("flags", "clear", "propagation", "attr_set", "attr_clr", "data")

    def __init__(self) -> None:
        self.flags = 0
        self.clear = 0
        self.propagation: list[int] = []
        self.attr_set = 0
        self.attr_clr = 0
        self.data: list[str] = []


def known() -> list[str]:
    """Every option this table understands (what `husk features` lists); the others are filesystem data."""
    return sorted(set(FLAGS) | set(PROPAGATION) | set(RATTRS) | set(IDMAP_OPTIONS))


def parse_options(options: "list[str] | tuple[str, ...]") -> MountOptions:
    """Later options win over earlier ones ("ro,rw" is read-write), as mount(8) reads them."""
    mo = MountOptions()
    for opt in options:
        if opt in FLAGS:
            clear, flag = FLAGS[opt]
            if clear:
                mo.flags &= ~flag
                mo.clear |= flag
            else:
                mo.flags |= flag
        elif opt in PROPAGATION:
            mo.propagation.append(PROPAGATION[opt])
        elif opt in RATTRS:
            on, attr = RATTRS[opt]
            if on:
                mo.attr_set |= attr
            else:
                mo.attr_clr |= attr
        elif opt in IGNORED or opt in IDMAP_OPTIONS:
            continue
        else:
            mo.data.append(opt)
    return mo


class MountCall:
    """mount(2)'s arguments for one (type, source, options) mount, and the calls that must follow it."""
    __slots__ = ("source", "fstype", "flags", "data", "remount", "propagation")

    def __init__(self, source: str | None, fstype: str | None, flags: int, data: str | None, remount: int,
                 propagation: list[int]) -> None:
        self.source = source
        self.fstype = fstype
        self.flags = flags
        self.data = data
        self.remount = remount          # flags of the MS_REMOUNT that must follow (a read-only bind), or 0
        self.propagation = propagation  # MS_SHARED/MS_PRIVATE/... calls that follow, in order

    def __repr__(self) -> str:
        return (f"MountCall({self.source!r}, {self.fstype!r}, flags={self.flags:#x}, data={self.data!r}, "
                f"remount={self.remount:#x}, propagation={self.propagation})")


def mount_call(mtype: str, source: str, options: "list[str] | tuple[str, ...]") -> MountCall:
    """The mount(2) calls for a containerd-style Mount record: type "bind" or a "bind"/"rbind" option binds
    (with its per-mount flags applied by a remount, since the first MS_BIND ignores them); any other type
    mounts a filesystem with the option table's flags and the rest joined as its data."""
    mo = parse_options(options)
    if mtype == "bind" or mo.flags & sc.MS_BIND:
        extra = mo.flags & _PER_MOUNT
        return MountCall(source, None, sc.MS_BIND | (mo.flags & sc.MS_REC), None,
                         extra | sc.MS_BIND | sc.MS_REMOUNT if extra else 0, mo.propagation)
    return MountCall(source, mtype, mo.flags, ",".join(mo.data) or None, 0, mo.propagation)


def mount(call: MountCall, target: str) -> None:
    """Performs `call` on `target`, all or nothing: a failure after the first mount(2) detaches that mount."""
    sc.mount(call.source, target, call.fstype, call.flags, call.data)
    try:
        if call.remount:
            sc.mount(None, target, None, call.remount)
        for p in call.propagation:
            sc.mount(None, target, None, p)
    except BaseException:
        sc.umount2(target, sc.MNT_DETACH)
        raise
