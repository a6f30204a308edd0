"""Differential tests: the same bundle under runc (from the distro) and husk gives the same observable
results (output of the process inside, exit code, state transitions)."""
from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.root

SCRIPTS = {
    "identity": "hostname; id; pwd; echo $HOME; umask",
    "limits": "ulimit -Sn; ulimit -Hn; ulimit -c",
    "caps": "grep -E '^(Cap|NoNewPrivs)' /proc/self/status",
    # husk also makes the /sys/fs/cgroup tmpfs itself read-only (runc 1.1 leaves it rw): compare the rest
    "mounts": "awk '{print $5, $6}' /proc/self/mountinfo | sed 's/,.*//' | grep -v '^/sys/fs/cgroup r' | sort",
    "proc_ro": "echo 1 > /proc/sys/kernel/ns_last_pid 2>/dev/null; echo $?; touch /f 2>/dev/null; echo $?",
    "dev": "ls /dev | sort; stat -c '%n %a %t:%T' /dev/null /dev/zero /dev/full /dev/random /dev/urandom /dev/tty",
    "cgroup": "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max "
              "/sys/fs/cgroup/cpu/cpu.shares; ls /sys/fs/cgroup | sort",
    "pidns": "echo $$; tr '\\0' ' ' < /proc/1/cmdline; echo; cat /proc/1/comm",
    "exit": "exit 23",
}


def edit_common(c: dict) -> None:
    c["hostname"] = "diff"
    c["process"]["user"] = {"uid": 33, "gid": 33, "additionalGids": [1]}
    c["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "soft": 512, "hard": 1024},
                               {"type": "RLIMIT_CORE", "soft": 0, "hard": 0}]
    c["linux"]["resources"].update({"memory": {"limit": 50 << 20}, "pids": {"limit": 77}, "cpu": {"shares": 256}})
    c["ociVersion"] = "1.0.2-dev"  # the version runc 1.1.5 writes itself


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_same_output_as_runc(name, husk, runc, make_bundle) -> None:
    b = make_bundle(["sh", "-c", SCRIPTS[name]], edit=edit_common)
    h = husk.run(b)
    r = runc.run(b)
    assert h.returncode == r.returncode, (h.stderr, r.stderr)
    assert normalise(h.stdout) == normalise(r.stdout), (h.stdout, r.stdout)


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_same_state_transitions_as_runc(husk, runc, make_bundle) -> None:
    b = make_bundle(["sleep", "1000"])
    seen = {}
    for name, rt in (("husk", husk), ("runc", runc)):
        cid, _ = rt.create(b)
        states = [rt.state(cid)["status"]]
        rt("start", cid)
        states.append(rt.state(cid)["status"])
        rt("pause", cid)
        states.append(rt.state(cid)["status"])
        rt("resume", cid)
        rt("kill", cid, "KILL")
        st = rt.wait_status(cid, "stopped")
        states.append(st["status"])
        states.append(st["pid"])
        rt("delete", cid)
        states.append(rt("state", cid, check=False).returncode)
        seen[name] = states
    assert seen["husk"] == seen["runc"] == ["created", "running", "paused", "stopped", 0, 1]


def test_state_json_has_runc_fields(husk, runc, make_bundle) -> None:
    b = make_bundle(["sleep", "1000"])
    hid, _ = husk.create(b)
    rid, _ = runc.create(b)
    h, r = husk.state(hid), runc.state(rid)
    assert set(r) - set(h) == set()
    for k in ("ociVersion", "pid", "created"):
        assert k in h
    for k in ("status", "bundle", "rootfs", "owner"):
        assert h[k] == r[k], k
    json.dumps(h)
