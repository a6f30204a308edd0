"""`husk features`: the runtime-spec features document (features.md, features-linux.md), derived from the code.

Every list is computed from the tables the runtime itself uses (config.py, rootfs.py, seccomp.py, the
namespace table in linux/syscalls.py) and, where a table is not the whole story, by asking the config checker
whether it accepts a minimal config using the feature. Nothing here is a hand-written claim; it changes nothing.
"""
from __future__ import annotations

import errno
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

OCI_VERSION_MIN = "1.0.0"
OCI_VERSION_MAX = "1.3.0"  # the runtime-spec release runtime/schema/config-schema.json was written from

# The architecture names the runtime-spec allows in linux.seccomp.architectures; features lists those the
# installed libseccomp resolves (the same check runtime.seccomp applies to a config).
SPEC_SECCOMP_ARCHES = (
    "SCMP_ARCH_X86", "SCMP_ARCH_X86_64", "SCMP_ARCH_X32", "SCMP_ARCH_ARM", "SCMP_ARCH_AARCH64",
    "SCMP_ARCH_LOONGARCH64", "SCMP_ARCH_M68K", "SCMP_ARCH_MIPS", "SCMP_ARCH_MIPS64", "SCMP_ARCH_MIPS64N32",
    "SCMP_ARCH_MIPSEL", "SCMP_ARCH_MIPSEL64", "SCMP_ARCH_MIPSEL64N32", "SCMP_ARCH_PPC", "SCMP_ARCH_PPC64",
    "SCMP_ARCH_PPC64LE", "SCMP_ARCH_S390", "SCMP_ARCH_S390X", "SCMP_ARCH_PARISC", "SCMP_ARCH_PARISC64",
    "SCMP_ARCH_RISCV64", "SCMP_ARCH_SH", "SCMP_ARCH_SHEB",
)


def minimal_config() -> dict[str, Any]:
    """The smallest config the checker accepts; probes add one feature to it."""
    return {"ociVersion": "1.0.0", "root": {"path": "rootfs"},
            "process": {"args": ["sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "linux": {"namespaces": [{"type": "mount"}]}}


def accepts(edit: Callable[[dict[str, Any]], None]) -> bool:
    """True when config.check accepts the minimal config after `edit` (the rootfs is not looked at)."""
    from runtime import config
    from runtime.errors import ConfigError
    raw = minimal_config()
    edit(raw)
    try:
        config.check(raw, "/nonexistent-bundle", require_rootfs=False)
    except ConfigError:
        return False
    return True


def _with_namespace(kind: str) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        if kind != "mount":
            c["linux"]["namespaces"].append({"type": kind})
        if kind == "user":  # a new user namespace needs its mappings
            c["linux"]["uidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
            c["linux"]["gidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    return edit


def namespaces() -> list[str]:
    from runtime.linux import syscalls
    return sorted(t for t in syscalls.NAMESPACES if accepts(_with_namespace(t)))


def capabilities() -> list[str]:
    """The capabilities husk can name in a config and this kernel has (runc lists the same)."""
    from runtime import config
    from runtime.linux import syscalls
    last = syscalls.last_cap()
    return [name for name, n in config.CAP_NUMBER.items() if n <= last]


def mount_options() -> list[str]:
    """Options mountopts.py turns into mount flags, propagation changes or recursive attributes (any other option
    is passed to the filesystem as data, which only the filesystem can judge)."""
    from runtime import mountopts
    return mountopts.known()


def idmap_supported() -> bool:
    """Idmapped bind mounts (runtime/idmap.py): the checker takes them (with the container's user namespace
    mappings and with a mount's own) and this kernel has mount_setattr(2) (Linux 5.12+). Whether a given
    filesystem can be idmapped is the kernel's call at create time (a clear error names it)."""
    def edit(c: dict[str, Any], own: bool) -> None:
        _with_namespace("user")(c)
        m: dict[str, Any] = {"destination": "/m", "type": "bind", "source": "/", "options": ["rbind", "ridmap"]}
        if own:
            m["uidMappings"] = m["gidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
        c["mounts"] = [m]
    if not (accepts(lambda c: edit(c, False)) and accepts(lambda c: edit(c, True))):
        return False
    return _kernel_has_mount_setattr()


def _kernel_has_mount_setattr() -> bool:
    """mount_setattr(-1, "", AT_EMPTY_PATH, NULL, 0): EBADF/EINVAL/EFAULT mean the kernel knows the call."""
    import ctypes
    from runtime.linux import syscalls
    try:
        syscalls.raw_syscall(syscalls.SYS_mount_setattr, ctypes.c_int(-1), b"", ctypes.c_uint(syscalls.AT_EMPTY_PATH),
                             ctypes.c_void_p(0), ctypes.c_size_t(0))
    except OSError as e:
        return e.errno != errno.ENOSYS
    return True


def _seccomp_profile(action: str) -> dict[str, Any]:
    prof: dict[str, Any] = {"defaultAction": "SCMP_ACT_ALLOW",
                            "syscalls": [{"names": ["getpid"], "action": action}]}
    if action == "SCMP_ACT_NOTIFY":
        prof["listenerPath"] = "/run/husk-features-probe.sock"
    return prof


def seccomp() -> dict[str, Any]:
    try:
        from runtime import seccomp as sc
        from runtime import seccomp_lib as lib
        lib.version()
    except (ImportError, OSError, AttributeError):
        return {"enabled": False}
    actions = [a for a in sorted(sc.ACTIONS)
               if accepts(lambda c, a=a: c["linux"].__setitem__("seccomp", _seccomp_profile(a)))]
    arches = [a for a in SPEC_SECCOMP_ARCHES if lib.arch_token(a[len("SCMP_ARCH_"):].lower()) != 0]
    known = sorted(sc.FLAGS)
    return {
        "enabled": _kernel_has_seccomp(),
        "actions": actions,
        "operators": sorted(sc.OPERATORS),
        "archs": sorted(arches),
        "knownFlags": known,
        "supportedFlags": [f for f in known if _kernel_takes_flag(sc, sc.FLAGS[f])],
    }


def _kernel_has_seccomp() -> bool:
    try:
        with open("/proc/self/status") as f:
            return any(line.startswith("Seccomp:") for line in f)
    except OSError:
        return False


def _kernel_takes_flag(sc: Any, flag: int) -> bool:
    """seccomp(SECCOMP_SET_MODE_FILTER, flag, NULL): EFAULT means the kernel knows the flag (and installs
    nothing: the program pointer is NULL), EINVAL that it does not."""
    import ctypes
    from runtime.linux import syscalls
    if flag == sc.FLAG_WAIT_KILLABLE_RECV:
        flag |= sc.FLAG_NEW_LISTENER  # the kernel takes it only together with a listener
    try:
        syscalls.raw_syscall(syscalls.SYS_seccomp, ctypes.c_uint(sc.SECCOMP_SET_MODE_FILTER), ctypes.c_uint(flag),
                             ctypes.c_void_p(0))
    except OSError as e:
        return e.errno == errno.EFAULT
    return False


def cgroup() -> dict[str, bool]:
    import importlib.util
    has = importlib.util.find_spec
    rdma = accepts(lambda c: c["linux"].__setitem__("resources", {"rdma": {"mlx5_0": {"hcaHandles": 1}}}))
    return {"v1": has("runtime.cgroups.v1") is not None, "v2": has("runtime.cgroups.v2") is not None,
            # --systemd-cgroup: transient scopes over D-Bus with husk's own client (cgroups/systemd.py,
            # linux/dbus.py; cgroup v2 hosts, root only)
            "systemd": has("runtime.cgroups.systemd") is not None, "systemdUser": False, "rdma": rdma}


def document() -> dict[str, Any]:
    from runtime import config
    from runtime.commands import VERSION
    idmap = idmap_supported()
    doc: dict[str, Any] = {
        "ociVersionMin": OCI_VERSION_MIN,
        "ociVersionMax": OCI_VERSION_MAX,
        "hooks": [h for h in config.HOOK_KINDS
                  if accepts(lambda c, h=h: c.__setitem__("hooks", {h: [{"path": "/bin/true"}]}))],
        "mountOptions": mount_options(),
        "linux": {
            "namespaces": namespaces(),
            "capabilities": capabilities(),
            "cgroup": cgroup(),
            "seccomp": seccomp(),
            # process.apparmorProfile is applied (process.set_apparmor); a host without AppArmor refuses it
            "apparmor": {"enabled": True},
            # selinuxLabel/mountLabel are not applied by husk; exec refuses a label
            "selinux": {"enabled": False},
            "intelRdt": {"enabled": accepts(lambda c: c["linux"].__setitem__("intelRdt", {"closID": "x"}))},
            "mountExtensions": {"idmap": {"enabled": idmap}},
            "netDevices": {"enabled": accepts(lambda c: c["linux"].__setitem__("netDevices", {"eth9": {}}))},
        },
        "annotations": {"org.husk.version": VERSION},
    }
    if not accepts(lambda c: c["linux"].__setitem__("memoryPolicy", {"mode": "MPOL_DEFAULT"})):
        doc["linux"]["memoryPolicy"] = {"modes": [], "flags": []}  # linux.memoryPolicy is refused
    lib_version = _libseccomp_version()
    if lib_version:
        doc["annotations"]["io.github.seccomp.libseccomp.version"] = lib_version
    return doc


def _libseccomp_version() -> str:
    try:
        from runtime import seccomp_lib
        return seccomp_lib.version()
    except (ImportError, OSError, AttributeError):
        return ""
