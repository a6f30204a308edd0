"""The D-Bus client (runtime.linux.dbus) and the systemd driver's modules are imported only with
--systemd-cgroup: a `husk create`/`start`/`state`/`delete` with the cgroupfs driver imports neither, in the
runtime process or in the stages it forks (the same audit-hook wrapper as test_seccomp_imports.py); nor does it
import jeepney or dbus-fast, which the runtime no longer uses."""
from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest

from tests.integration.conftest import TOP, unique

pytestmark = pytest.mark.root

WRAPPER = r"""
import os, sys
sys.path.insert(0, {top!r})
from runtime import exeguard
exeguard.reexec_self()


def hook(event, args):
    if event == "import" and str(args[0]).split(".")[0] in ("runtime", "jeepney", "dbus_fast"):
        os.write(2, f"AUDIT {{os.getpid()}} import {{args[0]}}\n".encode())


sys.addaudithook(hook)
from runtime import cli
rc = cli.main(sys.argv[1:])
sys.stdout.flush()
os._exit(rc or 0)
"""


def _imports(husk, *args: str) -> set[str]:
    with tempfile.TemporaryFile() as err:
        cp = subprocess.run([sys.executable, "-I", "-S", "-c", WRAPPER.format(top=str(TOP)), "--root", husk.root,
                             *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, timeout=60)
        err.seek(0)
        text = err.read().decode(errors="replace")
    assert cp.returncode == 0, text
    return {line.split(" ", 3)[3] for line in text.splitlines() if line.startswith("AUDIT ")}


def _systemd_modules(names: set[str]) -> set[str]:
    return {n for n in names
            if n.startswith(("jeepney", "dbus_fast", "runtime.cgroups.systemd", "runtime.linux.dbus"))}


def test_cgroupfs_lifecycle_imports_no_dbus_client(husk, make_bundle) -> None:
    bundle = make_bundle(["true"])
    cid = unique()
    husk.created.append(cid)
    created = _imports(husk, "create", "--bundle", str(bundle), cid)
    assert any(n.startswith("runtime.cgroups.") for n in created), created   # the hook saw the cgroup code
    assert _systemd_modules(created) == set()
    for verb in (("start", cid), ("state", cid), ("delete", "--force", cid)):
        assert _systemd_modules(_imports(husk, *verb)) == set(), verb
