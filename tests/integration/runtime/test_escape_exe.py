"""CVE-2019-5736 class: a container must never get a writable handle on the host's interpreter.

The runtime's stages that enter a container (the init, exec's processes) run the host Python until they exec the
container's program. The ways at it tried here: opening /proc/<pid>/exe of the waiting init from a process
exec'd into the container, a `#!/proc/self/exe` entrypoint (the container's program becomes the interpreter),
args[0] = /proc/self/exe in `husk exec`, and /proc/<pid>/exe and /proc/<pid>/fd/* of a stage caught while it is
still the runtime: the waiting init, and an exec's stage held while it reads the container's files (the
image's /etc/passwd is a fifo, which the stage reads to find HOME: the container itself decides when it goes on,
so the attack is not a race; that stage is outside the container's pid namespace, so there is nothing to see). Every write must meet a read-only mount that nobody can remount or, without
CAP_SYS_PTRACE, a non-dumpable process; the host interpreter's bytes must be unchanged afterwards.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from tests.integration.conftest import TOP, Runtime
from tests.support.hostpython import INTERPRETER, interpreter_mounts

pytestmark = pytest.mark.root

def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _libpython() -> str | None:
    name = sysconfig.get_config_var("INSTSONAME")
    libdir = sysconfig.get_config_var("LIBDIR")
    if name and libdir and os.path.exists(os.path.join(libdir, name)) and sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return os.path.realpath(os.path.join(libdir, name))
    return None


@pytest.fixture
def host_files():
    """The interpreter (and libpython when shared) with their digests, checked unchanged after the test."""
    files = [INTERPRETER] + ([_libpython()] if _libpython() else [])
    before = {f: _digest(f) for f in files}
    yield files
    assert {f: _digest(f) for f in files} == before


def _caps(*extra: str) -> dict[str, list[str]]:
    caps = sorted({"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE", *extra})
    return {k: caps for k in ("bounding", "effective", "permitted")}


@pytest.fixture
def launcher_husk(tmp_path: Path):
    """husk through the generated `husk` launcher (runtime/launcher.py) with a persistent protected interpreter of
    its own (runtime/exeguard.py), made by the first call: the stages run it directly, with no re-exec."""
    from runtime import exeguard
    out, proot = tmp_path / "husk-launcher", tmp_path / "protected"
    subprocess.run([sys.executable, "-m", "runtime.launcher", str(out), str(proot)], check=True, cwd=TOP,
                   capture_output=True)
    protected = exeguard.persistent_path(os.path.realpath(sys.executable), str(proot))
    rt = Runtime([str(out)], str(tmp_path / "husk-root"))
    try:
        rt("state", "none", check=False)
        assert exeguard.persistent_ok(protected, os.path.realpath(sys.executable))
        rt.protected = protected  # type: ignore[attr-defined]
        yield rt
    finally:
        rt.cleanup()
        exeguard.remove_persistent(protected)


@pytest.fixture(params=["reexec", "launcher"])
def any_husk(request, husk):
    """husk both ways into a protected interpreter: `python -m runtime.cli` (the stage re-execs from a detached
    mount) and the launcher (the persistent protected interpreter from the start)."""
    return husk if request.param == "reexec" else request.getfixturevalue("launcher_husk")


def test_waiting_init_runs_the_persistent_interpreter_without_a_reexec(launcher_husk, make_bundle,
                                                                      host_files) -> None:
    from runtime.mountinfo import read
    cid, _ = launcher_husk.create(make_bundle(["true"]))
    pid = launcher_husk.state(cid)["pid"]
    assert os.readlink(f"/proc/{pid}/exe") == launcher_husk.protected
    with open(f"/proc/{pid}/cmdline", "rb") as f:  # not the launcher's code, --root or --bundle: no host path
        assert f.read().rstrip(b"\0") == b"husk:[2:INIT]"
    with pytest.raises(OSError) as err:
        os.open(f"/proc/{pid}/exe", os.O_WRONLY | os.O_TRUNC)
    assert err.value.strerror == "Read-only file system"
    fd = os.open(f"/proc/{pid}/exe", os.O_PATH)
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            mnt = int(next(line.split()[1] for line in f if line.startswith("mnt_id:")))
        m = next(m for m in read() if m.id == mnt)  # in the host's namespace, where no container can remount it
        assert m.point == launcher_husk.protected and "ro" in m.options and "unbindable" in m.optional
        assert os.fstat(fd).st_ino == os.stat(INTERPRETER).st_ino
    finally:
        os.close(fd)


def test_waiting_init_runs_a_read_only_detached_interpreter(husk, make_bundle, host_files) -> None:
    cid, _ = husk.create(make_bundle(["true"]))
    pid = husk.state(cid)["pid"]
    # even host root cannot open it for writing: the mount is read-only and in no mount namespace
    with pytest.raises(OSError) as err:
        os.open(f"/proc/{pid}/exe", os.O_WRONLY | os.O_TRUNC)
    assert err.value.strerror == "Read-only file system"
    fd = os.open(f"/proc/{pid}/exe", os.O_PATH)
    try:
        assert os.fstatvfs(fd).f_flag & os.ST_RDONLY
        with open(f"/proc/self/fdinfo/{fd}") as f:
            mnt = next(line.split()[1] for line in f if line.startswith("mnt_id:"))
        with open("/proc/self/mountinfo") as f:
            assert mnt not in {line.split()[0] for line in f}
        assert os.fstat(fd).st_ino == os.stat(INTERPRETER).st_ino  # the host's file, behind a read-only mount
    finally:
        os.close(fd)
    with open(f"/proc/{pid}/status") as f:
        assert "Name:" in f.read()


ATTACK = ("for how in '>' '>>'; do eval \"echo pwned $how /proc/1/exe\" 2>&1; done; "
          "(exec 3</proc/1/exe && echo pwned > /proc/self/fd/3) 2>&1; "
          "cat /proc/1/exe > /dev/null 2>&1 && echo readable; echo done")


@pytest.mark.parametrize("caps,expect", [
    ((), "Permission denied"),                      # the init is not dumpable: /proc/1/exe is out of reach
    (("CAP_SYS_PTRACE", "CAP_DAC_OVERRIDE", "CAP_SYS_ADMIN"), "Read-only file system"),  # reachable, not writable
])
def test_exec_cannot_write_the_waiting_inits_interpreter(any_husk, make_bundle, tmp_path: Path, host_files,
                                                         caps, expect) -> None:
    husk = any_husk
    cid, _ = husk.create(make_bundle(["true"]))
    proc = {"args": ["sh", "-c", ATTACK], "cwd": "/", "user": {"uid": 0, "gid": 0}, "capabilities": _caps(*caps),
            "env": ["PATH=/bin:/sbin:/usr/bin"]}
    pf = tmp_path / "attack.json"
    pf.write_text(json.dumps(proc))
    cp = husk("exec", "--process", str(pf), cid, check=False, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout
    assert "done" in out
    assert "pwned" not in out.replace("echo pwned", "")  # nothing echoed back from a successful write
    assert out.count(expect) >= 2, out
    if expect == "Read-only file system":
        assert "readable" in out  # it really reached the file: only writing is refused


# Run by the host interpreter inside the container (the attack under test): tries every way of writing it.
PROBE = r'''
import ctypes, errno, os
res = {}
for name, flags in (("trunc", os.O_WRONLY | os.O_TRUNC), ("append", os.O_WRONLY | os.O_APPEND),
                    ("rdwr", os.O_RDWR)):
    try:
        os.close(os.open("/proc/self/exe", flags))
        res[name] = "OPENED"
    except OSError as e:
        res[name] = errno.errorcode[e.errno]
fd = os.open("/proc/self/exe", os.O_PATH)
res["ro"] = bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY)
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
target = f"/proc/self/fd/{fd}".encode()
res["remount"] = libc.mount(None, target, None, 32 | 4096, None) == 0 and "DONE" or errno.errorcode[ctypes.get_errno()]
class Attr(ctypes.Structure):
    _fields_ = [("set", ctypes.c_uint64), ("clr", ctypes.c_uint64), ("prop", ctypes.c_uint64), ("ns", ctypes.c_uint64)]
libc.syscall.restype = ctypes.c_long
a = Attr(0, 1, 0, 0)  # clear MOUNT_ATTR_RDONLY
rc = libc.syscall(442, ctypes.c_int(fd), b"", ctypes.c_uint(0x1000), ctypes.byref(a), ctypes.c_size_t(32))
res["setattr"] = rc == 0 and "DONE" or errno.errorcode[ctypes.get_errno()]
clone = libc.syscall(428, ctypes.c_int(fd), b"", ctypes.c_uint(1 | 0x1000))
res["clone"] = clone >= 0 and "DONE" or errno.errorcode[ctypes.get_errno()]
try:
    os.close(os.open("/proc/self/exe", os.O_WRONLY | os.O_TRUNC))
    res["after"] = "OPENED"
except OSError as e:
    res["after"] = errno.errorcode[e.errno]
maps = [line.split() for line in open("/proc/self/maps") if ".so" in line]
lib = next((m for m in maps if "libpython" in m[-1]), None) or next(m for m in maps if "libc" in m[-1])
try:
    os.close(os.open(f"/proc/self/map_files/{lib[0]}", os.O_RDWR))
    res["map_files"] = "OPENED"
except OSError as e:
    res["map_files"] = errno.errorcode[e.errno]
print("RESULT", res)
'''


def _probe_bundle(make_bundle, args: list[str], caps: tuple[str, ...]):
    def edit(c):
        c["mounts"] += interpreter_mounts()
        c["process"]["capabilities"] = _caps(*caps)
        c["process"]["env"] = ["PATH=/bin:/sbin:/usr/bin", "HOME=/root"]
    b = make_bundle(args, edit=edit)
    (b / "rootfs" / "evil").write_text("#!/proc/self/exe\n" + PROBE)
    os.chmod(b / "rootfs" / "evil", 0o755)
    return b


def _result(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if line.startswith("RESULT "))
    return eval(line[len("RESULT "):], {})  # a dict literal printed by PROBE


def _check(res: dict, *, admin: bool) -> None:
    assert res["trunc"] == "EROFS" and res["after"] == "EROFS", res
    assert res["append"] in ("EROFS", "ETXTBSY") and res["rdwr"] in ("EROFS", "ETXTBSY"), res
    assert res["ro"] is True, res
    # nobody can make it writable again: not the container's root with CAP_SYS_ADMIN either
    assert res["remount"] in ("EINVAL", "EPERM") and res["setattr"] in ("EINVAL", "EPERM"), res
    assert res["clone"] in ("EINVAL", "EPERM"), res
    if not admin:
        # the mapped libraries (libpython) are out of reach without CAP_SYS_ADMIN in the host's user namespace
        assert res["map_files"] == "EPERM", res


@pytest.mark.parametrize("caps", [(), ("CAP_SYS_ADMIN", "CAP_DAC_OVERRIDE")])
def test_shebang_proc_self_exe_entrypoint_gets_a_read_only_interpreter(any_husk, make_bundle, host_files,
                                                                       caps) -> None:
    husk = any_husk
    cp = husk.run(_probe_bundle(make_bundle, ["/evil"], caps))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    _check(_result(cp.stdout), admin=bool(caps))


def test_exec_of_proc_self_exe_gets_a_read_only_interpreter(any_husk, make_bundle, host_files) -> None:
    husk = any_husk
    b = _probe_bundle(make_bundle, ["sleep", "1000"], ())
    cid = "rtit-exe-" + os.urandom(3).hex()
    husk.run(b, cid, "-d")
    cp = husk("exec", "--cap", "CAP_SYS_ADMIN", cid, "/proc/self/exe", "/evil", check=False,
              stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    _check(_result(cp.stdout), admin=True)
    cp = husk("exec", cid, "/evil", check=False, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    _check(_result(cp.stdout), admin=False)


# Run by the host interpreter inside the container against a runtime stage (its pid in the container's pid
# namespace): every way at its executable and its fds. A fifo is never opened for reading: the waiting init's
# exec fifo would then let it start (a CAP_SYS_PTRACE container can start itself that way, as with runc).
STAGE_PROBE = r'''
import errno, os, stat


def code(e):
    return errno.errorcode.get(e.errno, str(e.errno))


def kind(mode):
    for name, test in (("dir", stat.S_ISDIR), ("reg", stat.S_ISREG), ("fifo", stat.S_ISFIFO),
                       ("sock", stat.S_ISSOCK), ("chr", stat.S_ISCHR), ("blk", stat.S_ISBLK)):
        if test(mode):
            return name
    return "other"


def attack(pid):
    base = f"/proc/{pid}"
    res = {"pid": pid}
    with open(f"{base}/cmdline", "rb") as f:
        res["cmdline"] = f.read().replace(b"\0", b" ").decode(errors="replace")
    exe = {}
    try:
        os.readlink(f"{base}/exe")
        exe["readlink"] = "OK"
    except OSError as e:
        exe["readlink"] = code(e)
    for name, flags in (("trunc", os.O_WRONLY | os.O_TRUNC), ("append", os.O_WRONLY | os.O_APPEND),
                        ("rdwr", os.O_RDWR), ("path", os.O_PATH)):
        try:
            os.close(os.open(f"{base}/exe", flags))
            exe[name] = "OPENED"
        except OSError as e:
            exe[name] = code(e)
    res["exe"] = exe
    fds = {}
    for n in sorted(os.listdir(f"{base}/fd"), key=int):
        path = f"{base}/fd/{n}"
        r = {}
        try:
            os.readlink(path)
            r["readlink"] = "OK"
        except OSError as e:
            r["readlink"] = code(e)
        try:
            r["type"] = kind(os.stat(path).st_mode)
        except OSError as e:
            r["type"] = code(e)
        try:
            os.listdir(path + "/..")  # a directory fd of the host would be a way into its tree
            r["walk"] = "OK"
        except OSError as e:
            r["walk"] = code(e)
        for name, flags in (("write", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY),
                            ("read", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)):
            if name == "read" and r["type"] == "fifo":
                continue
            try:
                os.close(os.open(path, flags))
                r[name] = "OPENED"
            except OSError as e:
                r[name] = code(e)
        fds[int(n)] = r
    res["fds"] = fds
    return res
'''

# The container's init for the exec-stage attack: waits (blocked in open) until a stage opens the /etc/passwd fifo,
# attacks the only other process of the pid namespace, writes the result, then lets the stage read its passwd.
WATCHER = STAGE_PROBE + r'''
import json, time
w = os.open("/etc/passwd", os.O_WRONLY)  # returns once the stage has opened the fifo; it then waits in read()
others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
res = {"others": others}
if len(others) == 1:
    res.update(attack(others[0]))
with open("/result.json.tmp", "w") as f:
    json.dump(res, f)
os.rename("/result.json.tmp", "/result.json")
os.write(w, b"root:x:0:0:root:/root:/bin/sh\n")
os.close(w)
time.sleep(1 << 20)  # the container lives until the test deletes it: the exec'd process must not be killed
'''

DIRECT_PROBE = STAGE_PROBE + r'''
import json, sys
print("RESULT", json.dumps(attack(int(sys.argv[1]))))
'''

PTRACE_CAPS = ("CAP_SYS_PTRACE", "CAP_DAC_OVERRIDE", "CAP_SYS_ADMIN")
# the caller leaves these open and inheritable: a stage must hold none of them when the container can look
LEAKED_DIRS = ("/", "/etc", "/run", "/sys/fs/cgroup")


@pytest.fixture
def leaked_fds():
    fds = [os.open(d, os.O_RDONLY | os.O_DIRECTORY) for d in LEAKED_DIRS]
    yield fds
    for fd in fds:
        os.close(fd)


def _check_stage(res: dict, *, ptrace: bool) -> None:
    # it really was the runtime's stage that was attacked: its command line names the stage and nothing of the host
    assert res["cmdline"].strip() == "husk:[2:INIT]", res
    fds, exe = res["fds"], res["exe"]
    assert set(fds) >= {0, 1, 2}, res
    if not ptrace:
        # non-dumpable: nothing of it can be named or opened, not even by the container's root
        assert set(exe.values()) == {"EACCES"}, res
        assert {v for r in fds.values() for v in r.values()} == {"EACCES"}, res
        return
    # CAP_SYS_PTRACE reaches it: the interpreter is read-only for good, and no fd beyond the stdio the
    # container's process gets anyway leads to a file or directory of the host
    assert exe["readlink"] == "OK" and exe["path"] == "OPENED", res
    assert exe["trunc"] == "EROFS", res
    assert exe["append"] in ("EROFS", "ETXTBSY") and exe["rdwr"] in ("EROFS", "ETXTBSY"), res
    for n, r in fds.items():
        if n > 2:
            assert r["type"] in ("fifo", "sock"), (n, res)
            assert r["walk"] == "ENOTDIR", (n, res)


def _stage_bundle(make_bundle, args: list[str], caps: tuple[str, ...], passwd_fifo: bool = False) -> Path:
    def edit(c):
        c["mounts"] += interpreter_mounts()
        c["root"]["readonly"] = False
        c["process"]["capabilities"] = _caps(*caps)
        c["process"]["env"] = ["PATH=/bin:/sbin:/usr/bin", "HOME=/root"]
    b = make_bundle(args, edit=edit)
    if passwd_fifo:
        (b / "rootfs" / "etc" / "passwd").unlink()
        os.mkfifo(b / "rootfs" / "etc" / "passwd")
    return b


def _husk_with_fds(husk, args: list[str], fds: list[int], out) -> subprocess.Popen:
    """husk started by a careless caller: `fds` inherited. Output goes to a file: a pipe would be held open by
    a created container."""
    return subprocess.Popen([*husk.argv, "--root", husk.root, *args], stdin=subprocess.DEVNULL, stdout=out,
                            stderr=subprocess.STDOUT, pass_fds=fds)


def _finish(p: subprocess.Popen, out) -> tuple[int, str]:
    try:
        rc = p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()  # our own husk, by its pid
            p.wait()
    out.seek(0)
    return rc, out.read().decode(errors="replace")


@pytest.mark.parametrize("caps", [(), PTRACE_CAPS], ids=["default-caps", "ptrace-caps"])
def test_waiting_inits_fds_and_exe_are_out_of_reach(any_husk, make_bundle, tmp_path: Path, host_files, leaked_fds,
                                                   caps) -> None:
    husk = any_husk
    b = _stage_bundle(make_bundle, ["true"], ())
    cid = "rtit-wfd-" + os.urandom(4).hex()
    husk.created.append(cid)
    with tempfile.TemporaryFile() as out:
        rc, text = _finish(_husk_with_fds(husk, ["create", "--bundle", str(b), cid], leaked_fds, out), out)
    assert rc == 0, text
    proc = {"args": [INTERPRETER, "-I", "-S", "-c", DIRECT_PROBE, "1"], "cwd": "/", "user": {"uid": 0, "gid": 0},
            "capabilities": _caps(*caps), "env": ["PATH=/bin:/sbin:/usr/bin", "HOME=/root"]}
    pf = tmp_path / "probe.json"
    pf.write_text(json.dumps(proc))
    cp = husk("exec", "--process", str(pf), cid, check=False, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    res = json.loads(next(line for line in cp.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    res["fds"] = {int(k): v for k, v in res["fds"].items()}
    _check_stage(res, ptrace=bool(caps))
    assert husk.state(cid)["status"] == "created"  # the probe did not start it either


@pytest.mark.parametrize("caps", [(), PTRACE_CAPS], ids=["default-caps", "ptrace-caps"])
def test_exec_stage_joining_the_container_is_out_of_reach(any_husk, make_bundle, tmp_path: Path, host_files,
                                                          leaked_fds, caps) -> None:
    husk = any_husk
    b = _stage_bundle(make_bundle, [INTERPRETER, "-I", "-S", "-c", WATCHER], caps, passwd_fifo=True)
    cid = "rtit-xfd-" + os.urandom(4).hex()
    husk.run(b, cid, "-d")
    # no HOME: the stage reads the container's /etc/passwd for it, after it has joined the namespaces and closed
    # what it inherited, and before its execve
    proc = {"args": ["true"], "cwd": "/", "user": {"uid": 0, "gid": 0}, "env": ["PATH=/bin:/sbin:/usr/bin"]}
    pf = tmp_path / "exec.json"
    pf.write_text(json.dumps(proc))
    with tempfile.TemporaryFile() as out:
        rc, text = _finish(_husk_with_fds(husk, ["exec", "--process", str(pf), cid], leaked_fds, out), out)
    assert rc == 0, text  # the attack did not break the exec either
    result = b / "rootfs" / "result.json"
    assert result.exists(), f"the exec stage never opened the container's /etc/passwd (HOME lookup): {text}"
    res = json.loads(result.read_text())
    # the stage that reads the container's files still holds the host's credentials: it does that work outside the
    # container's pid namespace (only the process it forks afterwards joins it), so nothing in here can see it
    # (tests/integration/runtime/test_escape_ptrace.py attacks the visible process)
    assert res["others"] == [], res
