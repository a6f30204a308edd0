"""A husk container as a workload: a busybox bundle (bundles/mkbundle) whose config.json carries a
`linux.resources` dict, with an agent (agent.sh, busybox sh) as its init that runs the commands the test sends.

The container is driven only through husk's command line (`run --keep`, state, pause, resume, update, kill,
delete), as a shim or podman would; its cgroup is read through the runtime's own manager for the host
(`runtime.cgroups.manager_for`: v2 in the VM, v1 on a hybrid host). Names carry the `husk-vmct` prefix.
"""
from __future__ import annotations

import copy
import errno
import json
import os
import select
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from runtime.cgroups import manager_for
from runtime.cgroups.manager import Manager
from runtime.cgroups.v2 import V2Manager
from tests.vm.workload import Died

TOP = Path(__file__).resolve().parents[2]
# The installed command (scripts/install-deps writes the fast launcher there): it starts in about half the time
# of `python -m runtime.cli`, which counts under emulation.
_LAUNCHER = Path(sys.prefix) / "bin" / "husk"
HUSK = [str(_LAUNCHER)] if os.access(_LAUNCHER, os.X_OK) else [sys.executable, "-m", "runtime.cli"]
PREFIX = "husk-vmct"
AGENT = Path(__file__).with_name("agent.sh")
CLI_TIMEOUT = 120.0     # bounds, so that a hung container fails its test instead of stalling the VM run
REPLY_TIMEOUT = 120.0

# busybox sh and its applets print strerror() texts, except for these two of sh's own
_ERRNO_BY_TEXT = {os.strerror(n): n for n in errno.errorcode} | {"no such file": errno.ENOENT,
                                                                 "nonexistent directory": errno.ENOENT}
_REDIRECT = {"r": "<", "w": ">", "rw": "<>"}


def errno_of(text: str) -> int:
    """The errno of the last "...: <strerror>" message in `text` (as busybox prints them)."""
    for line in reversed(text.strip().splitlines()):
        reason = line.rsplit(": ", 1)[-1].strip()
        if reason in _ERRNO_BY_TEXT:
            return _ERRNO_BY_TEXT[reason]
    raise AssertionError(f"no error message in {text!r}")


@dataclass(frozen=True)
class BundleTemplate:
    rootfs: Path                  # shared by every container (mounted read-only): busybox + /agent.sh
    config: dict[str, Any]        # `husk spec`'s config.json


def build_template(directory: Path) -> BundleTemplate:
    subprocess.run([sys.executable, str(TOP / "bundles" / "mkbundle"), str(directory),
                    "--husk", shlex.join(HUSK)], check=True, capture_output=True, cwd=TOP, timeout=CLI_TIMEOUT)
    shutil.copy(AGENT, directory / "rootfs" / "agent.sh")
    return BundleTemplate(directory / "rootfs", json.loads((directory / "config.json").read_text()))


def cgroup_dirs(m: Manager) -> list[str]:
    """Every directory the manager's cgroup has on this host (one on v2, one per hierarchy on v1)."""
    if isinstance(m, V2Manager):
        return [m.dir]
    from runtime.cgroups.v1 import hierarchies
    return sorted({mnt + m.path for mnt in hierarchies().values()})


def host_file(m: Manager, rel: str) -> str:
    """A cgroup file named as the container sees it under /sys/fs/cgroup: "memory.max" on v2, "memory/..." on
    v1 (one directory per hierarchy)."""
    if isinstance(m, V2Manager):
        return f"{m.dir}/{rel}"
    ctrl, name = rel.split("/", 1)
    d = m.dir(ctrl)  # type: ignore[attr-defined]
    assert d is not None, f"no {ctrl} hierarchy on this host"
    return f"{d}/{name}"


def host_read(m: Manager, rel: str) -> str:
    with open(host_file(m, rel)) as f:
        return f.read().strip()


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def ns_pid(host_pid: int) -> int:
    """The pid a host process has in its innermost pid namespace (the container's)."""
    with open(f"/proc/{host_pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    raise AssertionError(f"/proc/{host_pid}/status has no NSpid line")


class ContainerWorkload:
    """One container, started by `husk run --keep` with the agent as its init; `call` runs the same kinds of
    commands as tests/vm/workload.py's forked workload, inside the container."""

    def __init__(self, template: BundleTemplate, workdir: Path, resources: dict[str, Any] | None,
                 cgroup_path: str, *, cgroupns: bool = True,
                 edit: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.id = f"{PREFIX}-{uuid.uuid4().hex[:10]}"
        self.root = str(workdir / "husk-root")
        self.bundle = workdir / self.id
        self.bundle.mkdir(parents=True)
        cfg = copy.deepcopy(template.config)
        cfg["root"] = {"path": str(template.rootfs), "readonly": True}
        cfg["process"]["args"] = ["sh", "/agent.sh"]
        cfg["process"]["terminal"] = False
        cfg["hostname"] = self.id
        linux = cfg["linux"]
        linux["cgroupsPath"] = cgroup_path
        linux["resources"] = copy.deepcopy(resources) if resources is not None else {}
        linux["namespaces"] = [n for n in linux["namespaces"] if n["type"] != "cgroup"]
        if cgroupns:
            linux["namespaces"].append({"type": "cgroup"})
        if edit is not None:
            edit(cfg)
        self.config = cfg
        (self.bundle / "config.json").write_text(json.dumps(cfg, indent=1))
        self.cgroupns = cgroupns
        self.manager: Manager = manager_for(cgroup_path)
        self.v2 = isinstance(self.manager, V2Manager)
        self._buf = b""
        self._stderr = open(workdir / f"{self.id}.stderr", "w+b")
        self.proc: subprocess.Popen | None = None
        self.pid = 0
        self.deleted = False

    def start(self) -> "ContainerWorkload":
        """`husk run --keep` with pipes as the container's stdin/stdout; returns once the agent answers."""
        self.proc = subprocess.Popen([*HUSK, "--root", self.root, "run", "--keep", "--bundle", str(self.bundle),
                                      self.id], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in = self.proc.stdin
        self._out = self.proc.stdout.fileno()
        try:
            self.call("ping")             # the first answer: the container runs
        except Died as e:
            raise AssertionError(f"husk run failed: {e}") from None
        self.pid = int(self.state()["pid"])
        return self

    # --- the command line -------------------------------------------------------------------------------------
    def husk(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        cp = subprocess.run([*HUSK, "--root", self.root, *args], capture_output=True, text=True, input=input,
                            timeout=CLI_TIMEOUT, stdin=None if input is not None else subprocess.DEVNULL)
        if check and cp.returncode != 0:
            raise AssertionError(f"husk {' '.join(args)} failed ({cp.returncode}): {cp.stderr.strip()}")
        if args[0] == "delete" and cp.returncode == 0:
            self.deleted = True
        return cp

    def state(self) -> dict[str, Any]:
        return json.loads(self.husk("state", self.id).stdout)

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    # --- the agent ----------------------------------------------------------------------------------------------
    def _readline(self, deadline: float) -> str | None:
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"container {self.id}: no answer within {REPLY_TIMEOUT:.0f} s")
            ready, _, _ = select.select([self._out], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._out, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode(errors="replace")

    def sh(self, command: str) -> tuple[str, int]:
        """Runs one line of shell in the agent; returns (its output with stderr, its exit status)."""
        assert "\n" not in command
        try:
            self._in.write(command.encode() + b"\n")
            self._in.flush()
        except BrokenPipeError:
            raise Died(f"container {self.id} is gone: {self.stderr()}") from None
        deadline = time.monotonic() + REPLY_TIMEOUT
        lines: list[str] = []
        while True:
            line = self._readline(deadline)
            if line is None:
                raise Died(f"container {self.id} ended during {command!r} (husk run: "
                           f"{self.exit_code()}): {self.stderr()}")
            if line.startswith("--end "):
                if lines and lines[-1] == "":
                    lines.pop()            # the agent's separator before the status line
                return "\n".join(lines), int(line.split()[1])
            lines.append(line)

    def call(self, op: str, *args: Any) -> Any:
        if op == "ping":
            return int(self.sh("echo $$")[0])
        if op == "open":        # (path, "r"|"w"|"rw") -> 0 or the errno
            path, mode = args
            out, _ = self.sh(f"true 3{_REDIRECT[mode]}{shlex.quote(path)} && echo opened")
            return 0 if out.strip() == "opened" else errno_of(out)
        if op == "mknod":       # (path, "c"|"b", major, minor) -> 0 or the errno; the node is kept
            path, kind, major, minor = args
            out, status = self.sh(f"mknod {shlex.quote(path)} {kind} {int(major)} {int(minor)}")
            return 0 if status == 0 else errno_of(out)
        if op == "alloc":       # (nbytes) -> the exit status of a child that allocates and touches nbytes
            out, status = self.sh(f"dd if=/dev/zero of=/dev/null bs={int(args[0])} count=1 2>/dev/null")
            return status
        if op == "fork":        # (n) -> [sleepers forked, errno of the failed fork or 0]; then ends them all
            return self._fork(int(args[0]))
        if op == "spawn":       # ("spin"|"sleep") -> its pid in the container
            body = "while :; do :; done" if args[0] == "spin" else "sleep 100000"
            return int(self.sh(f"( {body} ) >/dev/null 2>&1 & echo $!")[0])
        if op == "cat":         # (path) -> the file's text (stripped), as the container sees it
            out, status = self.sh(f"cat {shlex.quote(args[0])}")
            if status != 0:
                raise AssertionError(f"cat {args[0]} inside {self.id}: {out}")
            return out.strip()
        raise ValueError(f"unknown op {op!r}")

    def _fork(self, n: int) -> list[int]:
        # A subshell forks sleepers until it has n or a fork fails (busybox sh then ends that subshell: the
        # agent survives). `kill -9 -1` from the namespace's init ends every other process in the container;
        # the `sleep` runs of the wait loop reap them (the agent is their new parent), until only the agent
        # is left in pids.current.
        current = "/sys/fs/cgroup/pids.current" if self.v2 else "/sys/fs/cgroup/pids/pids.current"
        out, _ = self.sh(
            f"( i=0; while [ $i -lt {n} ]; do sleep 100000 >/dev/null 2>&1 & echo forked $!; i=$((i+1)); done ); "
            f"kill -9 -1 2>/dev/null; i=0; "
            f"while read c < {current} && [ $c -gt 1 ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done; "
            f"echo left $c")
        lines = out.splitlines()
        forked = sum(1 for ln in lines if ln.startswith("forked "))
        err = errno_of("\n".join(ln for ln in lines if "can't fork" in ln)) if forked < n else 0
        left = [ln for ln in lines if ln.startswith("left ")]
        assert left == ["left 1"], f"processes left after the fork test: {out}"
        return [forked, err]

    def exec_alloc(self, nbytes: int) -> None:
        """Replaces the agent (the init) by a process that allocates nbytes; returns once the container ended."""
        try:
            out, status = self.sh(f"exec dd if=/dev/zero of=/dev/null bs={nbytes} count=1 2>/dev/null")
        except Died:
            return
        raise AssertionError(f"allocating {nbytes} bytes did not end the container (status {status}): {out}")

    # --- the end ----------------------------------------------------------------------------------------------
    def alive(self) -> bool:
        assert self.proc is not None
        return self.proc.poll() is None

    def exit_code(self) -> int:
        """husk run's exit status: the init's exit code, or 128+signal (137 after an OOM kill)."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=CLI_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"husk run {self.id} did not end") from None

    def finish(self) -> int:
        """Closes the agent's stdin (it exits 0) and returns husk run's exit status."""
        try:
            self._in.close()
        except BrokenPipeError:
            pass
        return self.exit_code()

    def close(self) -> None:
        """Removes the container whatever its state (kill + delete --force), then its cgroup if still there."""
        if not self.deleted:
            self.husk("delete", "--force", self.id, check=False)
        if self.proc is None:
            self._stderr.close()
            return
        if self.proc.poll() is None:
            self.proc.kill()      # only husk run itself, by its pid: the container is gone with delete
        self.proc.wait()
        for f in (self._in, self.proc.stdout, self._stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        if self.manager.exists():
            self.manager.destroy()
