"""The recorded runc command lines (tests/data/runc-argv) and the recorder's conversion (no root needed)."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]
DATA = TOP / "tests" / "data" / "runc-argv"
RECORDER = TOP / "scripts" / "e2e" / "record-runc-argv"
VERBS = {"create", "start", "state", "kill", "delete", "exec", "pause", "resume", "update", "ps", "events",
         "list", "features"}


def _lines(name: str) -> list[list[str]]:
    text = (DATA / name).read_text()
    return [shlex.split(line) for line in text.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("name", ["containerd.txt", "podman.txt"])
def test_data_lines_parse_and_name_a_verb(name: str) -> None:
    lines = _lines(name)
    assert lines
    for argv in lines:
        assert argv[0] == "runc"
        assert argv == ["runc", "--version"] or VERBS & set(argv), argv


@pytest.mark.parametrize("name", ["containerd.txt", "podman.txt", "README.md"])
def test_data_has_no_machine_paths(name: str) -> None:
    text = (DATA / name).read_text()
    # /var/tmp is podman's own default, not this machine's: only a top-level /tmp/ counts.
    for bad in (r"/work/", r"(?<![\w.-])/tmp/", r"/root/"):
        assert not re.search(bad, text), f"{name} mentions {bad}"


def test_containerd_data_covers_the_shim_verbs() -> None:
    verbs = {next(a for a in argv[1:] if a in VERBS) for argv in _lines("containerd.txt") if VERBS & set(argv)}
    assert {"create", "start", "kill", "delete", "exec", "pause", "resume", "ps", "update"} <= verbs
    # The shim's global flags come first, in this order.
    create = next(argv for argv in _lines("containerd.txt") if "create" in argv)
    assert create[1::2][:3] == ["--root", "--log", "--log-format"]


def test_podman_data_covers_podman_and_conmon_verbs() -> None:
    verbs = {next((a for a in argv[1:] if a in VERBS), argv[1]) for argv in _lines("podman.txt")}
    assert {"create", "start", "kill", "delete", "exec", "pause", "resume", "update", "--version"} <= verbs


def _record(n: str, parent: str, argv: list[str], cwd: str, rc: int, **extra) -> list[str]:
    call = {"ev": "call", "n": n, "parent": parent, "argv": argv, "cwd": cwd, "env": {"PATH": "/bin"}}
    call.update(extra)
    return [json.dumps(call), json.dumps({"ev": "exit", "n": n, "rc": rc})]


def test_recorder_scrubs_paths_and_folds_repeats(tmp_path: Path) -> None:
    base = "/tmp/husk-dropin-ctd-abc123"
    bundle = f"{base}/state/io.containerd.runtime.v2.task/ns/c1"
    common = ["/x/runc-log", "--root", f"{base}/runtime-root/ns", "--log", f"{bundle}/log.json",
              "--log-format", "json"]
    lines = []
    lines += _record("1-1.0", "containerd-shim", common + ["start", "c1"], bundle, 0)
    lines += _record("2-2.0", "containerd-shim", common + ["start", "c2"], bundle, 0)
    lines += _record("3-3.0", "containerd-shim", common + ["exec", "--process", "/tmp/runc-process1", "c1"],
                     bundle, 255)
    lines += _record("4-4.0", "python", ["/x/runc-log", "list", "-q"], "/", 0)
    src = tmp_path / "rec.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, str(RECORDER), "convert", "--caller", "containerd", str(src)],
                         capture_output=True, text=True, check=True).stdout
    calls = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert calls == [
        "runc --root '$RUNTIME_ROOT/ns' --log '$STATE/io.containerd.runtime.v2.task/ns/c1/log.json' "
        "--log-format json start c1",
        "runc --root '$RUNTIME_ROOT/ns' --log '$STATE/io.containerd.runtime.v2.task/ns/c1/log.json' "
        "--log-format json exec --process '$TMPDIR/runc-process1' c1",
    ]
    assert "rc=255" in out and "/tmp/" not in out
