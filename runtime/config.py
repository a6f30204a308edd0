"""Loads a bundle's config.json: JSON parse, schema check (the generated validator), then the semantic checks.

Owns every decision about whether a config can run on Linux; creates nothing on the host.
Errors are runtime.errors.ConfigError naming the JSON path and the reason.
"""
from __future__ import annotations

import os
TYPE_CHECKING = False  # `typing` costs ~4 ms (it imports re): annotations only
if TYPE_CHECKING:
    from typing import Any

from runtime.errors import ConfigError
from runtime.linux import syscalls

CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
    "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
    "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
)
CAP_NUMBER = {name: i for i, name in enumerate(CAPABILITIES)}
CAP_SETS = ("bounding", "effective", "permitted", "inheritable", "ambient")

# RLIMIT_* name -> resource number (asm-generic/resource.h; x86_64 uses the generic numbering)
RLIMITS = {
    "RLIMIT_CPU": 0, "RLIMIT_FSIZE": 1, "RLIMIT_DATA": 2, "RLIMIT_STACK": 3, "RLIMIT_CORE": 4,
    "RLIMIT_RSS": 5, "RLIMIT_NPROC": 6, "RLIMIT_NOFILE": 7, "RLIMIT_MEMLOCK": 8, "RLIMIT_AS": 9,
    "RLIMIT_LOCKS": 10, "RLIMIT_SIGPENDING": 11, "RLIMIT_MSGQUEUE": 12, "RLIMIT_NICE": 13,
    "RLIMIT_RTPRIO": 14, "RLIMIT_RTTIME": 15,
}
HOOK_KINDS = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
# (path, major, minor) created in every container's /dev, as the spec requires
DEFAULT_DEVICES = [("/dev/null", 1, 3), ("/dev/zero", 1, 5), ("/dev/full", 1, 7), ("/dev/random", 1, 8),
                   ("/dev/urandom", 1, 9), ("/dev/tty", 5, 0)]
# cgroup device rules every container gets after the config's own (runc's allowed defaults); here,
# not in rootfs.py, so that the runtime process (parent.cgroup_resources) need not import the rootfs code
DEFAULT_DEVICE_RULES: list[dict[str, Any]] = [
    {"allow": True, "type": "c", "major": -1, "minor": -1, "access": "m"},
    {"allow": True, "type": "b", "major": -1, "minor": -1, "access": "m"},
    *({"allow": True, "type": "c", "major": ma, "minor": mi, "access": "rwm"} for _, ma, mi in DEFAULT_DEVICES),
    {"allow": True, "type": "c", "major": 5, "minor": 1, "access": "rwm"},     # /dev/console
    {"allow": True, "type": "c", "major": 5, "minor": 2, "access": "rwm"},     # /dev/ptmx
    {"allow": True, "type": "c", "major": 136, "minor": -1, "access": "rwm"},  # /dev/pts/*
]


# Records here are plain classes with __slots__, not dataclasses: `dataclasses` imports inspect, which would
# add tens of milliseconds to every `create`.
class Namespace:
    __slots__ = ("type", "path")

    def __init__(self, type: str, path: str | None) -> None:
        self.type = type   # OCI name: pid, network, mount, ipc, uts, user, cgroup, time
        self.path = path   # join this namespace (setns) instead of creating one

    def __repr__(self) -> str:
        return f"Namespace({self.type!r}, {self.path!r})"


class Config:
    """A validated config.json: the raw dict (what hooks, cgroups and exec read) plus derived facts."""

    def __init__(self, raw: dict[str, Any], bundle: str, rootfs: str) -> None:
        self.raw = raw
        self.bundle = bundle
        self.rootfs = rootfs                       # absolute path of root.path
        self.namespaces: list[Namespace] = []

    def ns(self, kind: str) -> Namespace | None:
        for n in self.namespaces:
            if n.type == kind:
                return n
        return None

    def new_ns(self, kind: str) -> bool:
        n = self.ns(kind)
        return n is not None and n.path is None

    @property
    def process(self) -> dict[str, Any]:
        return self.raw.get("process") or {}

    @property
    def linux(self) -> dict[str, Any]:
        return self.raw.get("linux") or {}

    @property
    def hooks(self) -> dict[str, list[dict[str, Any]]]:
        return self.raw.get("hooks") or {}


# Bounds on what a bundle can make the runtime read and hold: far above any real config (Kubernetes caps a whole
# pod object at 1.5 MB), far below what would hurt the node.
MAX_CONFIG_BYTES = 16 << 20


def load(bundle: str) -> Config:
    """Reads and checks `<bundle>/config.json`. Raises ConfigError; touches nothing."""
    path = os.path.join(bundle, "config.json")
    data = _read_config(path)
    from runtime import jsonload
    try:
        raw = jsonload.loads(data)
    except ValueError as e:
        raise ConfigError("", f"invalid JSON in {path}: {e}") from None
    except RecursionError:
        raise ConfigError("", f"invalid JSON in {path}: nested too deeply") from None
    return check(raw, bundle)


def _read_config(path: str) -> bytes:
    try:
        # O_NONBLOCK: a fifo named config.json must be an error, not a runtime blocked forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError("", f"{path} does not exist") from None
    except OSError as e:
        raise ConfigError("", f"cannot read {path}: {e.strerror}") from None
    try:
        import stat
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("", f"{path} is not a regular file")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError("", f"{path} is {st.st_size} bytes, more than husk's limit of {MAX_CONFIG_BYTES}")
        chunks = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_CONFIG_BYTES:  # it grew while we read
                raise ConfigError("", f"{path} is more than husk's limit of {MAX_CONFIG_BYTES} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise ConfigError("", f"cannot read {path}: {e.strerror}") from None
    finally:
        os.close(fd)


def check_schema(raw: Any) -> None:
    """The schema check alone (the generated validator); raises ConfigError with the JSON path."""
    from runtime.schema import validator
    try:
        validator.validate(raw)
    except validator.JsonSchemaValueException as e:
        name = e.name or "data"
        jpath = name[5:] if name.startswith("data.") else ("" if name == "data" else name)
        msg = e.message
        if msg.startswith(name):
            msg = msg[len(name):].strip()
        raise ConfigError(jpath, msg) from None


def check(raw: Any, bundle: str, *, require_rootfs: bool = True) -> Config:
    """Schema, then Linux semantics. `require_rootfs=False` skips the filesystem checks (unit tests)."""
    check_schema(raw)
    bundle = os.path.abspath(bundle)
    root = raw.get("root")
    if not root:
        raise ConfigError("root", "is required on Linux")
    rootfs = root["path"]
    if not os.path.isabs(rootfs):
        rootfs = os.path.join(bundle, rootfs)
    rootfs = os.path.normpath(rootfs)
    if require_rootfs:
        if not os.path.exists(rootfs):
            raise ConfigError("root.path", f"rootfs {rootfs} does not exist")
        if not os.path.isdir(rootfs):
            raise ConfigError("root.path", f"rootfs {rootfs} is not a directory")
        real = os.path.realpath(rootfs)
        if real != rootfs:
            # as runc: the container's / is never reached through a symlink (it could point anywhere, / itself)
            raise ConfigError("root.path", f"rootfs {rootfs} is reached through a symlink (it resolves to {real}); "
                                           f"give the real path")
    cfg = Config(raw=raw, bundle=bundle, rootfs=rootfs)
    _check_process(raw.get("process"), "process", create=True)
    _check_linux(cfg)
    _check_mounts(raw.get("mounts") or [])
    _check_idmap(cfg)
    _check_hooks(raw.get("hooks") or {})
    return cfg


def check_process(process: Any) -> None:
    """Checks an exec process object (`husk exec --process`): schema of the process part plus semantics."""
    check_schema({"ociVersion": "1.0.0", "process": process})
    _check_process(process, "process", create=False)


def _check_process(proc: dict[str, Any] | None, where: str, *, create: bool) -> None:
    if proc is None:
        raise ConfigError(where, "is required to create a container")
    args = proc.get("args")
    if not args:
        raise ConfigError(f"{where}.args", "must have at least one entry on Linux")
    _check_exec_size(proc, where)
    if not os.path.isabs(proc["cwd"]):
        raise ConfigError(f"{where}.cwd", f"{proc['cwd']!r} is not an absolute path")
    for i, env in enumerate(proc.get("env") or []):
        if "=" not in env:
            raise ConfigError(f"{where}.env[{i}]", f"{env!r} is not KEY=value")
    caps = proc.get("capabilities") or {}
    for kind in CAP_SETS:
        for i, name in enumerate(caps.get(kind) or []):
            if name not in CAP_NUMBER:
                raise ConfigError(f"{where}.capabilities.{kind}[{i}]", f"unknown capability {name!r}")
    seen: set[str] = set()
    for i, rl in enumerate(proc.get("rlimits") or []):
        t = rl["type"]
        if t not in RLIMITS:
            raise ConfigError(f"{where}.rlimits[{i}].type", f"unknown rlimit {t!r}")
        if t in seen:
            raise ConfigError(f"{where}.rlimits[{i}].type", f"{t} is given more than once")
        seen.add(t)
        if rl["soft"] > rl["hard"]:
            raise ConfigError(f"{where}.rlimits[{i}]", f"soft limit {rl['soft']} exceeds hard limit {rl['hard']}")
    if proc.get("terminal") is not None and not isinstance(proc.get("terminal"), bool):
        raise ConfigError(f"{where}.terminal", "must be a boolean")
    if proc.get("selinuxLabel"):
        # as runc: a label that cannot be applied is an error, never a silently unconfined process
        raise ConfigError(f"{where}.selinuxLabel", selinux_refusal())


def selinux_enabled() -> bool:
    return os.path.exists("/sys/fs/selinux/enforce")


def selinux_refusal() -> str:
    if not selinux_enabled():
        return "an SELinux label is set but SELinux is disabled or not supported on this host (as runc refuses)"
    return "husk does not apply SELinux labels (`husk features` reports selinux.enabled false)"


MAX_ARG_STRLEN = 32 * 4096  # the kernel's limit on one argument or environment string, NUL included


def _check_exec_size(proc: dict[str, Any], where: str) -> None:
    """execve(2) would refuse these args and env with E2BIG once the container starts: say so at create instead.
    The kernel allows a quarter of the stack rlimit (at most 6 MiB, at least 128 KiB) for the strings and
    their pointers, and 128 KiB for any one string."""
    strings = [*proc["args"], *(proc.get("env") or [])]
    total = 0
    for i, item in enumerate(strings):
        n = len(item.encode(errors="surrogateescape")) + 1
        if "\0" in item:
            kind, j = ("args", i) if i < len(proc["args"]) else ("env", i - len(proc["args"]))
            raise ConfigError(f"{where}.{kind}[{j}]", "contains a NUL character")
        if n > MAX_ARG_STRLEN:
            kind, j = ("args", i) if i < len(proc["args"]) else ("env", i - len(proc["args"]))
            raise ConfigError(f"{where}.{kind}[{j}]", f"is {n - 1} bytes; execve takes at most {MAX_ARG_STRLEN - 1}")
        total += n + 8
    total += len(proc["args"][0]) + 1 + 64  # the program's path is copied too; HOME may be added
    import resource
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    for rl in proc.get("rlimits") or []:
        if rl.get("type") == "RLIMIT_STACK":
            stack = rl["soft"]
    limit = 6 << 20 if stack == resource.RLIM_INFINITY or stack >= 24 << 20 else stack // 4
    limit = max(limit, 128 << 10)
    if total > limit:
        raise ConfigError(f"{where}.env", f"{len(proc.get('env') or [])} variables and {len(proc['args'])} "
                                          f"arguments need {total} bytes for execve, more than the {limit} the "
                                          f"kernel allows (a quarter of the stack rlimit): the process could never "
                                          f"start")


# sysctl prefixes -> the namespace they belong to (from the kernel's namespaced sysctls)
_IPC_SYSCTLS = ("kernel.msgmax", "kernel.msgmnb", "kernel.msgmni", "kernel.sem", "kernel.shmall",
                "kernel.shmmax", "kernel.shmmni", "kernel.shm_rmid_forced")


def _check_linux(cfg: Config) -> None:
    linux = cfg.linux
    seen: dict[str, int] = {}
    for i, ns in enumerate(linux.get("namespaces") or []):
        t = ns["type"]
        if t in seen:
            raise ConfigError(f"linux.namespaces[{i}].type", f"namespace {t!r} is listed twice")
        seen[t] = i
        path = ns.get("path")
        if path is not None and path != "":
            if not os.path.isabs(path):
                raise ConfigError(f"linux.namespaces[{i}].path", f"{path!r} is not an absolute path")
        else:
            path = None
        if t == "time" and not os.path.exists("/proc/self/ns/time"):
            raise ConfigError(f"linux.namespaces[{i}].type", "this kernel has no time namespace")
        cfg.namespaces.append(Namespace(t, path))
    user = cfg.ns("user")
    has_maps = bool(linux.get("uidMappings") or linux.get("gidMappings"))
    if user is not None and user.path is None:
        if not linux.get("uidMappings"):
            raise ConfigError("linux.uidMappings", "a new user namespace needs uidMappings")
        if not linux.get("gidMappings"):
            raise ConfigError("linux.gidMappings", "a new user namespace needs gidMappings")
    elif has_maps:
        raise ConfigError("linux.uidMappings", "uid/gid mappings are given but no new user namespace is requested")
    if linux.get("timeOffsets") and not cfg.new_ns("time"):
        raise ConfigError("linux.timeOffsets", "time offsets need a new time namespace")
    # a uts namespace joined by path is allowed too (runc sets the name in it)
    if cfg.raw.get("hostname") and cfg.ns("uts") is None:
        raise ConfigError("hostname", "setting the hostname needs a uts namespace")
    if cfg.raw.get("domainname") and cfg.ns("uts") is None:
        raise ConfigError("domainname", "setting the domainname needs a uts namespace")
    for key in (linux.get("sysctl") or {}):
        where = f"linux.sysctl.{key}"
        if key.startswith("net."):
            if cfg.ns("network") is None:
                raise ConfigError(where, "a net.* sysctl needs a network namespace")
        elif key in _IPC_SYSCTLS or key.startswith("fs.mqueue."):
            if cfg.ns("ipc") is None:
                raise ConfigError(where, "an ipc sysctl needs an ipc namespace")
        elif key in ("kernel.hostname", "kernel.domainname"):
            raise ConfigError(where, "set the hostname with the hostname/domainname fields")
        else:
            raise ConfigError(where, "is not a namespaced sysctl: it would change the host")
    for kind in ("maskedPaths", "readonlyPaths"):
        for i, p in enumerate(linux.get(kind) or []):
            if not os.path.isabs(p):
                raise ConfigError(f"linux.{kind}[{i}]", f"{p!r} is not an absolute path")
    for i, d in enumerate(linux.get("devices") or []):
        if not os.path.isabs(d["path"]):
            raise ConfigError(f"linux.devices[{i}].path", f"{d['path']!r} is not an absolute path")
        if d["type"] in "cbu" and ("major" not in d or "minor" not in d):
            raise ConfigError(f"linux.devices[{i}]", f"device type {d['type']!r} needs major and minor")
    res = linux.get("resources") or {}
    for i, d in enumerate(res.get("devices") or []):
        if d.get("type", "a") not in "abc":
            raise ConfigError(f"linux.resources.devices[{i}].type", "must be a, b or c")
    cg = linux.get("cgroupsPath")
    if cg and ".." in cg.split("/"):
        raise ConfigError("linux.cgroupsPath", f"{cg!r} must not contain '..'")
    if linux.get("seccomp"):
        try:
            from runtime import seccomp  # written by the seccomp engineer; imported only when a profile is set
        except ImportError:
            raise ConfigError("linux.seccomp", "seccomp support (runtime.seccomp) is not installed") from None
        # SCMP_ACT_NOTIFY is supported: the runtime hands the listener fd to listenerPath (seccomp_notify.py)
        seccomp.validate(linux["seccomp"], allow_notify=True)
    if linux.get("mountLabel") and selinux_enabled():
        # without SELinux the label means nothing and is ignored (as crun; runc 1.1 passes context= and fails)
        raise ConfigError("linux.mountLabel", selinux_refusal())
    for key in ("intelRdt", "netDevices", "memoryPolicy"):
        if linux.get(key):
            raise ConfigError(f"linux.{key}", "is not supported by husk")
    if (linux.get("personality") or {}).get("flags"):
        raise ConfigError("linux.personality.flags", "personality flags are not supported by husk")
    sched = (cfg.process.get("scheduler") or {})
    if sched and (sched.get("policy") == "SCHED_DEADLINE" or sched.get("flags") or sched.get("runtime")
                  or sched.get("deadline")):
        raise ConfigError("process.scheduler", "SCHED_DEADLINE, flags, runtime and deadline need sched_setattr, "
                                               "which husk does not implement")
    aff = cfg.process.get("execCPUAffinity") or {}
    for k in ("initial", "final"):
        if aff.get(k):
            from runtime.process import parse_cpu_list
            try:
                parse_cpu_list(aff[k])
            except ValueError as e:
                raise ConfigError(f"process.execCPUAffinity.{k}", f"{aff[k]!r}: {e}") from None
    if linux.get("personality"):
        dom = linux["personality"].get("domain")
        if dom not in ("LINUX", "LINUX32"):
            raise ConfigError("linux.personality.domain", f"unknown domain {dom!r}")


def _check_mounts(mounts: list[dict[str, Any]]) -> None:
    for i, m in enumerate(mounts):
        dest = m["destination"]
        if not os.path.isabs(dest):
            raise ConfigError(f"mounts[{i}].destination", f"{dest!r} is not an absolute path")
        if ".." in dest.split("/"):
            raise ConfigError(f"mounts[{i}].destination", f"{dest!r} must not contain '..'")
        mtype = m.get("type")
        opts = m.get("options") or []
        is_bind = mtype == "bind" or "bind" in opts or "rbind" in opts
        if is_bind and not m.get("source"):
            raise ConfigError(f"mounts[{i}].source", "a bind mount needs a source")


IDMAP_ROOTFS_ANNOTATION = "org.husk.rootfs.idmap"   # "true": the rootfs is idmapped too (husk-cri sets it)


def mount_idmap(m: dict[str, Any]) -> str | None:
    """"idmap", "ridmap" or None: how mounts[i] is to be idmapped (mappings without an option mean idmap)."""
    opts = m.get("options") or []
    if "ridmap" in opts:
        return "ridmap"
    if "idmap" in opts or m.get("uidMappings") or m.get("gidMappings"):
        return "idmap"
    return None


def rootfs_idmap_wanted(raw: dict[str, Any]) -> bool:
    return str((raw.get("annotations") or {}).get(IDMAP_ROOTFS_ANNOTATION, "")).lower() == "true"


def idmap_wanted(raw: dict[str, Any]) -> bool:
    """The config has idmapped mounts (runtime/idmap.py makes them; imported only then)."""
    return rootfs_idmap_wanted(raw) or any(mount_idmap(m) for m in raw.get("mounts") or [])


def _check_idmap(cfg: Config) -> None:
    """Idmapped mounts (runtime/idmap.py): bind mounts only; both mappings or none (then the container's)."""
    has_userns = cfg.ns("user") is not None
    for i, m in enumerate(cfg.raw.get("mounts") or []):
        kind = mount_idmap(m)
        if kind is None:
            continue
        opts = m.get("options") or []
        if not (m.get("type") == "bind" or "bind" in opts or "rbind" in opts):
            raise ConfigError(f"mounts[{i}]", f"{kind}: only a bind mount can be idmapped")
        if bool(m.get("uidMappings")) != bool(m.get("gidMappings")):
            raise ConfigError(f"mounts[{i}]", "an idmapped mount needs both uidMappings and gidMappings")
        if not m.get("uidMappings") and not has_userns:
            raise ConfigError(f"mounts[{i}]", f"{kind} without uidMappings/gidMappings takes the container's user "
                                              f"namespace mappings, but linux.namespaces has no user namespace")
    if rootfs_idmap_wanted(cfg.raw) and not has_userns:
        raise ConfigError(f"annotations.{IDMAP_ROOTFS_ANNOTATION}",
                          "an idmapped rootfs takes the container's user namespace mappings, but linux.namespaces "
                          "has no user namespace")


def _check_hooks(hooks: dict[str, list[dict[str, Any]]]) -> None:
    for kind in HOOK_KINDS:
        for i, h in enumerate(hooks.get(kind) or []):
            if not os.path.isabs(h["path"]):
                raise ConfigError(f"hooks.{kind}[{i}].path", f"{h['path']!r} is not an absolute path")


def known_cap_mask(names: list[str]) -> int:
    """Bit mask of the capabilities this kernel knows (names beyond cap_last_cap are skipped, as runc does)."""
    last = syscalls.last_cap()
    mask = 0
    for name in names:
        n = CAP_NUMBER[name]
        if n <= last:
            mask |= 1 << n
    return mask
