"""A private containerd (the distro's 1.6) for benchmarks and e2e tests: its own root, state, socket and config,
no CRI plugin, stopped by its pid. Nothing of the system containerd is touched."""
from __future__ import annotations

import os
import signal
import subprocess

from tests.support.waiting import wait_for

CONTAINERD_CONFIG = """version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{d}/c.sock"
[ttrpc]
  address = "{d}/c.sock.ttrpc"
[debug]
  level = "warn"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"""


class Containerd:
    """containerd with everything under `d` (keep `d` short: the socket path must fit in 108 bytes)."""

    def __init__(self, d: str) -> None:
        self.d = d
        self.sock = os.path.join(d, "c.sock")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        conf = os.path.join(self.d, "config.toml")
        with open(conf, "w") as f:
            f.write(CONTAINERD_CONFIG.format(d=self.d))
        logf = open(os.path.join(self.d, "containerd.log"), "ab")
        self.proc = subprocess.Popen(["containerd", "--config", conf], stdout=logf, stderr=logf)
        logf.close()
        wait_for(lambda: os.path.exists(self.sock) and self.ctr("version").returncode == 0, 10,
                 f"containerd to answer on {self.sock} (log: {os.path.join(self.d, 'containerd.log')})")

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ctr", "-a", self.sock, "-n", "bench", *args], capture_output=True, text=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


