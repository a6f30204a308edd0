"""A container given CAP_SYS_PTRACE against the runtime's stages (README, Security: the exec stage and the start
handle).

CAP_SYS_PTRACE in the host's user namespace (a container without a user namespace of its own) overrides
non-dumpable: such a container may ptrace, and open /proc/<pid>/fd/* of, every process it can see. Two things
must still hold:
- a created container's waiting init cannot be started from inside: nothing it holds, opened through
  /proc/1/fd/N (or connected to through that path), releases it; only `husk start` does;
- a `husk exec` stage is never visible in the container while it holds a capability the container lacks: the
  stage does its privileged work outside the container's pid namespace (the image's /etc/passwd is a fifo that
  the stage reads for HOME, so the test decides when it goes on: the attack is not a race).
The attackers are the host's Python run inside the container (tests/support/hostpython.py), using ctypes ptrace.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.hostpython import INTERPRETER, interpreter_mounts
from tests.support.waiting import wait_for

pytestmark = pytest.mark.root

BASE_CAPS = ("CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_SYS_PTRACE")


def _caps() -> dict[str, list[str]]:
    return {k: sorted(BASE_CAPS) for k in ("bounding", "effective", "permitted")}


def _bundle(make_bundle, args: list[str], passwd_fifo: bool = False) -> Path:
    def edit(c):
        c["mounts"] += interpreter_mounts()
        c["root"]["readonly"] = False
        c["process"]["capabilities"] = _caps()
        c["process"]["env"] = ["PATH=/bin:/sbin:/usr/bin", "HOME=/root"]
    b = make_bundle(args, edit=edit)
    if passwd_fifo:
        (b / "rootfs" / "etc" / "passwd").unlink()
        os.mkfifo(b / "rootfs" / "etc" / "passwd")
    return b


# Run inside a created container (exec'd, so it shares the waiting init's pid namespace; pid 1 is the init):
# every way of opening or connecting to what the init holds; a fifo opened for reading is read to its end.
START_ATTACK = r'''
import errno, json, os, select, socket, stat, time

def code(e):
    return errno.errorcode.get(e.errno, str(e.errno))

res = {}
for n in sorted(os.listdir("/proc/1/fd"), key=int):
    path = f"/proc/1/fd/{n}"
    r = {}
    try:
        r["type"] = "fifo" if stat.S_ISFIFO(os.stat(path).st_mode) else "sock" if stat.S_ISSOCK(os.stat(path).st_mode) else "other"
    except OSError as e:
        r["type"] = code(e)
    for name, flags in (("read", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY),
                        ("write", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY),
                        ("rdwr", os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY)):
        try:
            fd = os.open(path, flags)
        except OSError as e:
            r[name] = code(e)
            continue
        r[name] = "OPENED"
        if name == "read" and r["type"] == "fifo":
            got, deadline = b"", time.monotonic() + 10
            while time.monotonic() < deadline:
                select.select([fd], [], [], 0.2)
                try:
                    chunk = os.read(fd, 100)
                except BlockingIOError:
                    continue
                if not chunk and got:
                    break
                got += chunk
            r["got"] = got.decode(errors="replace")
        os.close(fd)
    for kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET, socket.SOCK_DGRAM):
        s = socket.socket(socket.AF_UNIX, kind)
        try:
            s.settimeout(2)
            s.connect(path)
            r[f"connect{int(kind)}"] = "CONNECTED"
            r[f"recv{int(kind)}"] = s.recv(100).decode(errors="replace")
        except OSError as e:
            r[f"connect{int(kind)}"] = code(e) if e.errno else str(e)
        finally:
            s.close()
    res[n] = r
status = {}
for pid in ("1", "self"):
    with open(f"/proc/{pid}/status") as f:
        status[pid] = {k: v.strip() for k, _, v in (line.partition(":") for line in f) if k.startswith("Cap")}
print("RESULT", json.dumps({"fds": res, "status": status}))
'''


def test_waiting_init_cannot_be_started_from_inside(husk, make_bundle, tmp_path: Path) -> None:
    b = _bundle(make_bundle, ["sh", "-c", "touch /started; exec sleep 1000"])
    cid, _ = husk.create(b)
    pid = husk.state(cid)["pid"]
    proc = {"args": [INTERPRETER, "-I", "-S", "-c", START_ATTACK], "cwd": "/", "user": {"uid": 0, "gid": 0},
            "capabilities": _caps(), "env": ["PATH=/bin:/sbin:/usr/bin", "HOME=/root"]}
    pf = tmp_path / "attack.json"
    pf.write_text(json.dumps(proc))
    cp = husk("exec", "--process", str(pf), cid, check=False, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    out = json.loads(next(line for line in cp.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    res = out["fds"]
    assert res and set(res) >= {"0", "1", "2"}, res  # it really could look at the init's fds (CAP_SYS_PTRACE)
    # and could ptrace it: what it would find there is no capability the container lacks (runc's order: the
    # init takes the process's credentials before it waits)
    bounding = int(out["status"]["self"]["CapBnd"], 16)
    for k, v in out["status"]["1"].items():
        assert int(v, 16) & ~bounding == 0, (k, out["status"])
    # the container's program never ran: the init is still waiting, and `start` is what starts it
    assert not (b / "rootfs" / "started").exists(), res
    assert husk.state(cid)["status"] == "created", res
    with open(f"/proc/{pid}/comm") as f:
        assert f.read().strip() == "husk:[2:INIT]", res
    for n, r in res.items():
        if int(n) > 2:
            assert "got" not in r and "CONNECTED" not in r.values(), (n, res)
    husk("start", cid)
    wait_for(lambda: (b / "rootfs" / "started").exists(), timeout=20, what="the started container's program")
    assert husk.state(cid)["status"] == "running"
    cp = husk("start", cid, check=False)
    assert cp.returncode != 0  # start twice is an error, as in runc


# The container's init for the exec-stage attack: waits (blocked in open) until a stage opens the /etc/passwd fifo,
# then tries to ptrace every other process it can see and reads their capabilities; after letting the stage go
# on, it keeps looking at every process that appears until the exec'd program has run.
STAGE_ATTACK = r'''
import ctypes, errno, json, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_ATTACH, PTRACE_DETACH = 16, 17


def caps(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("Name", "CapPrm", "CapEff", "CapBnd", "CapAmb", "CapInh"):
                    out[k] = v.strip()
    except OSError:
        pass
    return out


def attach(pid):
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) != 0:
        return errno.errorcode.get(ctypes.get_errno(), "?")
    os.waitpid(pid, 0x40000000)  # __WALL: the attach stop
    libc.ptrace(PTRACE_DETACH, pid, None, None)
    return "ATTACHED"


me = os.getpid()
res = {"bounding": caps(me)["CapBnd"], "paused": [], "seen": {}}
w = os.open("/etc/passwd", os.O_WRONLY)  # returns once a stage has opened the fifo; it then waits in read()
for p in sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me):
    res["paused"].append({"pid": p, "caps": caps(p), "ptrace": attach(p)})
os.write(w, b"root:x:0:0:root:/root:/bin/sh\n")
os.close(w)
deadline = time.monotonic() + 10
while time.monotonic() < deadline and not os.path.exists("/exec-ran"):
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != me and p not in res["seen"]:
            c = caps(int(p))
            if c:
                res["seen"][p] = c
with open("/result.json.tmp", "w") as f:
    json.dump(res, f)
os.rename("/result.json.tmp", "/result.json")
time.sleep(1 << 20)  # the container lives until the test deletes it
'''


def test_exec_stage_is_not_attachable_while_privileged(husk, make_bundle, tmp_path: Path) -> None:
    b = _bundle(make_bundle, [INTERPRETER, "-I", "-S", "-c", STAGE_ATTACK], passwd_fifo=True)
    cid = "rtit-ptr-" + os.urandom(4).hex()
    husk.run(b, cid, "-d")
    # no HOME: the stage reads the container's /etc/passwd for it after joining the namespaces
    proc = {"args": ["touch", "/exec-ran"], "cwd": "/", "user": {"uid": 0, "gid": 0}, "capabilities": _caps(),
            "env": ["PATH=/bin:/sbin:/usr/bin"]}
    pf = tmp_path / "exec.json"
    pf.write_text(json.dumps(proc))
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen([*husk.argv, "--root", husk.root, "exec", "--process", str(pf), cid],
                             stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        try:
            rc = p.wait(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()  # our own husk, by its pid
                p.wait()
        out.seek(0)
        text = out.read().decode(errors="replace")
    assert rc == 0, text
    result = b / "rootfs" / "result.json"
    wait_for(result.exists, timeout=20, what="the attacker's result")
    res = json.loads(result.read_text())
    bounding = int(res["bounding"], 16)
    for stage in res["paused"]:
        extra = int(stage["caps"].get("CapPrm", "0"), 16) & ~bounding
        # a stage that holds more than the container may be visible only if nobody in here can attach to it
        assert not extra or stage["ptrace"] != "ATTACHED", res
        assert not extra, f"a visible stage holds capabilities the container lacks: {res}"
    for pid, c in res["seen"].items():
        for k in ("CapPrm", "CapEff", "CapBnd", "CapInh", "CapAmb"):
            assert int(c.get(k, "0"), 16) & ~bounding == 0, (pid, k, res)


@pytest.mark.parametrize("uid", [0, 1000])
def test_exec_loads_seccomp_without_no_new_privs_and_keeps_no_extra_capability(husk, make_bundle, tmp_path: Path,
                                                                               uid: int) -> None:
    # without noNewPrivileges the kernel wants CAP_SYS_ADMIN to load the filter: the visible stage holds it (and
    # only it, not in its bounding set) until the filter is loaded; the program must have none of it
    profile = {"defaultAction": "SCMP_ACT_ALLOW",
               "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}

    def edit(c):
        c["linux"]["seccomp"] = profile
        c["process"]["noNewPrivileges"] = False
        c["root"]["readonly"] = False
    cid = "rtit-psc-" + os.urandom(4).hex()
    husk.run(make_bundle(["sleep", "1000"], edit=edit), cid, "-d")
    proc = {"args": ["sh", "-c", "grep -E '^(Cap|Seccomp:|NoNewPrivs)' /proc/self/status; mkdir /tmp/x && echo MADE"],
            "cwd": "/", "user": {"uid": uid, "gid": uid}, "capabilities": _caps(), "noNewPrivileges": False,
            "env": ["PATH=/bin:/sbin:/usr/bin", "HOME=/"]}
    pf = tmp_path / "exec.json"
    pf.write_text(json.dumps(proc))
    cp = husk("exec", "--process", str(pf), cid, check=False, stdin=subprocess.DEVNULL)
    status = dict(line.split(":\t") for line in cp.stdout.splitlines() if ":\t" in line)
    assert status.get("Seccomp") == "2" and status.get("NoNewPrivs") == "0", cp.stdout + cp.stderr
    admin = 1 << 21  # CAP_SYS_ADMIN
    for k in ("CapPrm", "CapEff", "CapBnd", "CapInh", "CapAmb"):
        assert not int(status[k], 16) & admin, (k, cp.stdout)
    assert int(status["CapBnd"], 16) & (1 << 19)  # CAP_SYS_PTRACE: the configured set, not an empty one
    assert "MADE" not in cp.stdout  # the filter is in force
