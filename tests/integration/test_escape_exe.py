"""CVE-2019-5736 class: a container must never get a writable handle on the host's interpreter.

The runtime's stages that enter a container (the init, exec's processes) run the host Python until they exec the
container's program. Three ways at it are tried here: opening /proc/<pid>/exe of the waiting init from a process
exec'd into the container, a `#!/proc/self/exe` entrypoint (the container's program becomes the interpreter), and
args[0] = /proc/self/exe in `husk exec`. Every one must meet a read-only mount that nobody can remount, and the host
interpreter's bytes must be unchanged afterwards.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sysconfig
from pathlib import Path

import pytest

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
def test_exec_cannot_write_the_waiting_inits_interpreter(husk, make_bundle, tmp_path: Path, host_files,
                                                         caps, expect) -> None:
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
def test_shebang_proc_self_exe_entrypoint_gets_a_read_only_interpreter(husk, make_bundle, host_files, caps) -> None:
    cp = husk.run(_probe_bundle(make_bundle, ["/evil"], caps))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    _check(_result(cp.stdout), admin=bool(caps))


def test_exec_of_proc_self_exe_gets_a_read_only_interpreter(husk, make_bundle, host_files) -> None:
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
