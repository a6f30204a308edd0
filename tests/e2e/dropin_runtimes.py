"""The OCI runtime binaries the drop-in tests run under containerd and podman: runc (the control) and husk.

Owns finding each binary and the pytest parameters for them; it never starts containerd or podman.
husk is found as HUSK_BIN, else the `husk` launcher next to the test interpreter, else on PATH.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

RUNC = "/usr/sbin/runc"


@dataclass(frozen=True)
class RuntimeBinary:
    """A runc-compatible runtime: its short name (used in ids and test names) and absolute path."""

    name: str
    path: str

    def run(self, *args: str, root: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run the runtime itself (e.g. `state`, `list`) with an optional --root, capturing output."""
        argv = [self.path] + (["--root", root] if root else []) + list(args)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def container_ids(self, root: str | None = None) -> set[str]:
        """Ids the runtime lists under root (`list -q`), as containerd and podman would see them."""
        res = self.run("list", "-q", root=root)
        if res.returncode != 0:
            raise RuntimeError(f"{self.path} list -q (root {root or 'default'}): rc {res.returncode}: "
                               f"{res.stderr.strip()}")
        return {line.strip() for line in res.stdout.splitlines() if line.strip()}

    def force_delete_bundles_under(self, prefix: str, root: str | None = None) -> list[str]:
        """Cleanup: `delete --force` every container whose bundle lies under prefix (the test's own dir)."""
        res = self.run("list", "--format", "json", root=root)
        if res.returncode != 0:
            return []
        try:
            entries = json.loads(res.stdout or "null") or []
        except ValueError:
            return []
        removed = []
        for entry in entries:
            bundle = str(entry.get("bundle", ""))
            if bundle == prefix or bundle.startswith(prefix.rstrip("/") + "/"):
                self.run("delete", "--force", str(entry["id"]), root=root)
                removed.append(str(entry["id"]))
        return removed


def find_husk() -> str | None:
    env = os.environ.get("HUSK_BIN")
    if env:
        return env
    beside = Path(sys.executable).parent / "husk"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("husk")


def resolve(name: str) -> RuntimeBinary:
    """The binary for a parameter name; fails the test (not skips) when it is missing."""
    if name == "runc":
        if not os.access(RUNC, os.X_OK):
            pytest.fail(f"runc not found at {RUNC} (scripts/install-deps installs it)")
        return RuntimeBinary("runc", RUNC)
    if name == "husk":
        path = find_husk()
        if not path:
            pytest.fail("husk launcher not found: set HUSK_BIN or run scripts/install-deps")
        return RuntimeBinary("husk", os.path.abspath(path))
    raise ValueError(f"unknown runtime parameter {name!r}")


RUNTIME_NAMES = ("runc", "husk")
