"""A throwaway dbus-daemon for the D-Bus tests (husk's client, the fake systemd): a session-config bus on a
socket in a temporary directory, killed afterwards. Skips the test when dbus-daemon is not installed."""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def throwaway_bus(prefix: str = "husk-dbus-") -> Iterator[str]:
    """Yields the bus's address once the daemon listens (it prints the address then)."""
    daemon = shutil.which("dbus-daemon")
    if daemon is None:
        pytest.skip("dbus-daemon is not installed")
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        address = f"unix:path={tmp}/bus"
        proc = subprocess.Popen([daemon, "--session", "--nofork", "--nopidfile", f"--address={address}",
                                 "--print-address=1"], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            proc.stdout.readline()      # the address: the daemon listens from now on
            yield address
        finally:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
