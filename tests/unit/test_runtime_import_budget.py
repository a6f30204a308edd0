"""Every runtime verb is a fresh interpreter (`husk create`, `start`, `delete`, ... as containerd or a shim runs
them), so what the verbs' modules import is paid on every container start. The modules of the fast CLI path and
of each cgroup flavour (v1, v2 with its resources and device filter, the systemd driver with its D-Bus client)
import none of the heavy standard modules: `dataclasses` alone brings inspect, ast, dis, enum, re and tokenize
(~8-10 ms), `typing` re (~2-4 ms). No root."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HEAVY = ("typing", "dataclasses", "inspect", "logging", "json", "re", "enum", "signal", "threading",
         "collections", "functools")

VERB_MODULES = ("runtime.cli", "runtime.fastcli", "runtime.lifecycle", "runtime.parent", "runtime.state",
                "runtime.config", "runtime.sync", "runtime.child", "runtime.init", "runtime.rootfs",
                "runtime.capabilities", "runtime.process", "runtime.update", "runtime.cgroups")

FLAVOURS = {
    "cgroup v1": ("runtime.cgroups.v1",),
    "cgroup v2": ("runtime.cgroups.v2", "runtime.cgroups.v2_resources", "runtime.cgroups.bpf_devices"),
    # --systemd-cgroup (containerd with SystemdCgroup=true, kubelet's systemd driver): the D-Bus client too
    "systemd": ("runtime.cgroups.v2", "runtime.cgroups.v2_resources", "runtime.cgroups.systemd",
                "runtime.cgroups.systemd_dbus", "runtime.linux.dbus"),
}


def _imported(modules: tuple[str, ...]) -> set[str]:
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            f"import {', '.join(modules)};"
            "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, TOP], capture_output=True, text=True,
                         check=True).stdout.split()
    return set(out)


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_the_verbs_import_no_heavy_module(flavour: str) -> None:
    got = _imported(VERB_MODULES + FLAVOURS[flavour])
    assert got.isdisjoint(HEAVY), sorted(got.intersection(HEAVY))


def test_the_v2_records_behave_as_frozen_dataclasses() -> None:
    from runtime.cgroups.bpf_devices import Insn, Rule
    from runtime.cgroups.v2_resources import Write
    w = Write("memory.max", "1024", "linux.resources.memory.limit")
    assert w.missing_ok is False and w == Write(file="memory.max", value="1024",
                                               field="linux.resources.memory.limit", missing_ok=False)
    assert Insn(0x95) == Insn(code=0x95, dst=0, src=0, off=0, imm=0) and hash(Insn(0x95)) == hash(Insn(0x95))
    assert Rule(True, "c", 1, 3, 7) != Rule(False, "c", 1, 3, 7)
    with pytest.raises(AttributeError):
        w.value = "2048"    # type: ignore[misc]
