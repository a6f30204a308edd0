"""The device filter generator: rule validation, and the bytecode's decisions against the reference semantics
(run by a small interpreter of the emitted bytes, so no root or kernel is needed)."""
from __future__ import annotations

import itertools
import random

import pytest

from runtime.cgroups import bpf_devices as bd
from runtime.errors import ConfigError
from tests.unit import bpf_interp

B, C = bd.DEV_BLOCK, bd.DEV_CHAR
R, W, M = bd.ACC_READ, bd.ACC_WRITE, bd.ACC_MKNOD

# What runc and containerd give a container: deny everything, then the usual character devices.
DEFAULT_CONTAINER = [
    {"allow": False, "access": "rwm"},
    {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"},     # /dev/null
    {"allow": True, "type": "c", "major": 1, "minor": 5, "access": "rwm"},     # /dev/zero
    {"allow": True, "type": "c", "major": 1, "minor": 9, "access": "rwm"},     # /dev/urandom
    {"allow": True, "type": "c", "major": 5, "minor": 0, "access": "rwm"},     # /dev/tty
    {"allow": True, "type": "c", "major": 136, "access": "rwm"},               # /dev/pts/*
    {"allow": True, "type": "c", "major": 10, "minor": 200, "access": "rwm"},  # /dev/net/tun
    {"allow": True, "type": "c", "access": "m"},                                # mknod of any char device
    {"allow": True, "type": "b", "access": "m"},
]


def program_for(devices):
    return bd.encode(bd.compile_rules(bd.parse_rules(devices)))


def allowed(devices, dev_type, major, minor, access) -> bool:
    return bpf_interp.run(program_for(devices), dev_type, access, major, minor) == 1


@pytest.mark.parametrize("dev_type,major,minor,access,expected", [
    (C, 1, 3, R | W, True),
    (C, 1, 3, M, True),
    (C, 1, 7, R, False),            # /dev/full is not in the list
    (C, 136, 4, R | W, True),       # any pts
    (C, 137, 4, R, False),
    (B, 8, 0, R, False),            # no block device may be opened
    (B, 8, 0, M, True),             # but may be created
    (C, 4, 1, M, True),
    (C, 4, 1, M | R, False),        # mknod is allowed, reading is not: the whole request is refused
])
def test_default_container_list(dev_type, major, minor, access, expected) -> None:
    assert allowed(DEFAULT_CONTAINER, dev_type, major, minor, access) is expected


def test_no_rules_denies_everything() -> None:
    for dev_type, access in itertools.product((B, C), (R, W, M, R | W | M)):
        assert not allowed([], dev_type, 1, 3, access)


def test_allow_all_then_deny_write_of_one_device() -> None:
    devices = [{"allow": True, "access": "rwm"}, {"allow": False, "type": "c", "major": 1, "minor": 3,
                                                  "access": "w"}]
    assert allowed(devices, C, 1, 3, R)
    assert not allowed(devices, C, 1, 3, W)
    assert not allowed(devices, C, 1, 3, R | W)     # O_RDWR asks for both at once
    assert allowed(devices, C, 1, 5, R | W)
    assert allowed(devices, B, 1, 3, W)              # the deny names char devices only


def test_later_allow_overrides_earlier_deny_per_bit() -> None:
    devices = [{"allow": False, "type": "c", "major": 1, "minor": 3, "access": "rw"},
               {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "r"}]
    assert allowed(devices, C, 1, 3, R)
    assert not allowed(devices, C, 1, 3, R | W)
    assert not allowed(devices, C, 1, 3, M)          # nothing allows mknod


def test_bits_allowed_by_separate_rules_combine() -> None:
    devices = [{"allow": True, "type": "c", "major": 1, "minor": 3, "access": "r"},
               {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "w"}]
    assert allowed(devices, C, 1, 3, R | W)


def test_rules_before_a_catch_all_are_not_emitted() -> None:
    devices = [{"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
               {"allow": False, "access": "rwm"}]
    insns = bd.compile_rules(bd.parse_rules(devices))
    assert len(insns) == 6 + 2          # prologue + "return 0" of the catch-all; no unreachable tail
    assert not allowed(devices, C, 1, 3, R)


def test_program_ends_with_exit_and_every_jump_lands_inside() -> None:
    insns = bd.compile_rules(bd.parse_rules(DEFAULT_CONTAINER))
    assert insns[-1].code == bd.EXIT
    for i, insn in enumerate(insns):
        if insn.code in (bd.JMP_JEQ_K, bd.JMP_JNE_K):
            assert 0 <= i + 1 + insn.off < len(insns)


def test_random_rule_lists_agree_with_the_reference() -> None:
    rng = random.Random(20240601)
    majors, minors = [None, 1, 5], [None, 3, 7]
    accesses = ["r", "w", "m", "rw", "rm", "wm", "rwm"]
    for _ in range(300):
        devices = []
        for _ in range(rng.randint(0, 6)):
            d = {"allow": rng.random() < 0.6, "type": rng.choice(["a", "b", "c"]), "access": rng.choice(accesses)}
            if (major := rng.choice(majors)) is not None:
                d["major"] = major
            if (minor := rng.choice(minors)) is not None:
                d["minor"] = minor
            devices.append(d)
        rules = bd.parse_rules(devices)
        program = bd.encode(bd.compile_rules(rules))
        for dev_type, major, minor, access in itertools.product((B, C), (1, 5, 8), (3, 7, 9), range(1, 8)):
            want = bd.decide(rules, dev_type, major, minor, access)
            got = bpf_interp.run(program, dev_type, access, major, minor)
            assert got == int(want), (devices, dev_type, major, minor, access)


def test_defaults_for_absent_fields() -> None:
    (rule,) = bd.parse_rules([{"allow": False}])
    assert rule == bd.Rule(False, "a", None, None, bd.ACC_ALL)
    (rule,) = bd.parse_rules([{"allow": True, "type": "c", "major": -1, "minor": 3, "access": ""}])
    assert rule == bd.Rule(True, "c", None, 3, bd.ACC_ALL)


@pytest.mark.parametrize("devices,path", [
    ({"allow": True}, "linux.resources.devices"),
    ([{"allow": "yes"}], "linux.resources.devices[0].allow"),
    ([{"allow": True, "type": "p"}], "linux.resources.devices[0].type"),
    ([{"allow": True}, {"allow": True, "access": "rx"}], "linux.resources.devices[1].access"),
    ([{"allow": True, "major": -2}], "linux.resources.devices[0].major"),
    ([{"allow": True, "minor": 2**31}], "linux.resources.devices[0].minor"),
    ([{"allow": True, "major": "1"}], "linux.resources.devices[0].major"),
])
def test_invalid_rules_name_the_field(devices, path) -> None:
    with pytest.raises(ConfigError) as info:
        bd.parse_rules(devices)
    assert info.value.path == path


def test_encoding_of_one_instruction() -> None:
    # r3 = *(u32 *)(r1 + 4): opcode 0x61, dst 3 in the low nibble, src 1 in the high nibble, off 4, imm 0
    assert bd.Insn(bd.LDX_MEM_W, 3, 1, 4, 0).encode() == bytes([0x61, 0x13, 4, 0, 0, 0, 0, 0])
    assert bd.Insn(bd.ALU32_AND_K, 3, imm=-3).encode() == bytes([0x54, 0x03, 0, 0, 0xFD, 0xFF, 0xFF, 0xFF])


class FakeSyscalls:
    """Stands in for runtime.linux.syscalls: the first load fails with `first_errno`."""
    BPF_PROG_TYPE_CGROUP_DEVICE = 15

    def __init__(self, first_errno: int) -> None:
        self.first_errno = first_errno
        self.limits_seen: list[tuple[int, int]] = []

    def bpf_prog_load(self, *args, **kwargs) -> int:
        import resource
        self.limits_seen.append(resource.getrlimit(resource.RLIMIT_MEMLOCK))
        if len(self.limits_seen) == 1 and self.first_errno:
            raise PermissionError(self.first_errno, "denied")
        return 42


def test_load_retries_with_memlock_raised_and_restores_it() -> None:
    import errno as errno_mod
    import resource
    before = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if before[0] == before[1]:
        if before[1] == 0:
            pytest.skip("RLIMIT_MEMLOCK hard limit is 0")
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, before[1]))
    try:
        start = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        fake = FakeSyscalls(errno_mod.EPERM)
        assert bd._load(fake, b"") == 42
        assert fake.limits_seen == [start, (start[1], start[1])]
        assert resource.getrlimit(resource.RLIMIT_MEMLOCK) == start
        with pytest.raises(OSError):
            bd._load(FakeSyscalls(errno_mod.EINVAL), b"")    # other errors are not retried
    finally:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, before)
