"""Seccomp inside real husk containers: the program is prepared on the host side (cache, libseccomp) before
pivot_root and loaded last; blocked syscalls fail with EPERM, allowed ones work, exec'd processes are filtered."""
from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from runtime.seccomp import default_profile
from tests.support import hostpython

pytestmark = pytest.mark.root

PROBE = ("grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; "
         "unshare -n true 2>&1 && echo unshare-ok; "
         "mount -t tmpfs none /tmp 2>&1 && echo mount-ok; "
         "echo alive")


def _with_profile(nnp: bool):
    def edit(cfg):
        cfg["linux"]["seccomp"] = default_profile()
        cfg["process"]["noNewPrivileges"] = nnp
        # mount and unshare are refused by seccomp first; give the capability so EPERM can only come from it
        for key in ("bounding", "effective", "permitted"):
            cfg["process"]["capabilities"][key] = sorted(set(cfg["process"]["capabilities"][key]) | {"CAP_SYS_ADMIN"})
    return edit


@pytest.mark.parametrize("nnp", [True, False])
def test_default_profile_blocks_inside_the_container(husk, make_bundle, nnp: bool) -> None:
    cp = husk.run(make_bundle(["sh", "-c", PROBE], edit=_with_profile(nnp)))
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout
    assert "Seccomp:\t2" in out
    assert f"NoNewPrivs:\t{1 if nnp else 0}" in out
    assert "unshare-ok" not in out and "mount-ok" not in out
    assert "unshare(0x40000000): Operation not permitted" in out
    assert "mount: permission denied" in out  # busybox's words for EPERM
    assert out.rstrip().endswith("alive")


def test_without_a_profile_the_same_calls_work(husk, make_bundle) -> None:
    def edit(cfg):
        for key in ("bounding", "effective", "permitted"):
            cfg["process"]["capabilities"][key] = sorted(set(cfg["process"]["capabilities"][key]) | {"CAP_SYS_ADMIN"})
    cp = husk.run(make_bundle(["sh", "-c", PROBE], edit=edit))
    assert cp.returncode == 0, cp.stderr
    assert "Seccomp:\t0" in cp.stdout
    assert "unshare-ok" in cp.stdout and "mount-ok" in cp.stdout


def test_exec_is_filtered_too(husk, make_bundle) -> None:
    bundle = make_bundle(["sleep", "30"], edit=_with_profile(True))
    cid, _ = husk.create(bundle)
    husk("start", cid)
    cp = husk("exec", cid, "sh", "-c", PROBE, check=False, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    assert "Seccomp:\t2" in cp.stdout
    assert "unshare-ok" not in cp.stdout and "mount-ok" not in cp.stdout
    husk("kill", cid, "KILL")


# --- the rest of linux.seccomp, through `husk run` ---------------------------------------------------------------
# x86_64 numbers (the probe calls them raw, so a libc wrapper's choice of syscall cannot blur the result)
SYSCALLS = {"keyctl": 250, "add_key": 248, "request_key": 249, "unshare": 272, "mount": 165, "umount2": 166,
            "kexec_load": 246, "init_module": 175, "open_by_handle_at": 304, "bpf": 321, "setns": 308,
            "pivot_root": 155, "swapon": 167, "syslog": 103, "perf_event_open": 298, "acct": 163,
            "getpid": 39, "uname": 63, "getcwd": 79}

PY_PROBE = r"""
import ctypes, errno, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buf = ctypes.create_string_buffer(4096)
out = {}
for name, nr in json.loads(sys.argv[1]).items():
    # harmless arguments: every call below fails on its arguments if seccomp lets it through, changes nothing
    args = (buf, 4096) if name in ("uname", "getcwd") else (0, 0, 0, 0, 0)
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), *args)
    out[name] = "ok" if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close(); out["socket_inet"] = "ok"
except OSError as e:
    out["socket_inet"] = errno.errorcode[e.errno]
try:
    socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close(); out["socket_inet6"] = "ok"
except OSError as e:
    out["socket_inet6"] = errno.errorcode[e.errno]
for mode in (0o750, 0o777):
    try:
        os.mkdir(f"/tmp/m{mode:o}", mode); out[f"mkdir_{mode:o}"] = "ok"
    except OSError as e:
        out[f"mkdir_{mode:o}"] = errno.errorcode[e.errno]
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print("RESULT " + json.dumps(out))
"""


def _python_probe(husk, make_bundle, profile: dict, *, caps: tuple[str, ...] = (), nnp: bool = True) -> dict:
    def edit(c):
        c["mounts"] += hostpython.interpreter_mounts()
        c["linux"]["seccomp"] = profile
        c["process"]["noNewPrivileges"] = nnp
        for key in ("bounding", "effective", "permitted"):
            c["process"]["capabilities"][key] = sorted(set(c["process"]["capabilities"][key]) | set(caps))
        c["root"]["readonly"] = False
    cp = husk.run(make_bundle([*hostpython.argv(PY_PROBE), json.dumps(SYSCALLS)], edit=edit))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    line = next(x for x in cp.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


BLOCKED_BY_DEFAULT = ("keyctl", "add_key", "request_key", "unshare", "mount", "umount2", "kexec_load",
                      "init_module", "open_by_handle_at", "bpf", "setns", "pivot_root", "swapon", "syslog",
                      "perf_event_open", "acct")


@pytest.mark.parametrize("nnp", [True, False])
def test_docker_default_equivalent_blocks_with_eperm_and_allows_the_rest(husk, make_bundle, nnp: bool) -> None:
    # CAP_SYS_ADMIN in the bounding set, but the profile built for the CRI default capabilities: so an EPERM
    # below can only come from seccomp, not from a missing capability
    res = _python_probe(husk, make_bundle, default_profile(), caps=("CAP_SYS_ADMIN",), nnp=nnp)
    for name in BLOCKED_BY_DEFAULT:
        assert res[name] == "EPERM", (name, res)
    assert res["getpid"] == "ok" and res["uname"] == "ok" and res["getcwd"] == "ok"
    assert res["socket_inet"] == "ok" and res["socket_inet6"] == "ok"
    assert res["mkdir_750"] == "ok" and res["mkdir_777"] == "ok"
    assert res["fork"] == 7


def test_errno_ret_and_default_errno_ret(husk, make_bundle) -> None:
    profile = default_profile()
    profile["defaultErrnoRet"] = errno.ENOSPC
    profile["syscalls"].insert(0, {"names": ["keyctl"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EXDEV})
    res = _python_probe(husk, make_bundle, profile)
    assert res["keyctl"] == "EXDEV"            # the rule's errnoRet
    assert res["unshare"] == "ENOSPC"          # in no rule: defaultErrnoRet
    assert res["mount"] == "ENOSPC" and res["add_key"] == "ENOSPC"
    assert res["getpid"] == "ok" and res["socket_inet"] == "ok" and res["fork"] == 7


def test_argument_comparisons(husk, make_bundle) -> None:
    import socket
    profile = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        # the same syscall refused for one argument value and allowed for the others
        {"names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EAFNOSUPPORT,
         "args": [{"index": 0, "value": int(socket.AF_INET6), "op": "SCMP_CMP_EQ"}]},
        # (mode & 0o007) == 0o007: world-writable directories refused, others allowed
        {"names": ["mkdir"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EACCES,
         "args": [{"index": 1, "value": 0o007, "valueTwo": 0o007, "op": "SCMP_CMP_MASKED_EQ"}]},
        # two conditions on different arguments must both hold (a call with only one of them passes)
        {"names": ["keyctl"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EXDEV,
         "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}, {"index": 1, "value": 5, "op": "SCMP_CMP_GT"}]},
    ]}
    res = _python_probe(husk, make_bundle, profile)
    assert res["socket_inet6"] == "EAFNOSUPPORT" and res["socket_inet"] == "ok"
    assert res["mkdir_777"] == "EACCES" and res["mkdir_750"] == "ok"
    assert res["keyctl"] != "EXDEV"  # keyctl(0, 0, ...): arg1 is not > 5, so the kernel's own answer
    assert res["getpid"] == "ok" and res["fork"] == 7


def test_filter_flags_are_applied(husk, make_bundle) -> None:
    def edit(c):
        c["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW",
                                 "flags": ["SECCOMP_FILTER_FLAG_TSYNC", "SECCOMP_FILTER_FLAG_LOG",
                                           "SECCOMP_FILTER_FLAG_SPEC_ALLOW"],
                                 "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO",
                                               "errnoRet": errno.ENOSPC}]}
        c["root"]["readonly"] = False
    cp = husk.run(make_bundle(["sh", "-c", "grep ^Seccomp: /proc/self/status; mkdir /tmp/x"], edit=edit))
    assert "Seccomp:\t2" in cp.stdout
    assert "No space left on device" in cp.stderr + cp.stdout


SSB_STATUS = Path("/sys/devices/system/cpu/vulnerabilities/spec_store_bypass")


def test_spec_allow_flag_keeps_the_kernel_from_forcing_the_ssb_mitigation(husk, make_bundle) -> None:
    """Where the kernel forces the Speculative Store Bypass mitigation on every task that loads a seccomp filter
    (an affected CPU and spec_store_bypass_disable=seccomp, the default before Linux 5.16: "... via prctl and
    seccomp"), the container's process shows "thread force mitigated" unless the profile has
    SECCOMP_FILTER_FLAG_SPEC_ALLOW."""
    try:
        mode = SSB_STATUS.read_text().strip()
    except OSError:
        mode = "unknown (no sysfs entry)"
    if "seccomp" not in mode:
        pytest.skip(f"this kernel forces no speculation mitigation on seccomp-filtered tasks, so the flag has no "
                    f"effect to observe ({SSB_STATUS}: {mode}); needs an affected CPU with "
                    f"spec_store_bypass_disable=seccomp")

    def ssb(flags: list[str]) -> str:
        def edit(c):
            c["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_ALLOW", "flags": flags,
                                     "syscalls": [{"names": ["keyctl"], "action": "SCMP_ACT_ERRNO"}]}
        cp = husk.run(make_bundle(["grep", "^Speculation_Store_Bypass:", "/proc/self/status"], edit=edit))
        assert cp.returncode == 0, cp.stdout + cp.stderr
        return cp.stdout.split(":", 1)[1].strip()

    assert ssb([]) == "thread force mitigated"
    allowed = ssb(["SECCOMP_FILTER_FLAG_SPEC_ALLOW"])
    assert "mitigated" not in allowed, allowed  # what the process had before its filter: "thread vulnerable"


def test_second_start_loads_the_cached_program(husk, make_bundle) -> None:
    """The first start compiles and caches; the second must load the cache without compiling: proved by
    planting another (valid) program in the cache slot and seeing its behaviour."""
    from runtime import seccomp, seccomp_lib
    marker = int.from_bytes(os.urandom(3), "big")  # a unique rule: a cache slot no other test shares

    def profile(err: int) -> dict:
        return {"defaultAction": "SCMP_ACT_ALLOW",
                "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": err},
                             {"names": ["kill"], "action": "SCMP_ACT_ERRNO",
                              "args": [{"index": 1, "value": 1000 + marker, "op": "SCMP_CMP_EQ"}]}]}
    first = profile(errno.ENOSPC)
    digest = seccomp.profile_digest(first, seccomp_lib.version())
    slot = Path(seccomp.DEFAULT_CACHE_DIR) / f"{digest}.bpf"
    script = ["sh", "-c", "mkdir /tmp/x"]

    def edit(c):
        c["linux"]["seccomp"] = first
        c["root"]["readonly"] = False
    try:
        cp = husk.run(make_bundle(script, edit=edit))
        assert "No space left on device" in cp.stderr
        assert slot.is_file()
        planted = seccomp.compile_profile(seccomp.parse(profile(errno.EROFS)))
        assert seccomp.write_cached(seccomp.DEFAULT_CACHE_DIR, digest, planted)
        cp = husk.run(make_bundle(script, edit=edit))
        assert "Read-only file system" in cp.stderr  # the cached program ran, not a fresh compile of `first`
    finally:
        slot.unlink(missing_ok=True)


def _leftovers(husk, cid: str, cg: str, bundle: Path) -> list[str]:
    found = []
    if (Path(husk.root) / cid).exists():
        found.append("state dir")
    for ctrl in ("memory", "pids", "devices", "freezer"):
        if os.path.exists(f"/sys/fs/cgroup/{ctrl}{cg}"):
            found.append(f"cgroup {ctrl}")
    with open("/proc/self/mountinfo") as f:
        if str(bundle) in f.read():  # other jobs on this host mount elsewhere meanwhile
            found.append("mounts")
    return found


@pytest.mark.parametrize("change,path,needle", [
    (lambda p: p["syscalls"].append({"names": ["no_such_syscall"], "action": "SCMP_ACT_ERRNO"}),
     "linux.seccomp.syscalls[{n}].names[0]", "unknown syscall 'no_such_syscall'"),
    (lambda p: p["syscalls"].append({"names": ["getpid"], "action": "SCMP_ACT_BOGUS"}),
     "linux.seccomp.syscalls[{n}].action", "unknown action 'SCMP_ACT_BOGUS'"),
    (lambda p: p.update(defaultAction="SCMP_ACT_NOPE"), "linux.seccomp.defaultAction", "unknown action"),
    (lambda p: p["architectures"].append("SCMP_ARCH_VAX"), "linux.seccomp.architectures[3]",
     "unknown architecture 'SCMP_ARCH_VAX'"),
    (lambda p: p.update(flags=["SECCOMP_FILTER_FLAG_BOGUS"]), "linux.seccomp.flags[0]", "unknown flag"),
    (lambda p: p["syscalls"].append({"names": ["getpid"], "action": "SCMP_ACT_ERRNO",
                                     "args": [{"index": 9, "value": 1, "op": "SCMP_CMP_EQ"}]}),
     "linux.seccomp.syscalls[{n}].args[0].index", "argument index"),
    (lambda p: p["syscalls"].append({"names": ["getpid"], "action": "SCMP_ACT_ERRNO",
                                     "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_SOMETIMES"}]}),
     "linux.seccomp.syscalls[{n}].args[0].op", "must be one of ['SCMP_CMP_NE'"),
])
def test_bad_profile_is_a_clear_create_error_leaving_nothing(husk, make_bundle, change, path, needle) -> None:
    profile = default_profile()
    n = len(profile["syscalls"])
    change(profile)

    def edit(c):
        c["linux"]["seccomp"] = profile
    b = make_bundle(["true"], edit=edit)
    cg = json.loads((b / "config.json").read_text())["linux"]["cgroupsPath"]
    cid, cp = husk.create(b, check=False)
    assert cp.returncode == 1
    assert f"config.json: {path.format(n=n)}: " in cp.stderr and needle in cp.stderr, cp.stderr
    assert _leftovers(husk, cid, cg, b) == []
