"""runtime.seccomp.validate: every malformed or unknown part of linux.seccomp is a ConfigError naming its path."""
from __future__ import annotations

import copy

import pytest

from runtime import seccomp
from runtime.errors import ConfigError


def _profile(**extra: object) -> dict:
    base: dict = {
        "defaultAction": "SCMP_ACT_ERRNO",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [
            {"names": ["read", "write", "exit_group"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}]},
        ],
    }
    base.update(extra)
    return base


def _error(profile: object, **kw: bool) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        seccomp.validate(profile, **kw)  # type: ignore[arg-type]
    return info.value


def test_valid_profile_passes() -> None:
    seccomp.validate(_profile())


def test_unknown_syscall_names_its_path() -> None:
    p = _profile()
    p["syscalls"].append({"names": ["getpid", "no_such_syscall"], "action": "SCMP_ACT_ALLOW"})
    err = _error(p)
    assert err.path == "linux.seccomp.syscalls[2].names[1]"
    assert "no_such_syscall" in err.reason and "unknown syscall" in err.reason
    assert "linux.seccomp.syscalls[2].names[1]" in str(err)


@pytest.mark.parametrize("name", ["socketcall", "_llseek", "arm_fadvise64_64", "s390_pci_mmio_read", "set_tls"])
def test_names_of_other_architectures_are_accepted(name: str) -> None:
    # Known to libseccomp, but not (or not only) on x86_64: libseccomp leaves them out where absent.
    seccomp.validate(_profile(architectures=[], syscalls=[{"names": [name], "action": "SCMP_ACT_ALLOW"}]))
    seccomp.validate(_profile(syscalls=[{"names": [name], "action": "SCMP_ACT_ALLOW"}]))


@pytest.mark.parametrize("action", ["SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL_THREAD",
                                    "SCMP_ACT_TRAP", "SCMP_ACT_ERRNO", "SCMP_ACT_TRACE", "SCMP_ACT_ALLOW",
                                    "SCMP_ACT_LOG"])
def test_every_spec_action_is_accepted(action: str) -> None:
    seccomp.validate(_profile(defaultAction=action))
    seccomp.validate(_profile(syscalls=[{"names": ["getppid"], "action": action}]))


def test_unknown_action() -> None:
    err = _error(_profile(syscalls=[{"names": ["getppid"], "action": "SCMP_ACT_BOGUS"}]))
    assert err.path == "linux.seccomp.syscalls[0].action"
    assert "SCMP_ACT_BOGUS" in err.reason
    err = _error(_profile(defaultAction="ALLOW"))
    assert err.path == "linux.seccomp.defaultAction" and "'ALLOW'" in err.reason


def test_default_action_required() -> None:
    p = _profile()
    del p["defaultAction"]
    assert _error(p).path == "linux.seccomp.defaultAction"


@pytest.mark.parametrize("op", ["SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE", "SCMP_CMP_EQ", "SCMP_CMP_GE",
                                "SCMP_CMP_GT", "SCMP_CMP_MASKED_EQ"])
def test_every_operator_is_accepted(op: str) -> None:
    seccomp.validate(_profile(syscalls=[{"names": ["getpriority"], "action": "SCMP_ACT_ERRNO",
                                         "args": [{"index": 1, "value": 7, "valueTwo": 3, "op": op}]}]))


@pytest.mark.parametrize("arg,path,word", [
    ({"index": 0, "value": 1, "op": "SCMP_CMP_EQUAL"}, "op", "SCMP_CMP_EQUAL"),
    ({"index": 0, "value": 1}, "op", "operator"),
    ({"index": 6, "value": 1, "op": "SCMP_CMP_EQ"}, "index", "0 to 5"),
    ({"index": -1, "value": 1, "op": "SCMP_CMP_EQ"}, "index", "0 to 5"),
    ({"index": True, "value": 1, "op": "SCMP_CMP_EQ"}, "index", "0 to 5"),
    ({"index": 0, "value": -1, "op": "SCMP_CMP_EQ"}, "value", "64-bit"),
    ({"index": 0, "value": 1 << 64, "op": "SCMP_CMP_EQ"}, "value", "64-bit"),
    ({"index": 0, "value": "1", "op": "SCMP_CMP_EQ"}, "value", "64-bit"),
    ({"index": 0, "value": 1, "valueTwo": -2, "op": "SCMP_CMP_MASKED_EQ"}, "valueTwo", "64-bit"),
])
def test_bad_argument_comparisons(arg: dict, path: str, word: str) -> None:
    err = _error(_profile(syscalls=[{"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                                     "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}, arg]}]))
    assert err.path == f"linux.seccomp.syscalls[0].args[1].{path}"
    assert word in err.reason


def test_largest_unsigned_value_is_accepted() -> None:
    seccomp.validate(_profile(syscalls=[{"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                                         "args": [{"index": 0, "value": (1 << 64) - 1, "op": "SCMP_CMP_EQ"}]}]))


def test_errno_ret_only_for_errno_and_trace() -> None:
    seccomp.validate(_profile(syscalls=[{"names": ["getppid"], "action": "SCMP_ACT_ERRNO", "errnoRet": 6}]))
    seccomp.validate(_profile(syscalls=[{"names": ["getppid"], "action": "SCMP_ACT_TRACE", "errnoRet": 6}]))
    err = _error(_profile(syscalls=[{"names": ["getppid"], "action": "SCMP_ACT_ALLOW", "errnoRet": 6}]))
    assert err.path == "linux.seccomp.syscalls[0].errnoRet" and "SCMP_ACT_ALLOW" in err.reason
    err = _error(_profile(defaultAction="SCMP_ACT_KILL", defaultErrnoRet=1))
    assert err.path == "linux.seccomp.defaultErrnoRet"
    seccomp.validate(_profile(defaultErrnoRet=38))


@pytest.mark.parametrize("value", [-1, 65536, "1", 1.0, False])
def test_errno_ret_range(value: object) -> None:
    err = _error(_profile(syscalls=[{"names": ["getppid"], "action": "SCMP_ACT_ERRNO", "errnoRet": value}]))
    assert err.path == "linux.seccomp.syscalls[0].errnoRet"


def test_unknown_architecture() -> None:
    err = _error(_profile(architectures=["SCMP_ARCH_X86_64", "SCMP_ARCH_PDP11"]))
    assert err.path == "linux.seccomp.architectures[1]" and "SCMP_ARCH_PDP11" in err.reason
    err = _error(_profile(architectures=["x86_64"]))
    assert err.path == "linux.seccomp.architectures[0]"


def test_every_spec_architecture_is_accepted() -> None:
    arches = ["SCMP_ARCH_X86", "SCMP_ARCH_X86_64", "SCMP_ARCH_X32", "SCMP_ARCH_ARM", "SCMP_ARCH_AARCH64",
              "SCMP_ARCH_MIPS", "SCMP_ARCH_MIPS64", "SCMP_ARCH_MIPS64N32", "SCMP_ARCH_MIPSEL",
              "SCMP_ARCH_MIPSEL64", "SCMP_ARCH_MIPSEL64N32", "SCMP_ARCH_PPC", "SCMP_ARCH_PPC64",
              "SCMP_ARCH_PPC64LE", "SCMP_ARCH_S390", "SCMP_ARCH_S390X", "SCMP_ARCH_PARISC",
              "SCMP_ARCH_PARISC64", "SCMP_ARCH_RISCV64"]
    seccomp.validate(_profile(architectures=arches))


def test_flags() -> None:
    seccomp.validate(_profile(flags=["SECCOMP_FILTER_FLAG_TSYNC", "SECCOMP_FILTER_FLAG_LOG",
                                     "SECCOMP_FILTER_FLAG_SPEC_ALLOW"]))
    err = _error(_profile(flags=["SECCOMP_FILTER_FLAG_LOG", "SECCOMP_FILTER_FLAG_NEW_LISTENER"]))
    assert err.path == "linux.seccomp.flags[1]" and "SECCOMP_FILTER_FLAG_NEW_LISTENER" in err.reason
    err = _error(_profile(flags=["SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV"]))
    assert err.path == "linux.seccomp.flags" and "SCMP_ACT_NOTIFY" in err.reason


def test_structure_errors() -> None:
    assert _error([]).path == "linux.seccomp"
    assert _error(_profile(syscalls={})).path == "linux.seccomp.syscalls"
    assert _error(_profile(syscalls=["read"])).path == "linux.seccomp.syscalls[0]"
    assert _error(_profile(syscalls=[{"action": "SCMP_ACT_ALLOW"}])).path == "linux.seccomp.syscalls[0].names"
    assert _error(_profile(syscalls=[{"names": ["read"]}])).path == "linux.seccomp.syscalls[0].action"
    err = _error(_profile(syscalls=[{"names": [], "action": "SCMP_ACT_ALLOW"}]))
    assert err.path == "linux.seccomp.syscalls[0].names" and "at least one" in err.reason
    err = _error(_profile(syscalls=[{"names": ["read\0write"], "action": "SCMP_ACT_ALLOW"}]))
    assert err.path == "linux.seccomp.syscalls[0].names[0]"
    err = _error(_profile(syscalls=[{"names": [7], "action": "SCMP_ACT_ALLOW"}]))
    assert err.path == "linux.seccomp.syscalls[0].names[0]"
    assert _error(_profile(architectures="SCMP_ARCH_X86")).path == "linux.seccomp.architectures"


def test_unknown_properties_are_ignored_as_the_spec_requires() -> None:
    seccomp.validate(_profile(futureField=1, syscalls=[
        {"names": ["read"], "action": "SCMP_ACT_ALLOW", "comment": "x",
         "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_EQ", "note": "y"}]}]))


def _notify_profile(**extra: object) -> dict:
    return _profile(listenerPath="/run/agent.sock", syscalls=[
        {"names": ["read", "write", "exit_group"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["mknod", "mknodat"], "action": "SCMP_ACT_NOTIFY"}], **extra)


def test_notify_refused_unless_the_caller_hands_the_fd_on() -> None:
    err = _error(_notify_profile())
    assert err.path == "linux.seccomp.syscalls[1].action" and "SCMP_ACT_NOTIFY" in err.reason
    seccomp.validate(_notify_profile(), allow_notify=True)
    seccomp.validate(_notify_profile(listenerMetadata="x", flags=["SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV"]),
                     allow_notify=True)


def test_notify_rules() -> None:
    p = _notify_profile()
    del p["listenerPath"]
    err = _error(p, allow_notify=True)
    assert err.path == "linux.seccomp.syscalls[1].action" and "listenerPath" in err.reason
    err = _error(_notify_profile(defaultAction="SCMP_ACT_NOTIFY"), allow_notify=True)
    assert err.path == "linux.seccomp.defaultAction"
    p = _notify_profile()
    p["syscalls"][1]["names"] = ["mknod", "sendmsg"]
    err = _error(p, allow_notify=True)
    assert err.path == "linux.seccomp.syscalls[1].names[1]" and "sendmsg" in err.reason
    err = _error(_profile(listenerMetadata="m"))
    assert err.path == "linux.seccomp.listenerMetadata"
    assert _error(_profile(listenerPath="")).path == "linux.seccomp.listenerPath"
    # listenerPath without any NOTIFY rule is ignored, as the spec says
    seccomp.validate(_profile(listenerPath="/run/agent.sock"))


def test_validate_does_not_change_the_profile() -> None:
    p = _profile(defaultErrnoRet=1, flags=["SECCOMP_FILTER_FLAG_LOG"])
    before = copy.deepcopy(p)
    seccomp.validate(p)
    seccomp.prepare(p, cache_dir=None)
    assert p == before


def test_compile_refuses_what_validate_refuses() -> None:
    p = _profile(syscalls=[{"names": ["no_such_syscall"], "action": "SCMP_ACT_ALLOW"}])
    with pytest.raises(ConfigError) as info:
        seccomp.prepare(p, cache_dir=None)
    assert info.value.path == "linux.seccomp.syscalls[0].names[0]"
