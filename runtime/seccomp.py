"""Seccomp for container processes: checks `linux.seccomp`, compiles it once to BPF through libseccomp,
caches the program by the profile's digest and loads it raw with seccomp(2).

It does not decide when to load (the caller does it last, just before execve) and it must not import
libseccomp's binding (runtime/seccomp_lib.py) when a cached program exists beyond reading its version.

Two-phase use, because the cache and libseccomp live on the host's filesystem:
    compiled = prepare(spec["linux"]["seccomp"])   # before pivot_root / setns into the mount namespace
    ...
    install(compiled, no_new_privs)                 # last step before execve
`install(dict, ...)` does both at once for a caller that still sees the host's root.
"""
from __future__ import annotations

import ctypes
import errno as _errno
import json
import os

from runtime.errors import ConfigError, SetupError
from runtime.records import Frozen
from runtime.linux import syscalls

TYPE_CHECKING = False  # importing typing costs ~12 ms; annotations are strings here anyway
if TYPE_CHECKING:
    from collections.abc import Callable

DEFAULT_CACHE_DIR = "/run/husk/seccomp-cache"

# OCI action name -> (kernel SECCOMP_RET_* value, whether it carries an errno in its 16 data bits)
ACT_KILL_PROCESS = 0x80000000
ACT_KILL_THREAD = 0x00000000
ACT_TRAP = 0x00030000
ACT_ERRNO = 0x00050000
ACT_NOTIFY = 0x7FC00000
ACT_TRACE = 0x7FF00000
ACT_LOG = 0x7FFC0000
ACT_ALLOW = 0x7FFF0000
ACTIONS: dict[str, tuple[int, bool]] = {
    "SCMP_ACT_KILL": (ACT_KILL_THREAD, False),
    "SCMP_ACT_KILL_THREAD": (ACT_KILL_THREAD, False),
    "SCMP_ACT_KILL_PROCESS": (ACT_KILL_PROCESS, False),
    "SCMP_ACT_TRAP": (ACT_TRAP, False),
    "SCMP_ACT_ERRNO": (ACT_ERRNO, True),
    "SCMP_ACT_TRACE": (ACT_TRACE, True),
    "SCMP_ACT_ALLOW": (ACT_ALLOW, False),
    "SCMP_ACT_LOG": (ACT_LOG, False),
    "SCMP_ACT_NOTIFY": (ACT_NOTIFY, False),
}

# libseccomp's enum scmp_compare
OPERATORS: dict[str, int] = {
    "SCMP_CMP_NE": 1,
    "SCMP_CMP_LT": 2,
    "SCMP_CMP_LE": 3,
    "SCMP_CMP_EQ": 4,
    "SCMP_CMP_GE": 5,
    "SCMP_CMP_GT": 6,
    "SCMP_CMP_MASKED_EQ": 7,
}

# seccomp(2) SECCOMP_FILTER_FLAG_* (linux/seccomp.h); the OCI names map to the kernel's bits directly
# because the program is loaded raw, not through libseccomp's attributes.
FLAG_TSYNC = 1 << 0
FLAG_LOG = 1 << 1
FLAG_SPEC_ALLOW = 1 << 2
FLAG_NEW_LISTENER = 1 << 3
FLAG_TSYNC_ESRCH = 1 << 4
FLAG_WAIT_KILLABLE_RECV = 1 << 5
FLAGS: dict[str, int] = {
    "SECCOMP_FILTER_FLAG_TSYNC": FLAG_TSYNC,
    "SECCOMP_FILTER_FLAG_LOG": FLAG_LOG,
    "SECCOMP_FILTER_FLAG_SPEC_ALLOW": FLAG_SPEC_ALLOW,
    "SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV": FLAG_WAIT_KILLABLE_RECV,
}

SECCOMP_SET_MODE_FILTER = 1
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
BPF_MAXINSNS = 4096
ERRNO_MAX = 0xFFFF  # the 16 data bits of SECCOMP_RET_ERRNO/TRACE
ARG_COUNT = 6  # struct seccomp_data has six syscall arguments
UINT64_MAX = (1 << 64) - 1

# Syscalls that the runtime itself uses after loading a filter to hand the notify fd to its parent;
# a SCMP_ACT_NOTIFY rule on them would block the handoff forever (runc refuses `write` likewise).
NOTIFY_FORBIDDEN = frozenset({"write", "writev", "sendmsg", "sendto", "read", "recvmsg", "close",
                              "exit", "exit_group", "rt_sigreturn", "socketcall"})

_CACHE_MAGIC = b"HUSKBPF1"
_CACHE_HEADER = len(_CACHE_MAGIC) + 32  # magic + sha256 of the program


# The three records below are small immutable classes (runtime/records.py), not dataclasses: @dataclass costs
# about 1 ms per class when the module is imported, more than loading a cached filter (this is on every start).

class Rule(Frozen):
    """One `syscalls[i]` entry, checked and converted to libseccomp's numbers."""

    __slots__ = ("path", "names", "action", "conditions")
    path: str  # JSON path, for errors
    names: tuple[str, ...]
    action: int
    conditions: tuple[tuple[int, int, int, int], ...]  # (arg index, op, datum_a, datum_b)

    def __init__(self, path: str, names: tuple[str, ...], action: int,
                 conditions: tuple[tuple[int, int, int, int], ...]) -> None:
        self._set(path=path, names=names, action=action, conditions=conditions)


class Profile(Frozen):
    """A checked `linux.seccomp` object. Syscall names are checked against libseccomp separately."""

    __slots__ = ("default_action", "architectures", "flags", "rules", "listener_path", "listener_metadata")
    default_action: int
    architectures: tuple[str, ...]  # OCI names, e.g. SCMP_ARCH_X86_64
    flags: int  # SECCOMP_FILTER_FLAG_* requested by the config
    rules: tuple[Rule, ...]
    listener_path: str | None
    listener_metadata: str | None

    def __init__(self, default_action: int, architectures: tuple[str, ...], flags: int, rules: tuple[Rule, ...],
                 listener_path: str | None, listener_metadata: str | None) -> None:
        self._set(default_action=default_action, architectures=architectures, flags=flags, rules=rules,
                  listener_path=listener_path, listener_metadata=listener_metadata)

    @property
    def uses_notify(self) -> bool:
        return any(r.action == ACT_NOTIFY for r in self.rules)


class CompiledFilter(Frozen):
    """A BPF program ready to load: `program` is raw `struct sock_filter` records."""

    __slots__ = ("program", "flags", "digest", "from_cache", "listener_path", "listener_metadata")
    program: bytes
    flags: int  # the seccomp(2) flags to load it with
    digest: str  # the cache key (hex sha256)
    from_cache: bool
    listener_path: str | None
    listener_metadata: str | None

    def __init__(self, program: bytes, flags: int, digest: str, from_cache: bool,
                 listener_path: str | None = None, listener_metadata: str | None = None) -> None:
        self._set(program=program, flags=flags, digest=digest, from_cache=from_cache,
                  listener_path=listener_path, listener_metadata=listener_metadata)

    @property
    def needs_listener(self) -> bool:
        return bool(self.flags & FLAG_NEW_LISTENER)

    @property
    def instructions(self) -> int:
        return len(self.program) // 8


# --- parsing and validation ----------------------------------------------------------------

def _is_uint(value: object, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit


def _action(name: object, errno_ret: object, path: str, errno_path: str) -> int:
    if not isinstance(name, str):
        raise ConfigError(path, f"must be a string, not {type(name).__name__}")
    try:
        base, takes_errno = ACTIONS[name]
    except KeyError:
        raise ConfigError(path, f"unknown action {name!r} (known: {', '.join(ACTIONS)})") from None
    if errno_ret is None:
        return base | _errno.EPERM if takes_errno else base
    if not takes_errno:
        raise ConfigError(errno_path, f"{name} does not take an errno (only SCMP_ACT_ERRNO and SCMP_ACT_TRACE do)")
    if not _is_uint(errno_ret, ERRNO_MAX):
        raise ConfigError(errno_path, f"must be an integer from 0 to {ERRNO_MAX}, not {errno_ret!r}")
    return base | int(errno_ret)  # type: ignore[call-overload]


def _string_list(value: object, path: str, *, non_empty: bool = False) -> list[str]:
    if not isinstance(value, list):
        raise ConfigError(path, f"must be an array, not {type(value).__name__}")
    if non_empty and not value:
        raise ConfigError(path, "must contain at least one entry")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item or "\0" in item:
            raise ConfigError(f"{path}[{i}]", f"must be a non-empty string without NUL, not {item!r}")
    return value


def _conditions(args: object, path: str) -> tuple[tuple[int, int, int, int], ...]:
    if args is None:
        return ()
    if not isinstance(args, list):
        raise ConfigError(path, f"must be an array, not {type(args).__name__}")
    out = []
    for i, arg in enumerate(args):
        p = f"{path}[{i}]"
        if not isinstance(arg, dict):
            raise ConfigError(p, f"must be an object, not {type(arg).__name__}")
        index, value, value_two, op = arg.get("index"), arg.get("value"), arg.get("valueTwo", 0), arg.get("op")
        if not _is_uint(index, ARG_COUNT - 1):
            raise ConfigError(f"{p}.index", f"must be an argument index from 0 to {ARG_COUNT - 1}, not {index!r}")
        if not _is_uint(value, UINT64_MAX):
            raise ConfigError(f"{p}.value", f"must be an unsigned 64-bit integer, not {value!r}")
        if not _is_uint(value_two, UINT64_MAX):
            raise ConfigError(f"{p}.valueTwo", f"must be an unsigned 64-bit integer, not {value_two!r}")
        if not isinstance(op, str) or op not in OPERATORS:
            raise ConfigError(f"{p}.op", f"unknown operator {op!r} (known: {', '.join(OPERATORS)})")
        out.append((int(index), OPERATORS[op], int(value), int(value_two)))  # type: ignore[arg-type]
    return tuple(out)


def parse(seccomp: object, *, path: str = "linux.seccomp") -> Profile:
    """Checks the structure and the values of a `linux.seccomp` object (pure Python, no libseccomp).
    Unknown properties are ignored, as the runtime spec requires of every reader of config.json."""
    if not isinstance(seccomp, dict):
        raise ConfigError(path, f"must be an object, not {type(seccomp).__name__}")
    if "defaultAction" not in seccomp:
        raise ConfigError(f"{path}.defaultAction", "is required")
    default = _action(seccomp["defaultAction"], seccomp.get("defaultErrnoRet"), f"{path}.defaultAction",
                      f"{path}.defaultErrnoRet")
    if default == ACT_NOTIFY:
        raise ConfigError(f"{path}.defaultAction", "SCMP_ACT_NOTIFY cannot be the default action")

    arches = _string_list(seccomp.get("architectures", []), f"{path}.architectures")
    for i, arch in enumerate(arches):
        if not arch.startswith("SCMP_ARCH_"):
            raise ConfigError(f"{path}.architectures[{i}]", f"unknown architecture {arch!r}")

    flags = 0
    for i, flag in enumerate(_string_list(seccomp.get("flags", []), f"{path}.flags")):
        if flag not in FLAGS:
            raise ConfigError(f"{path}.flags[{i}]", f"unknown flag {flag!r} (known: {', '.join(FLAGS)})")
        flags |= FLAGS[flag]

    listener_path = seccomp.get("listenerPath")
    if listener_path is not None and (not isinstance(listener_path, str) or not listener_path
                                      or "\0" in listener_path):
        raise ConfigError(f"{path}.listenerPath", f"must be a non-empty path, not {listener_path!r}")
    metadata = seccomp.get("listenerMetadata")
    if metadata is not None:
        if not isinstance(metadata, str):
            raise ConfigError(f"{path}.listenerMetadata", f"must be a string, not {type(metadata).__name__}")
        if listener_path is None:
            raise ConfigError(f"{path}.listenerMetadata", "must not be set without listenerPath")

    entries = seccomp.get("syscalls", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}.syscalls", f"must be an array, not {type(entries).__name__}")
    rules = []
    for i, entry in enumerate(entries):
        p = f"{path}.syscalls[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(p, f"must be an object, not {type(entry).__name__}")
        if "names" not in entry:
            raise ConfigError(f"{p}.names", "is required")
        if "action" not in entry:
            raise ConfigError(f"{p}.action", "is required")
        names = _string_list(entry["names"], f"{p}.names", non_empty=True)
        action = _action(entry["action"], entry.get("errnoRet"), f"{p}.action", f"{p}.errnoRet")
        if action == ACT_NOTIFY:
            if listener_path is None:
                raise ConfigError(f"{p}.action", "SCMP_ACT_NOTIFY needs linux.seccomp.listenerPath")
            for j, name in enumerate(names):
                if name in NOTIFY_FORBIDDEN:
                    raise ConfigError(f"{p}.names[{j}]", f"SCMP_ACT_NOTIFY cannot be used for {name!r}: the runtime "
                                                         "needs it to hand the listener fd over")
        rules.append(Rule(p, tuple(names), action, _conditions(entry.get("args"), f"{p}.args")))

    profile = Profile(default, tuple(arches), flags, tuple(rules), listener_path, metadata)
    if flags & FLAG_WAIT_KILLABLE_RECV and not profile.uses_notify:
        # The kernel accepts this flag only together with a listener (NEW_LISTENER).
        raise ConfigError(f"{path}.flags", "SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV needs a SCMP_ACT_NOTIFY rule")
    return profile


def _check_names(profile: Profile, path: str) -> None:
    """Every architecture and syscall name must be known to libseccomp (a name known only for other
    architectures than the filter's is fine: libseccomp leaves it out of those architectures)."""
    from runtime import seccomp_lib as lib

    for i, arch in enumerate(profile.architectures):
        if lib.arch_token(arch[len("SCMP_ARCH_"):].lower()) == 0:
            raise ConfigError(f"{path}.architectures[{i}]",
                              f"unknown architecture {arch!r} (libseccomp {lib.version()})")
    for rule in profile.rules:
        for j, name in enumerate(rule.names):
            if lib.resolve_syscall(name) == lib.NR_SCMP_ERROR:
                raise ConfigError(f"{rule.path}.names[{j}]",
                                  f"unknown syscall {name!r} (libseccomp {lib.version()} knows it on no architecture)")


def validate(seccomp: dict, *, allow_notify: bool = False, path: str = "linux.seccomp") -> None:
    """Checks a `linux.seccomp` object semantically; raises ConfigError(json path, reason).

    SCMP_ACT_NOTIFY is refused unless the caller says it hands the listener fd to `listenerPath`
    (`allow_notify=True`); this module provides the pieces (install's `on_listener`, seccomp_notify).
    """
    profile = parse(seccomp, path=path)
    if profile.uses_notify and not allow_notify:
        rule = next(r for r in profile.rules if r.action == ACT_NOTIFY)
        raise ConfigError(f"{rule.path}.action", "SCMP_ACT_NOTIFY is not supported by this runtime's caller "
                                                 "(no seccomp listener handoff)")
    _check_names(profile, path)


# --- compiling -----------------------------------------------------------------------------

def _condition_groups(conditions: tuple[tuple[int, int, int, int], ...]) -> list[list[tuple[int, int, int, int]]]:
    """Conditions on distinct arguments form one rule (ANDed). libseccomp refuses two comparisons of the
    same argument in one rule, so then each condition becomes its own rule (ORed), as runc does."""
    indexes = [c[0] for c in conditions]
    if len(set(indexes)) != len(indexes):
        return [[c] for c in conditions]
    return [list(conditions)]


def compile_profile(profile: Profile, *, path: str = "linux.seccomp") -> bytes:
    """Builds the BPF program with libseccomp (no_new_privs attribute off) and returns its raw bytes."""
    from runtime import seccomp_lib as lib

    _check_names(profile, path)
    with lib.FilterContext(profile.default_action) as ctx:
        # no_new_privs follows process.noNewPrivileges (install's parameter), never libseccomp's default.
        ctx.set_attr(lib.ATTR_CTL_NNP, 0)
        for arch in profile.architectures:
            ctx.add_arch(lib.arch_token(arch[len("SCMP_ARCH_"):].lower()))
        for rule in profile.rules:
            if rule.action == profile.default_action:
                continue  # libseccomp refuses rules that repeat the default action; they change nothing
            groups = _condition_groups(rule.conditions)
            for j, name in enumerate(rule.names):
                nr = lib.resolve_syscall(name)
                for group in groups:
                    try:
                        ctx.add_rule(rule.action, nr, group)
                    except lib.LibseccompError as err:
                        raise ConfigError(f"{rule.path}.names[{j}]",
                                          f"libseccomp refused the rule for {name!r}: {err.strerror}") from None
        program = ctx.export_bpf()
    if not program or len(program) % 8:
        raise SetupError(f"libseccomp exported a malformed BPF program ({len(program)} bytes)")
    if len(program) // 8 > BPF_MAXINSNS:
        raise ConfigError(path, f"the profile compiles to {len(program) // 8} BPF instructions, "
                                f"more than the kernel's limit of {BPF_MAXINSNS}")
    return program


def _load_flags(profile: Profile) -> int:
    flags = profile.flags
    if profile.uses_notify:
        flags |= FLAG_NEW_LISTENER
        if flags & FLAG_TSYNC:
            flags |= FLAG_TSYNC_ESRCH  # the kernel refuses TSYNC with a listener unless ESRCH reporting is asked
    return flags


# --- the cache -----------------------------------------------------------------------------

def _sha256(data: bytes) -> str:
    # _sha2 (3.12+) / _sha256 (3.11) cost ~1 ms to import; hashlib pulls OpenSSL in (~6 ms).
    try:
        from _sha2 import sha256  # type: ignore[import-not-found]
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found,no-redef]
        except ImportError:
            from hashlib import sha256  # type: ignore[assignment]
    return sha256(data).hexdigest()


def profile_digest(seccomp: dict, libseccomp_version: str) -> str:
    """The cache key: sha256 over the canonical JSON of everything that shapes the program, the
    libseccomp version, and the machine and kernel (libseccomp's output depends on the kernel's API level).
    flags and the listener fields only change how the program is loaded, so they are left out."""
    shaping = {k: v for k, v in seccomp.items() if k not in ("flags", "listenerPath", "listenerMetadata")}
    uname = os.uname()
    material = "\0".join(("husk-seccomp-1", json.dumps(shaping, sort_keys=True, separators=(",", ":")),
                          libseccomp_version, uname.machine, uname.release))
    return _sha256(material.encode())


def _cache_path(cache_dir: str, digest: str) -> str:
    return os.path.join(cache_dir, digest + ".bpf")


def read_cached(cache_dir: str, digest: str) -> bytes | None:
    """The cached program, or None when absent, not ours, or corrupt (the caller then compiles)."""
    try:
        fd = os.open(_cache_path(cache_dir, digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        # Only trust a file that nobody but us could have written: the kernel will run it.
        if st.st_uid != os.geteuid() or st.st_mode & 0o022 or st.st_size > _CACHE_HEADER + 8 * BPF_MAXINSNS:
            return None
        data = os.read(fd, st.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    program = data[_CACHE_HEADER:]
    if (data[:len(_CACHE_MAGIC)] != _CACHE_MAGIC or not program or len(program) % 8
            or bytes.fromhex(_sha256(program)) != data[len(_CACHE_MAGIC):_CACHE_HEADER]):
        return None
    return program


def write_cached(cache_dir: str, digest: str, program: bytes) -> bool:
    """Stores the program atomically (temp file + rename). Failing to cache is not an error: the
    container still starts, the next start just compiles again."""
    from runtime.fsutil import atomic_write
    final = _cache_path(cache_dir, digest)
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        # a cache: a file lost in a crash is compiled again, so no fsync (the entry is checksummed on read)
        atomic_write(final, _CACHE_MAGIC + bytes.fromhex(_sha256(program)) + program, mode=0o600, durable=False)
        return True
    except OSError as err:
        import logging

        logging.getLogger("husk.seccomp").warning("cannot cache seccomp program %s in %s: %s", digest, cache_dir, err)
        return False


# --- preparing and loading -----------------------------------------------------------------

def prepare(seccomp: dict, *, cache_dir: str | None = DEFAULT_CACHE_DIR, path: str = "linux.seccomp") -> CompiledFilter:
    """Returns the program for this profile: from the cache when a valid entry exists, otherwise compiled
    with libseccomp and stored. `cache_dir=None` disables the cache. Call it while the host's root
    (cache, libseccomp.so) is still visible."""
    profile = parse(seccomp, path=path)
    from runtime import seccomp_lib as lib  # dlopen only; the cached path calls nothing but version()

    digest = profile_digest(seccomp, lib.version())
    flags = _load_flags(profile)
    program = read_cached(cache_dir, digest) if cache_dir else None
    from_cache = program is not None
    if program is None:
        program = compile_profile(profile, path=path)
        if cache_dir:
            write_cached(cache_dir, digest, program)
    return CompiledFilter(program, flags, digest, from_cache, profile.listener_path, profile.listener_metadata)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load(compiled: CompiledFilter, no_new_privs: bool) -> int | None:
    """Loads the program into the calling thread (all threads with TSYNC). Sets no_new_privs first when
    asked; without it the process needs CAP_SYS_ADMIN. Returns the listener fd for SCMP_ACT_NOTIFY."""
    n = compiled.instructions
    if not 0 < n <= BPF_MAXINSNS or len(compiled.program) % 8:
        raise SetupError(f"loading the seccomp filter: not a BPF program ({len(compiled.program)} bytes)")
    if no_new_privs:
        syscalls.set_no_new_privs()
    buf = ctypes.create_string_buffer(compiled.program, len(compiled.program))
    prog = _SockFprog(n, ctypes.addressof(buf))
    try:
        ret = syscalls.raw_syscall(syscalls.SYS_seccomp, ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
                                   ctypes.c_uint(compiled.flags), ctypes.byref(prog))
    except OSError as err:
        if err.errno == _errno.ENOSYS and compiled.flags == 0:
            # Kernels before 3.17 have no seccomp(2); prctl takes the same program without flags.
            syscalls.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog))
            return None
        if err.errno == _errno.EACCES:
            raise SetupError("loading the seccomp filter: no_new_privs is off and the process lacks "
                             "CAP_SYS_ADMIN (set process.noNewPrivileges or keep CAP_SYS_ADMIN until the load)") from err
        if err.errno == _errno.EINVAL:
            raise SetupError(f"loading the seccomp filter: the kernel refused it (flags {compiled.flags:#x}, "
                             f"{compiled.instructions} instructions): {err.strerror}") from err
        if err.errno == _errno.EBUSY:
            raise SetupError("loading the seccomp filter: a listener already exists in this process "
                             "(only one SCMP_ACT_NOTIFY filter may be installed)") from err
        raise SetupError(f"loading the seccomp filter: {err.strerror}") from err
    if compiled.needs_listener:
        return ret
    if ret != 0:
        # With TSYNC (and no listener) the kernel reports a thread it could not synchronise by its id.
        raise SetupError(f"loading the seccomp filter: thread {ret} could not be synchronised (TSYNC)")
    return None


def install(seccomp: dict | CompiledFilter, no_new_privs: bool, *, cache_dir: str | None = DEFAULT_CACHE_DIR,
            on_listener: Callable[[int, CompiledFilter], None] | None = None) -> None:
    """Loads the filter into the calling (single-threaded) process, as the last step before execve.

    `seccomp` is the OCI object (prepared here through the cache) or what prepare() returned earlier.
    With no_new_privs False the kernel demands CAP_SYS_ADMIN, so such a caller loads before dropping
    capabilities (as runc does) and the profile must then allow the syscalls that remain before execve.
    For a profile with SCMP_ACT_NOTIFY, `on_listener(fd, compiled)` must hand the listener fd on (see
    runtime.seccomp_notify); the fd is closed afterwards. Without a handler such a profile is refused
    before anything is loaded.
    """
    compiled = seccomp if isinstance(seccomp, CompiledFilter) else prepare(seccomp, cache_dir=cache_dir)
    if compiled.needs_listener and on_listener is None:
        raise SetupError("the seccomp profile uses SCMP_ACT_NOTIFY but no listener handler was given")
    fd = load(compiled, no_new_privs)
    if fd is not None:
        try:
            on_listener(fd, compiled)  # type: ignore[misc]
        finally:
            os.close(fd)


def default_profile(capabilities: list[str] | None = None, machine: str | None = None) -> dict:
    """The RuntimeDefault profile (see runtime.seccomp_default)."""
    from runtime import seccomp_default

    return seccomp_default.default_profile(capabilities, machine)
