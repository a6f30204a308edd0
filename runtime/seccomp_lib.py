"""A small ctypes binding to the distro's libseccomp.so.2: name resolution, filter building, BPF export.

Only runtime/seccomp.py imports it, and only to compile a profile or to check syscall names; a cached
filter is loaded without it. It must not load the library by search path after the container's root
has been pivoted (the container's own libseccomp would be picked up), so import it before that.
"""
from __future__ import annotations

import ctypes
import os

# Loaded by soname, not through ctypes.util.find_library (which spawns ldconfig, ~15 ms).
_lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)

# --- constants from seccomp.h (libseccomp 2.5 API) ----------------------------------------
NR_SCMP_ERROR = -1  # the name is not in libseccomp's table for any architecture

ATTR_ACT_DEFAULT = 1
ATTR_ACT_BADARCH = 2
ATTR_CTL_NNP = 3
ATTR_CTL_TSYNC = 4
ATTR_CTL_LOG = 6
ATTR_CTL_SSB = 7

# Actions (the kernel's SECCOMP_RET_* values) and comparison operators are defined in runtime/seccomp.py,
# which needs them without this module on the cached path.


class ArgCmp(ctypes.Structure):
    """struct scmp_arg_cmp: for MASKED_EQ, datum_a is the mask and datum_b the expected value."""

    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


_lib.seccomp_version.restype = ctypes.POINTER(_Version)
_lib.seccomp_version.argtypes = []
_lib.seccomp_api_get.restype = ctypes.c_uint
_lib.seccomp_api_get.argtypes = []
_lib.seccomp_init.restype = ctypes.c_void_p
_lib.seccomp_init.argtypes = [ctypes.c_uint32]
_lib.seccomp_release.restype = None
_lib.seccomp_release.argtypes = [ctypes.c_void_p]
_lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
_lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
_lib.seccomp_arch_native.restype = ctypes.c_uint32
_lib.seccomp_arch_native.argtypes = []
_lib.seccomp_arch_add.restype = ctypes.c_int
_lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
_lib.seccomp_arch_exist.restype = ctypes.c_int
_lib.seccomp_arch_exist.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
_lib.seccomp_attr_set.restype = ctypes.c_int
_lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
_lib.seccomp_attr_get.restype = ctypes.c_int
_lib.seccomp_attr_get.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint32)]
_lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
_lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
_lib.seccomp_syscall_resolve_name_arch.restype = ctypes.c_int
_lib.seccomp_syscall_resolve_name_arch.argtypes = [ctypes.c_uint32, ctypes.c_char_p]
_lib.seccomp_rule_add_array.restype = ctypes.c_int
_lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                        ctypes.POINTER(ArgCmp)]
_lib.seccomp_export_bpf.restype = ctypes.c_int
_lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]


class LibseccompError(OSError):
    """A libseccomp call failed; libseccomp returns -errno, kept in `errno`."""


def version() -> str:
    """The loaded library's version, e.g. '2.5.4' (part of the BPF cache key)."""
    v = _lib.seccomp_version().contents
    return f"{v.major}.{v.minor}.{v.micro}"


def api_level() -> int:
    """The API level libseccomp detected for this kernel (5 or more: SCMP_ACT_NOTIFY works)."""
    return int(_lib.seccomp_api_get())


def arch_token(name: str) -> int:
    """libseccomp's token for an architecture name such as 'x86_64'; 0 when the name is unknown."""
    return int(_lib.seccomp_arch_resolve_name(name.encode()))


def native_arch() -> int:
    return int(_lib.seccomp_arch_native())


def resolve_syscall(name: str, arch: int | None = None) -> int:
    """The syscall number of `name` on `arch` (native when None).

    A name libseccomp knows but that the architecture lacks resolves to a negative pseudo number
    (below -10000), which rules accept and libseccomp drops for that architecture. NR_SCMP_ERROR (-1)
    means libseccomp does not know the name at all.
    """
    raw = name.encode()
    if arch is None:
        return int(_lib.seccomp_syscall_resolve_name(raw))
    return int(_lib.seccomp_syscall_resolve_name_arch(arch, raw))


def _check(rc: int, what: str) -> int:
    if rc < 0:
        raise LibseccompError(-rc, f"libseccomp {what}: {os.strerror(-rc)}")
    return rc


class FilterContext:
    """One libseccomp filter under construction; use as a context manager so it is always released."""

    def __init__(self, default_action: int) -> None:
        ctx = _lib.seccomp_init(default_action)
        if not ctx:
            raise LibseccompError(22, f"libseccomp seccomp_init({default_action:#x}): invalid default action")
        self._ctx: int | None = ctx

    def __enter__(self) -> FilterContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self._ctx is not None:
            _lib.seccomp_release(self._ctx)
            self._ctx = None

    @property
    def _handle(self) -> int:
        if self._ctx is None:
            raise ValueError("filter context already released")
        return self._ctx

    def set_attr(self, attr: int, value: int) -> None:
        _check(_lib.seccomp_attr_set(self._handle, attr, value), f"seccomp_attr_set({attr}, {value})")

    def get_attr(self, attr: int) -> int:
        out = ctypes.c_uint32()
        _check(_lib.seccomp_attr_get(self._handle, attr, ctypes.byref(out)), f"seccomp_attr_get({attr})")
        return out.value

    def add_arch(self, token: int) -> None:
        """Adds an architecture; adding one already present (the native one) is not an error."""
        if _lib.seccomp_arch_exist(self._handle, token) == 0:
            return
        _check(_lib.seccomp_arch_add(self._handle, token), f"seccomp_arch_add({token:#x})")

    def add_rule(self, action: int, syscall_nr: int, conditions: list[tuple[int, int, int, int]]) -> None:
        """Adds one rule; `conditions` are (arg index, op, datum_a, datum_b), all of which must match."""
        array = (ArgCmp * len(conditions))(*[ArgCmp(*c) for c in conditions]) if conditions else None
        _check(_lib.seccomp_rule_add_array(self._handle, action, syscall_nr, len(conditions), array),
               f"seccomp_rule_add(action {action:#x}, syscall {syscall_nr})")

    def export_bpf(self) -> bytes:
        """The generated program as raw `struct sock_filter` records (8 bytes each)."""
        fd = os.memfd_create("husk-seccomp-bpf", os.MFD_CLOEXEC)
        try:
            _check(_lib.seccomp_export_bpf(self._handle, fd), "seccomp_export_bpf")
            size = os.lseek(fd, 0, os.SEEK_CUR)
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)
