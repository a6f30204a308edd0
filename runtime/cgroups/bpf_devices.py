"""The cgroup v2 device filter: OCI `linux.resources.devices` rules -> a BPF_PROG_TYPE_CGROUP_DEVICE program.

Owns rule validation, the bytecode generator and loading/attaching it (through runtime.linux.syscalls). It must
not read or write other cgroup files; v2.py calls `install` when `devices` is given.

Semantics (the OCI list, in order, last match wins, decided per access bit): for a request of some of
read/write/mknod on a device, each requested bit is decided by the last rule that matches the device's type,
major and minor and names that bit; the request is allowed only if every requested bit is allowed. No matching
rule means deny. So `allow a *:* rwm` then `deny c 1:3 w` allows reading /dev/null and refuses opening it for
writing (also O_RDWR), which v1's exception list cannot express exactly but intends.
"""
from __future__ import annotations

import errno
import os
import struct
TYPE_CHECKING = False  # typing costs ~2 ms to import; mypy treats this name as typing's
if TYPE_CHECKING:
    from typing import Any

from runtime.errors import ConfigError, SetupError
from runtime.records import Frozen
from runtime import logutil

log = logutil.Logger(__name__)

# linux/bpf.h: struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }
# access_type = (access << 16) | type
DEV_BLOCK = 1
DEV_CHAR = 2
ACC_MKNOD = 1
ACC_READ = 2
ACC_WRITE = 4
ACC_ALL = ACC_MKNOD | ACC_READ | ACC_WRITE
_ACCESS_BITS = {"m": ACC_MKNOD, "r": ACC_READ, "w": ACC_WRITE}
_TYPES = {"a": 0, "b": DEV_BLOCK, "c": DEV_CHAR}

# eBPF opcodes used by the generator (and nothing else: the unit tests' interpreter knows exactly these).
LDX_MEM_W = 0x61      # dst = *(u32 *)(src + off)
ALU32_AND_K = 0x54    # dst = (u32)(dst & imm)
ALU32_RSH_K = 0x74    # dst = (u32)dst >> imm
ALU32_MOV_K = 0xB4    # dst = (u32)imm
ALU32_MOV_X = 0xBC    # dst = (u32)src
JMP_JEQ_K = 0x15      # if dst == imm: pc += off
JMP_JNE_K = 0x55      # if dst != imm: pc += off
EXIT = 0x95           # return r0
R0, R1, R2, R3, R4, R5 = range(6)
_MAX_DEV_NUMBER = 2**31 - 1   # compared as 64-bit registers against sign-extended 32-bit immediates


class Rule(Frozen):
    __slots__ = ("allow", "type", "major", "minor", "access")
    allow: bool
    type: str            # "a" (any), "b" or "c"
    major: int | None    # None: any
    minor: int | None
    access: int          # ACC_* bits, never 0

    def matches_everything(self) -> bool:
        return self.type == "a" and self.major is None and self.minor is None and self.access == ACC_ALL


class Insn(Frozen):
    __slots__ = ("code", "dst", "src", "off", "imm")
    _DEFAULTS = {"dst": 0, "src": 0, "off": 0, "imm": 0}
    code: int
    dst: int
    src: int
    off: int
    imm: int

    def encode(self) -> bytes:
        return struct.pack("<BBhi", self.code, (self.src << 4) | self.dst, self.off, self.imm)


def _dev_number(value: Any, path: str) -> int | None:
    if value is None or value == -1:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, f"must be an integer, got {value!r}")
    if not 0 <= value <= _MAX_DEV_NUMBER:
        raise ConfigError(path, f"{value} is out of range (0..{_MAX_DEV_NUMBER}, or -1/absent for any)")
    return value


def parse_rules(devices: Any, path: str = "linux.resources.devices") -> list[Rule]:
    """Validates the OCI device rules. An absent or empty `access` means "rwm"; absent type means "a";
    absent (or -1) major/minor means any."""
    if not isinstance(devices, list):
        raise ConfigError(path, f"must be a list, got {type(devices).__name__}")
    rules = []
    for i, d in enumerate(devices):
        p = f"{path}[{i}]"
        if not isinstance(d, dict):
            raise ConfigError(p, "must be an object")
        allow = d.get("allow")
        if not isinstance(allow, bool):
            raise ConfigError(f"{p}.allow", f"must be true or false, got {allow!r}")
        dtype = d.get("type") or "a"
        if dtype not in _TYPES:
            raise ConfigError(f"{p}.type", f"must be one of a, b, c, got {dtype!r}")
        access_s = d.get("access") or "rwm"
        if not isinstance(access_s, str) or any(c not in _ACCESS_BITS for c in access_s):
            raise ConfigError(f"{p}.access", f"must be letters from 'rwm', got {access_s!r}")
        access = 0
        for c in access_s:
            access |= _ACCESS_BITS[c]
        rules.append(Rule(allow, dtype, _dev_number(d.get("major"), f"{p}.major"),
                          _dev_number(d.get("minor"), f"{p}.minor"), access))
    return rules


def decide(rules: list[Rule], dev_type: int, major: int, minor: int, access: int) -> bool:
    """The reference semantics in plain Python (the generated program must agree with it)."""
    pending = access
    for r in reversed(rules):
        if r.type != "a" and _TYPES[r.type] != dev_type:
            continue
        if (r.major is not None and r.major != major) or (r.minor is not None and r.minor != minor):
            continue
        if not pending & r.access:
            continue
        if not r.allow:
            return False
        pending &= ~r.access
        if not pending:
            return True
    return False


def compile_rules(rules: list[Rule]) -> list[Insn]:
    """The program: a prologue loading type/access/major/minor into r2..r5, then one block per rule from the
    last to the first, then `return 0`. Blocks after a rule that matches every device and access are dropped
    (unreachable code is a verifier error)."""
    blocks: list[list[Insn | tuple[int, int, int]]] = []   # a tuple is a conditional jump to the next block
    falls_through = True
    for r in reversed(rules):
        block: list[Insn | tuple[int, int, int]] = []
        if r.type != "a":
            block.append((JMP_JNE_K, R2, _TYPES[r.type]))
        if r.major is not None:
            block.append((JMP_JNE_K, R4, r.major))
        if r.minor is not None:
            block.append((JMP_JNE_K, R5, r.minor))
        if not r.allow:
            if r.access != ACC_ALL:   # the kernel always asks for at least one bit, so rwm always intersects
                block += [Insn(ALU32_MOV_X, R1, R3), Insn(ALU32_AND_K, R1, imm=r.access), (JMP_JEQ_K, R1, 0)]
            block += [Insn(ALU32_MOV_K, R0, imm=0), Insn(EXIT)]
        elif r.access == ACC_ALL:
            block += [Insn(ALU32_MOV_K, R0, imm=1), Insn(EXIT)]
        else:
            # These bits are decided (allowed); a deny in an earlier rule can no longer take them back.
            block += [Insn(ALU32_AND_K, R3, imm=~r.access), (JMP_JNE_K, R3, 0),
                      Insn(ALU32_MOV_K, R0, imm=1), Insn(EXIT)]
        blocks.append(block)
        if r.matches_everything():
            falls_through = False
            break
    prologue = [
        Insn(LDX_MEM_W, R2, R1, 0), Insn(ALU32_AND_K, R2, imm=0xFFFF),   # device type
        Insn(LDX_MEM_W, R3, R1, 0), Insn(ALU32_RSH_K, R3, imm=16),       # requested access bits
        Insn(LDX_MEM_W, R4, R1, 4),                                      # major
        Insn(LDX_MEM_W, R5, R1, 8),                                      # minor
    ]
    out: list[Insn] = list(prologue)
    for block in blocks:
        next_start = len(out) + len(block)
        for item in block:
            if isinstance(item, tuple):
                code, reg, imm = item
                out.append(Insn(code, reg, 0, next_start - (len(out) + 1), imm))
            else:
                out.append(item)
    if falls_through:
        out += [Insn(ALU32_MOV_K, R0, imm=0), Insn(EXIT)]
    return out


def encode(insns: list[Insn]) -> bytes:
    return b"".join(i.encode() for i in insns)


def install(cgroup_dir: str, rules: list[Rule]) -> None:
    """Loads the program for `rules` and makes it the cgroup's only device program: attach the new one first
    (so there is no moment without a filter), then detach the programs that were there before."""
    from runtime.linux import syscalls as sc

    prog = encode(compile_rules(rules))
    try:
        prog_fd = _load(sc, prog)
    except OSError as e:
        raise SetupError(f"load the device filter for {cgroup_dir}: {e.strerror}") from e
    try:
        dir_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        os.close(prog_fd)
        raise SetupError(f"open {cgroup_dir}: {e.strerror}") from e
    try:
        try:
            flags, old_ids = sc.bpf_prog_query(dir_fd, sc.BPF_CGROUP_DEVICE)
        except OSError as e:
            raise SetupError(f"query the device programs of {cgroup_dir}: {e.strerror}") from e
        if old_ids and not flags & sc.BPF_F_ALLOW_MULTI:
            # Someone attached without ALLOW_MULTI: attaching again in the same mode replaces that program.
            _attach(sc, dir_fd, prog_fd, flags, cgroup_dir)
            return
        _attach(sc, dir_fd, prog_fd, sc.BPF_F_ALLOW_MULTI, cgroup_dir)
        for prog_id in old_ids:
            try:
                old_fd = sc.bpf_prog_get_fd_by_id(prog_id)
            except OSError as e:
                raise SetupError(f"detach the old device program {prog_id} from {cgroup_dir}: {e.strerror}") from e
            try:
                sc.bpf_prog_detach(dir_fd, old_fd, sc.BPF_CGROUP_DEVICE)
            except OSError as e:
                raise SetupError(f"detach the old device program {prog_id} from {cgroup_dir}: {e.strerror}") from e
            finally:
                os.close(old_fd)
        log.debug("device filter on %s: %d rules, %d instructions, replaced %s", cgroup_dir, len(rules),
                  len(prog) // 8, old_ids)
    finally:
        os.close(dir_fd)
        os.close(prog_fd)   # the attachment holds its own reference


def _load(sc: Any, prog: bytes) -> int:
    try:
        return sc.bpf_prog_load(sc.BPF_PROG_TYPE_CGROUP_DEVICE, prog, "Apache", name="husk_devices")
    except OSError as e:
        if e.errno != errno.EPERM:
            raise
    # Kernels before 5.11 charge programs to RLIMIT_MEMLOCK and say EPERM when it is low: retry once with the
    # soft limit at the hard one, then put it back so the container does not inherit the change.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == hard:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM) + " (RLIMIT_MEMLOCK already at its hard limit)")
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
    try:
        return sc.bpf_prog_load(sc.BPF_PROG_TYPE_CGROUP_DEVICE, prog, "Apache", name="husk_devices")
    finally:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, hard))


def _attach(sc: Any, dir_fd: int, prog_fd: int, flags: int, cgroup_dir: str) -> None:
    try:
        sc.bpf_prog_attach(dir_fd, prog_fd, sc.BPF_CGROUP_DEVICE, flags)
    except OSError as e:
        raise SetupError(f"attach the device filter to {cgroup_dir}: {e.strerror}") from e


def attached_program_ids(cgroup_dir: str) -> list[int]:
    """The ids of the device programs attached directly to the cgroup (tests, diagnostics)."""
    from runtime.linux import syscalls as sc

    fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return sc.bpf_prog_query(fd, sc.BPF_CGROUP_DEVICE)[1]
    finally:
        os.close(fd)
