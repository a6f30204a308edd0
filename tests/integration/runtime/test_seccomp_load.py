"""Filters loaded for real in forked children: the default profile blocks what it should, actions and
argument comparisons behave as the spec says, the cached program behaves like the compiled one, and
no_new_privs follows the parameter."""
from __future__ import annotations

import errno
import os
import socket
import subprocess
import threading

import pytest

from runtime import seccomp
from runtime.errors import SetupError
from runtime.linux import syscalls

from tests.integration.seccomp_child import (NR, NR_I386, SIGSYS, X32_SYSCALL_BIT, i386_call, i386_supported, run_child,
                           status_fields, sys_call)

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers are x86_64's")

AF_VSOCK = 40


def _allow_all_but(*rules: dict, **extra: object) -> dict:
    return {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": list(rules), **extra}


def _default_checks() -> dict:
    s_inet = sys_call("socket", socket.AF_INET, socket.SOCK_STREAM, 0)
    if s_inet[0] >= 0:
        os.close(s_inet[0])
    return {
        "unshare": sys_call("unshare", syscalls.CLONE_NEWUTS),
        "mount": sys_call("mount", 0, 0, 0, 0, 0),
        "keyctl": sys_call("keyctl", 0, 0, 0, 0, 0),
        "sethostname": sys_call("sethostname", 0, 0),
        "setns": sys_call("setns", 0, 0),
        "clone3": sys_call("clone3", 0, 0),
        "getpid": sys_call("getpid"),
        "umask": sys_call("umask", 0o22),
        "personality_query": sys_call("personality", 0xFFFFFFFF),
        "personality_other": sys_call("personality", 0x0040000),
        "socket_inet": (min(s_inet[0], 0), s_inet[1]),
        "socket_vsock": sys_call("socket", AF_VSOCK, socket.SOCK_STREAM, 0),
        "status": status_fields("Seccomp", "NoNewPrivs"),
    }


def _assert_default_behaviour(value: dict) -> None:
    assert value["unshare"] == [-1, errno.EPERM]
    assert value["mount"] == [-1, errno.EPERM]
    assert value["keyctl"] == [-1, errno.EPERM]
    assert value["sethostname"] == [-1, errno.EPERM]
    assert value["setns"] == [-1, errno.EPERM]
    assert value["clone3"] == [-1, errno.ENOSYS]
    assert value["getpid"][0] > 0 and value["getpid"][1] == 0
    assert value["umask"][1] == 0
    assert value["personality_query"][1] == 0
    assert value["personality_other"] == [-1, errno.EPERM]
    assert value["socket_inet"] == [0, 0]
    assert value["socket_vsock"] == [-1, errno.EPERM]
    assert value["status"]["Seccomp"] == "2"


def test_unfiltered_child_can_do_what_the_profile_forbids() -> None:
    # Guards the other tests: EPERM must come from the filter, not from the host.
    res = run_child(lambda: {"keyctl": sys_call("keyctl", 0, 0, 0, 0, 0),
                             "personality_query": sys_call("personality", 0xFFFFFFFF)})
    assert res.value["keyctl"][1] != errno.EPERM
    assert res.value["personality_query"][1] == 0


def test_default_profile_blocks_and_allows(tmp_path) -> None:
    def child() -> dict:
        seccomp.install(seccomp.default_profile(), True, cache_dir=str(tmp_path))
        return _default_checks()

    res = run_child(child)
    assert res.exit_code == 0, res
    _assert_default_behaviour(res.value)
    assert res.value["status"]["NoNewPrivs"] == "1"


def test_cached_program_behaves_the_same(tmp_path) -> None:
    first = seccomp.prepare(seccomp.default_profile(), cache_dir=str(tmp_path))
    cached = seccomp.prepare(seccomp.default_profile(), cache_dir=str(tmp_path))
    assert not first.from_cache and cached.from_cache

    def child() -> dict:
        seccomp.install(cached, True)
        return _default_checks()

    res = run_child(child)
    assert res.exit_code == 0, res
    _assert_default_behaviour(res.value)


@pytest.mark.root
def test_exec_after_install_runs_filtered(tmp_path) -> None:
    compiled = seccomp.prepare(seccomp.default_profile(), cache_dir=str(tmp_path))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.dup2(w, 1)
            os.dup2(w, 2)
            seccomp.install(compiled, True)
            os.execv("/usr/bin/unshare", ["unshare", "--uts", "true"])
        finally:
            os._exit(127)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0
    assert "Operation not permitted" in out
    # and the same program without the filter works (the host allows it)
    ok = subprocess.run(["/usr/bin/unshare", "--uts", "true"], check=False)
    assert ok.returncode == 0


SYS_CLONE = 56
CLONE_NEWUTS = 0x04000000


def _clone_checks() -> dict:
    """fork() (clone without namespace flags) and a raw clone(CLONE_NEWUTS|SIGCHLD) from the child."""
    out = {}
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    out["fork"] = os.waitpid(pid, 0)[1]
    ret, err = sys_call(SYS_CLONE, CLONE_NEWUTS | 17, 0, 0, 0, 0)
    if ret == 0:
        os._exit(0)  # the new child: leave at once
    if ret > 0:
        os.waitpid(ret, 0)
    out["clone_newuts"] = [min(ret, 1), err]
    return out


@pytest.mark.root
def test_default_profile_clone_rule_follows_cap_sys_admin() -> None:
    def child(caps: list[str] | None) -> dict:
        seccomp.install(seccomp.default_profile(caps), True, cache_dir=None)
        return _clone_checks()

    res = run_child(lambda: child(None))
    assert res.value == {"fork": 0, "clone_newuts": [-1, errno.EPERM]}
    res = run_child(lambda: child(["CAP_SYS_ADMIN"]))
    assert res.value == {"fork": 0, "clone_newuts": [1, 0]}


@pytest.mark.root
def test_default_profile_chroot_follows_cap_sys_chroot() -> None:
    def child(caps: list[str] | None) -> object:
        seccomp.install(seccomp.default_profile(caps), True, cache_dir=None)
        return sys_call("chroot", 0)[1]  # a NULL path: EFAULT once the filter lets it through

    assert run_child(lambda: child(None)).value == errno.EFAULT
    assert run_child(lambda: child(["CAP_CHOWN"])).value == errno.EPERM


@pytest.mark.root
@pytest.mark.parametrize("nnp", [False, True])
def test_no_new_privs_follows_the_parameter(nnp: bool) -> None:
    def child() -> dict:
        before = status_fields("NoNewPrivs")["NoNewPrivs"]
        seccomp.install(seccomp.default_profile(), nnp, cache_dir=None)
        return {"before": before, **status_fields("NoNewPrivs", "Seccomp")}

    res = run_child(child)
    assert res.exit_code == 0, res
    assert res.value == {"before": "0", "NoNewPrivs": "1" if nnp else "0", "Seccomp": "2"}


@pytest.mark.root
def test_without_no_new_privs_cap_sys_admin_is_needed() -> None:
    def child() -> object:
        eff, perm, inh = syscalls.capget()
        cap_sys_admin = 1 << 21
        syscalls.capset(eff & ~cap_sys_admin, perm & ~cap_sys_admin, inh & ~cap_sys_admin)
        try:
            seccomp.install(seccomp.default_profile(), False, cache_dir=None)
        except SetupError as err:
            return {"error": str(err), **status_fields("Seccomp", "NoNewPrivs")}
        return "loaded"

    res = run_child(child)
    assert res.exit_code == 0
    assert "CAP_SYS_ADMIN" in res.value["error"] and "no_new_privs" in res.value["error"]
    assert res.value["Seccomp"] == "0" and res.value["NoNewPrivs"] == "0"


def test_errno_ret_and_default_errno_ret() -> None:
    profile = _allow_all_but(
        {"names": ["getppid"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENXIO},
        {"names": ["keyctl"], "action": "SCMP_ACT_ERRNO"},
        {"names": ["getpriority"], "action": "SCMP_ACT_ERRNO", "errnoRet": 0},
    )

    def child() -> dict:
        seccomp.install(profile, True, cache_dir=None)
        return {"getppid": sys_call("getppid"), "keyctl": sys_call("keyctl", 0, 0, 0, 0, 0),
                "getpriority": sys_call("getpriority", 0, 0)}

    res = run_child(child)
    assert res.value == {"getppid": [-1, errno.ENXIO], "keyctl": [-1, errno.EPERM], "getpriority": [0, 0]}

    default_enxio = dict(seccomp.default_profile(), defaultErrnoRet=errno.ENXIO)

    def child2() -> dict:
        seccomp.install(default_enxio, True, cache_dir=None)
        return {"keyctl": sys_call("keyctl", 0, 0, 0, 0, 0), "getpid": sys_call("getpid")[1]}

    res = run_child(child2)
    assert res.value == {"keyctl": [-1, errno.ENXIO], "getpid": 0}


def _getpriority_rule(*args: dict) -> dict:
    # getpriority(which, who): harmless, two arguments, and the kernel's own answers (0, ESRCH) are not ENXIO.
    return {"names": ["getpriority"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENXIO, "args": list(args)}


def _arg(index: int, op: str, value: int, value_two: int = 0) -> dict:
    return {"index": index, "op": op, "value": value, "valueTwo": value_two}


def _filtered_getpriority_calls(profile: dict, calls: list[tuple[int, int]]) -> list[bool]:
    """For each (which, who): whether the filter answered (ENXIO)."""
    def child() -> list[bool]:
        seccomp.install(profile, True, cache_dir=None)
        return [sys_call("getpriority", which, who)[1] == errno.ENXIO for which, who in calls]

    res = run_child(child)
    assert res.exit_code == 0, res
    return res.value


@pytest.mark.parametrize("op,value,matching,other", [
    ("SCMP_CMP_EQ", 1000, [1000], [999, 1001, 0]),
    ("SCMP_CMP_NE", 1000, [999, 1001, 0, (1 << 63) + 1000], [1000]),
    ("SCMP_CMP_LT", 1000, [0, 999], [1000, 1001, 1 << 40]),
    ("SCMP_CMP_LE", 1000, [0, 1000], [1001, 1 << 40]),
    ("SCMP_CMP_GT", 1000, [1001, 1 << 40], [0, 1000]),
    ("SCMP_CMP_GE", 1000, [1000, 1 << 40], [0, 999]),
])
def test_each_comparison_operator(op: str, value: int, matching: list[int], other: list[int]) -> None:
    profile = _allow_all_but(_getpriority_rule(_arg(1, op, value)))
    got = _filtered_getpriority_calls(profile, [(0, who) for who in matching + other])
    assert got == [True] * len(matching) + [False] * len(other)


def test_masked_equality() -> None:
    # value is the mask, valueTwo what the masked argument must equal (clone's namespace-flags rule)
    profile = _allow_all_but(_getpriority_rule(_arg(1, "SCMP_CMP_MASKED_EQ", 0xF0000, 0x30000)))
    assert _filtered_getpriority_calls(profile, [(0, 0x3ABCD), (0, 0x30000), (0, 0x4ABCD), (0, 0xABCD)]) == \
        [True, True, False, False]


def test_conditions_on_different_arguments_are_anded() -> None:
    profile = _allow_all_but(_getpriority_rule(_arg(0, "SCMP_CMP_EQ", 2), _arg(1, "SCMP_CMP_EQ", 12345)))
    assert _filtered_getpriority_calls(profile, [(2, 12345), (1, 12345), (2, 12346)]) == [True, False, False]


def test_conditions_on_the_same_argument_are_ored_as_runc_does() -> None:
    # libseccomp refuses two comparisons of one argument in a rule; runc and crun then add one rule per
    # condition, so they match when any of them does.
    profile = _allow_all_but(_getpriority_rule(_arg(1, "SCMP_CMP_EQ", 111), _arg(1, "SCMP_CMP_EQ", 222)))
    assert _filtered_getpriority_calls(profile, [(0, 111), (0, 222), (0, 333)]) == [True, True, False]


def test_several_entries_for_one_syscall_are_ored() -> None:
    profile = _allow_all_but(_getpriority_rule(_arg(1, "SCMP_CMP_EQ", 111)),
                             _getpriority_rule(_arg(0, "SCMP_CMP_EQ", 1), _arg(1, "SCMP_CMP_EQ", 5)))
    assert _filtered_getpriority_calls(profile, [(0, 111), (1, 5), (0, 5), (1, 6)]) == [True, True, False, False]


def test_personality_with_a_specific_argument() -> None:
    profile = _allow_all_but({"names": ["personality"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENXIO,
                              "args": [_arg(0, "SCMP_CMP_NE", 0xFFFFFFFF)]})

    def child() -> dict:
        seccomp.install(profile, True, cache_dir=None)
        return {"query": sys_call("personality", 0xFFFFFFFF)[1], "set": sys_call("personality", 0x0040000)[1]}

    assert run_child(child).value == {"query": 0, "set": errno.ENXIO}


@pytest.mark.parametrize("action", ["SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD",
                                    "SCMP_ACT_TRAP"])
def test_killing_actions(action: str) -> None:
    def child() -> str:
        seccomp.install(_allow_all_but({"names": ["getppid"], "action": action}), True, cache_dir=None)
        sys_call("getppid")
        return "survived"

    res = run_child(child)
    assert res.signal == SIGSYS, res


def test_kill_process_kills_every_thread() -> None:
    def child() -> str:
        seccomp.install(_allow_all_but({"names": ["getppid"], "action": "SCMP_ACT_KILL_PROCESS"}), True,
                        cache_dir=None)
        t = threading.Thread(target=lambda: sys_call("getppid"))
        t.start()
        t.join()
        return "survived"

    assert run_child(child).signal == SIGSYS


def test_trace_without_tracer_and_log() -> None:
    profile = _allow_all_but({"names": ["getppid"], "action": "SCMP_ACT_TRACE"},
                             {"names": ["getpid"], "action": "SCMP_ACT_LOG"})

    def child() -> dict:
        seccomp.install(profile, True, cache_dir=None)
        return {"getppid": sys_call("getppid"), "getpid": sys_call("getpid")[1]}

    res = run_child(child)
    assert res.value == {"getppid": [-1, errno.ENOSYS], "getpid": 0}


@pytest.mark.parametrize("tsync", [False, True])
def test_tsync_flag_filters_other_threads(tsync: bool) -> None:
    profile = _allow_all_but({"names": ["getppid"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENXIO},
                             flags=["SECCOMP_FILTER_FLAG_TSYNC"] if tsync else [])

    def child() -> dict:
        loaded, done = threading.Event(), []
        t = threading.Thread(target=lambda: (loaded.wait(), done.append(sys_call("getppid")[1])))
        t.start()
        seccomp.install(profile, True, cache_dir=None)
        loaded.set()
        t.join()
        return {"other_thread": done[0], "this_thread": sys_call("getppid")[1]}

    res = run_child(child)
    assert res.value == {"other_thread": errno.ENXIO if tsync else 0, "this_thread": errno.ENXIO}


def test_log_and_spec_allow_flags_load() -> None:
    profile = _allow_all_but({"names": ["getppid"], "action": "SCMP_ACT_ERRNO"},
                             flags=["SECCOMP_FILTER_FLAG_LOG", "SECCOMP_FILTER_FLAG_SPEC_ALLOW"])

    def child() -> object:
        seccomp.install(profile, True, cache_dir=None)
        return sys_call("getppid")

    assert run_child(child).value == [-1, errno.EPERM]


def test_architectures_cover_i386_syscalls() -> None:
    if not i386_supported():
        pytest.skip("the kernel does not run i386 syscalls")

    def with_arches(arches: list[str] | None) -> object:
        profile = seccomp.default_profile()
        if arches is not None:
            profile["architectures"] = arches

        def child() -> dict:
            i386_call(NR_I386["getpid"])  # maps the stub before the filter
            seccomp.install(profile, True, cache_dir=None)
            return {"getpid": i386_call(NR_I386["getpid"])[1], "unshare": i386_call(NR_I386["unshare"],
                                                                                     syscalls.CLONE_NEWUTS),
                    "keyctl": i386_call(NR_I386["keyctl"])}
        return run_child(child)

    res = with_arches(None)  # x86_64, x86, x32 as the default profile has them
    assert res.exit_code == 0, res
    assert res.value == {"getpid": 0, "unshare": [-1, errno.EPERM], "keyctl": [-1, errno.EPERM]}
    # Without SCMP_ARCH_X86 in the filter an i386 syscall is a bad architecture: the process is killed.
    res = with_arches(["SCMP_ARCH_X86_64"])
    assert res.signal == SIGSYS, res


def test_x32_numbers_are_filtered_too() -> None:
    def child() -> dict:
        seccomp.install(seccomp.default_profile(), True, cache_dir=None)
        return {"unshare": sys_call(NR["unshare"] | X32_SYSCALL_BIT, syscalls.CLONE_NEWUTS),
                "getpid": sys_call(NR["getpid"] | X32_SYSCALL_BIT)}

    res = run_child(child)
    assert res.exit_code == 0, res
    assert res.value["unshare"] == [-1, errno.EPERM]
    # getpid passes the filter; the kernel then runs it or, without x32 support, says ENOSYS
    assert res.value["getpid"][1] in (0, errno.ENOSYS)


def test_notify_profile_needs_a_listener_handler() -> None:
    profile = _allow_all_but({"names": ["getppid"], "action": "SCMP_ACT_NOTIFY"}, listenerPath="/nonexistent")

    def child() -> object:
        try:
            seccomp.install(profile, True, cache_dir=None)
        except SetupError as err:
            return {"error": str(err), **status_fields("Seccomp")}
        return "loaded"

    res = run_child(child)
    assert "listener" in res.value["error"] and res.value["Seccomp"] == "0"


def test_install_failure_is_a_setup_error_naming_the_reason() -> None:
    # A program the kernel refuses (a jump past the end) must not be reported as success.
    bad = seccomp.CompiledFilter(program=bytes([0x15, 0, 5, 0, 0, 0, 0, 0]) + bytes([0x06, 0, 0, 0, 0, 0, 0xFF, 0x7F]),
                                 flags=0, digest="x", from_cache=False)

    def child() -> object:
        try:
            seccomp.install(bad, True)
        except SetupError as err:
            return str(err)
        return "loaded"

    res = run_child(child)
    assert "kernel refused" in res.value


SECCOMP_IOCTL_NOTIF_RECV = 0xC0502100  # _IOWR('!', 0, struct seccomp_notif), 80 bytes
SECCOMP_IOCTL_NOTIF_SEND = 0xC0182101  # _IOWR('!', 1, struct seccomp_notif_resp), 24 bytes


def test_notify_hands_the_listener_to_the_agent(tmp_path) -> None:
    import fcntl
    import json
    import select
    import struct

    from runtime import seccomp_notify

    agent_path = str(tmp_path / "agent.sock")
    profile = _allow_all_but({"names": ["getppid"], "action": "SCMP_ACT_NOTIFY"},
                             listenerPath=agent_path, listenerMetadata="answer=4242")
    seccomp.validate(profile, allow_notify=True)
    compiled = seccomp.prepare(profile, cache_dir=None)
    state = {"ociVersion": "1.0.2", "id": "husk-seccomp-notify-test", "status": "creating", "bundle": "/b"}
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    agent.bind(agent_path)
    agent.listen(1)
    agent.settimeout(10)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            agent.close()
            os.close(r)

            def hand_over(fd: int, c: seccomp.CompiledFilter) -> None:
                seccomp_notify.send_listener_fd(c.listener_path, fd, dict(state, pid=os.getpid()), os.getpid(),
                                                c.listener_metadata)

            seccomp.install(compiled, True, on_listener=hand_over)
            ret, err = sys_call("getppid")  # blocks until the agent answers
            os.write(w, json.dumps([ret, err]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    finished = False
    try:
        conn, _ = agent.accept()
        with conn:
            msg, fds, _, _ = socket.recv_fds(conn, 65536, 4)
            while True:  # the state may come in several messages; the fd comes with the first
                more = conn.recv(65536)
                if not more:
                    break
                msg += more
        assert len(fds) == 1
        record = json.loads(msg)
        assert record["fds"] == ["seccompFd"] and record["pid"] == pid
        assert record["metadata"] == "answer=4242" and record["state"]["id"] == state["id"]
        notify_fd = fds[0]
        ready, _, _ = select.select([notify_fd], [], [], 10)
        assert ready, "no notification arrived"
        buf = bytearray(80)
        fcntl.ioctl(notify_fd, SECCOMP_IOCTL_NOTIF_RECV, buf, True)
        notif_id, notif_pid, _flags, nr = struct.unpack_from("<QIIi", buf)
        assert notif_pid == pid and nr == NR["getppid"]
        fcntl.ioctl(notify_fd, SECCOMP_IOCTL_NOTIF_SEND, bytearray(struct.pack("<QqiI", notif_id, 4242, 0, 0)), True)
        os.close(notify_fd)
        with os.fdopen(r) as f:
            result = f.read()
        finished = True
    finally:
        agent.close()
        if not finished:
            os.kill(pid, 9)  # it may be blocked in the notified syscall; it is our own child
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert json.loads(result) == [4242, 0]


def test_notify_handoff_failure_is_a_setup_error(tmp_path) -> None:
    from runtime import seccomp_notify

    r, w = os.pipe()
    try:
        with pytest.raises(SetupError) as info:
            seccomp_notify.send_listener_fd(str(tmp_path / "nobody-listens.sock"), r, {"id": "x"}, 1)
        assert "nobody-listens.sock" in str(info.value)
    finally:
        os.close(r)
        os.close(w)


def test_tsync_reports_a_thread_it_cannot_synchronise() -> None:
    # A thread that already has its own, unrelated filter cannot be synchronised: that is an error,
    # not a success with a thread id as the return value.
    first = _allow_all_but({"names": ["getppid"], "action": "SCMP_ACT_ERRNO"})
    second = _allow_all_but({"names": ["getpriority"], "action": "SCMP_ACT_ERRNO"},
                            flags=["SECCOMP_FILTER_FLAG_TSYNC"])

    def child() -> object:
        loaded, release = threading.Event(), threading.Event()

        def other() -> None:
            seccomp.install(first, True, cache_dir=None)
            loaded.set()
            release.wait()

        t = threading.Thread(target=other)
        t.start()
        loaded.wait()
        try:
            seccomp.install(second, True, cache_dir=None)
            return "loaded"
        except SetupError as err:
            return str(err)
        finally:
            release.set()
            t.join()

    res = run_child(child)
    assert "could not be synchronised" in res.value


def test_malformed_program_is_refused_before_the_kernel() -> None:
    def child() -> list[str]:
        out = []
        for program in (b"", b"\x06\x00\x00\x00", b"\x00" * 8 * (seccomp.BPF_MAXINSNS + 1)):
            try:
                seccomp.load(seccomp.CompiledFilter(program, 0, "x", False), True)
                out.append("loaded")
            except SetupError as err:
                out.append(str(err))
        return out + [status_fields("NoNewPrivs")["NoNewPrivs"]]

    res = run_child(child)
    assert all("not a BPF program" in msg for msg in res.value[:3]) and res.value[3] == "0"
