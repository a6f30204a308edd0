"""The RuntimeDefault profile: valid for libseccomp, an allow-list with EPERM, capability-gated syscalls."""
from __future__ import annotations

import errno

import pytest

from runtime import seccomp, seccomp_default


def _names(profile: dict, action: str = "SCMP_ACT_ALLOW", *, conditional: bool | None = False) -> set[str]:
    out: set[str] = set()
    for rule in profile["syscalls"]:
        if rule["action"] != action:
            continue
        if conditional is not None and bool(rule.get("args")) != conditional:
            continue
        out.update(rule["names"])
    return out


def _rules_for(profile: dict, name: str) -> list[dict]:
    return [r for r in profile["syscalls"] if name in r["names"]]


@pytest.mark.parametrize("machine", sorted(seccomp_default._PLATFORMS) + ["unknown-machine"])
def test_profile_is_valid_on_every_platform(machine: str) -> None:
    profile = seccomp.default_profile(machine=machine)
    seccomp.validate(profile)


def test_default_action_is_eperm_and_x86_64_has_three_abis() -> None:
    p = seccomp.default_profile(machine="x86_64")
    assert p["defaultAction"] == "SCMP_ACT_ERRNO" and p["defaultErrnoRet"] == errno.EPERM
    assert p["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    allowed = _names(p)
    assert {"read", "write", "execve", "arch_prctl", "modify_ldt", "chroot", "ptrace", "socketcall"} <= allowed
    for blocked in ("unshare", "mount", "umount2", "keyctl", "add_key", "request_key", "setns", "bpf", "reboot",
                    "init_module", "kexec_load", "open_by_handle_at", "io_uring_setup", "userfaultfd",
                    "perf_event_open", "clock_settime", "sethostname", "acct", "swapon", "pivot_root"):
        assert not _rules_for(p, blocked), blocked


def test_conditional_rules() -> None:
    p = seccomp.default_profile(machine="x86_64")
    personas = sorted(r["args"][0]["value"] for r in _rules_for(p, "personality"))
    assert personas == [0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF]
    assert all(r["args"][0]["op"] == "SCMP_CMP_EQ" for r in _rules_for(p, "personality"))
    (sock,) = _rules_for(p, "socket")
    assert sock["args"] == [{"index": 0, "value": 40, "op": "SCMP_CMP_NE"}]  # not AF_VSOCK
    (clone,) = _rules_for(p, "clone")
    assert clone["args"] == [{"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]
    (clone3,) = _rules_for(p, "clone3")
    assert clone3["action"] == "SCMP_ACT_ERRNO" and clone3["errnoRet"] == errno.ENOSYS


def test_s390_clone_flags_are_the_second_argument() -> None:
    (clone,) = _rules_for(seccomp.default_profile(machine="s390x"), "clone")
    assert clone["args"][0]["index"] == 1


def test_cap_sys_admin_opens_namespaces_and_mounts() -> None:
    p = seccomp.default_profile(list(seccomp_default.DEFAULT_CAPABILITIES) + ["CAP_SYS_ADMIN"], machine="x86_64")
    allowed = _names(p)
    assert {"clone", "clone3", "unshare", "setns", "mount", "umount2", "sethostname", "bpf"} <= allowed
    assert all(not r.get("args") for r in _rules_for(p, "clone"))
    assert not [r for r in _rules_for(p, "clone3") if r["action"] != "SCMP_ACT_ALLOW"]


@pytest.mark.parametrize("cap,names", [
    ("CAP_SYS_PTRACE", {"process_vm_readv", "kcmp", "pidfd_getfd"}),
    ("CAP_SYS_TIME", {"settimeofday", "clock_settime"}),
    ("CAP_SYS_MODULE", {"init_module", "finit_module", "delete_module"}),
    ("CAP_SYS_BOOT", {"reboot"}),
    ("CAP_SYSLOG", {"syslog"}),
    ("CAP_SYS_NICE", {"mbind", "set_mempolicy"}),
    ("CAP_DAC_READ_SEARCH", {"open_by_handle_at"}),
])
def test_capability_gated_syscalls(cap: str, names: set[str]) -> None:
    assert not names & _names(seccomp.default_profile([], machine="x86_64"))
    assert names <= _names(seccomp.default_profile([cap], machine="x86_64"))


def test_chroot_follows_cap_sys_chroot() -> None:
    assert "chroot" in _names(seccomp.default_profile(machine="x86_64"))  # in the CRI default set
    assert "chroot" not in _names(seccomp.default_profile(["CAP_CHOWN"], machine="x86_64"))


def test_each_call_returns_a_fresh_profile() -> None:
    a = seccomp.default_profile()
    a["syscalls"][0]["names"].append("keyctl")
    a["architectures"].clear()
    b = seccomp.default_profile()
    assert "keyctl" not in b["syscalls"][0]["names"] and b["architectures"]


def test_no_syscall_is_listed_twice_in_the_unconditional_list() -> None:
    assert len(seccomp_default._ALWAYS) == len(set(seccomp_default._ALWAYS))


def test_compiles_within_the_kernel_limit() -> None:
    compiled = seccomp.prepare(seccomp.default_profile(), cache_dir=None)
    assert 100 < compiled.instructions < seccomp.BPF_MAXINSNS
