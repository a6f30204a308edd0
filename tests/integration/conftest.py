"""Fixtures for root integration tests: a husk command with its own --root, busybox bundles, cleanup.

Every container gets a unique id with the "rtit-" prefix and is force-deleted in a finalizer; bundles and
state roots live in pytest's tmp dirs.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.waiting import wait_for

TOP = Path(__file__).resolve().parents[2]
MKBUNDLE = TOP / "bundles" / "mkbundle"
BUSYBOX = "/usr/bin/busybox"
HUSK = [sys.executable, "-m", "runtime.cli"]


def unique(prefix: str = "rtit") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass
class Runtime:
    """A runc-compatible command line (husk or runc) with its own state root."""
    argv: list[str]
    root: str
    created: list[str] = field(default_factory=list)

    def __call__(self, *args: str, check: bool = True, input: str | None = None,
                 timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess:
        # files, not pipes: a created container inherits stdout/stderr and would hold a pipe open
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            p = subprocess.run([*self.argv, "--root", self.root, *args], stdout=out, stderr=err,
                               input=input.encode() if input is not None else None, timeout=timeout, **kw)
            out.seek(0)
            err.seek(0)
            cp = subprocess.CompletedProcess(p.args, p.returncode, out.read().decode(errors="replace"),
                                             err.read().decode(errors="replace"))
        if check and cp.returncode != 0:
            raise AssertionError(f"{args} failed ({cp.returncode}): {cp.stderr}")
        return cp

    def create(self, bundle: Path, cid: str | None = None, *extra: str, check: bool = True) -> tuple[str, subprocess.CompletedProcess]:
        cid = cid or unique()
        self.created.append(cid)
        cp = self("create", "--bundle", str(bundle), *extra, cid, check=check, stdin=subprocess.DEVNULL)
        return cid, cp

    def run(self, bundle: Path, cid: str | None = None, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess:
        cid = cid or unique()
        self.created.append(cid)
        return self("run", "--bundle", str(bundle), *extra, cid, check=False, timeout=timeout,
                    stdin=subprocess.DEVNULL)

    def state(self, cid: str) -> dict[str, Any]:
        return json.loads(self("state", cid).stdout)

    def wait_status(self, cid: str, want: str, timeout: float = 30.0) -> dict[str, Any]:
        """Polls `state` until the status is `want` (the state returned); AssertionError after `timeout` s."""
        return wait_for(lambda: (st := self.state(cid))["status"] == want and st, timeout,
                        f"container {cid} to be {want}")

    def cleanup(self) -> None:
        for cid in self.created:
            subprocess.run([*self.argv, "--root", self.root, "delete", "--force", cid], capture_output=True,
                           timeout=60)


def run_script(rt: Runtime, make_bundle: Any, script: str, edit: Any = None) -> str:
    """Runs `sh -c script` in a fresh busybox container (foreground); its stdout, after asserting exit 0."""
    cp = rt.run(make_bundle(["sh", "-c", script], edit=edit))
    assert cp.returncode == 0, cp.stderr
    return cp.stdout


@pytest.fixture
def husk(tmp_path: Path) -> Any:
    rt = Runtime(HUSK, str(tmp_path / "husk-root"))
    yield rt
    rt.cleanup()


@pytest.fixture
def runc(tmp_path: Path) -> Any:
    if shutil.which("runc") is None:
        pytest.skip("runc is not installed")
    rt = Runtime(["runc"], str(tmp_path / "runc-root"))
    yield rt
    rt.cleanup()


_TEMPLATE: dict[str, Path] = {}


def _template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if "t" not in _TEMPLATE:
        d = tmp_path_factory.mktemp("bundle-template")
        env = dict(os.environ, PYTHONPATH=str(TOP))
        subprocess.run([sys.executable, str(MKBUNDLE), str(d), "--husk", f"{sys.executable} -m runtime.cli"],
                       check=True, capture_output=True, env=env, cwd=TOP)
        _TEMPLATE["t"] = d
    return _TEMPLATE["t"]


@pytest.fixture
def make_bundle(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """make_bundle(args, **changes) -> a bundle dir whose config runs `args`; `edit(cfg)` may change more."""
    template = _template(tmp_path_factory)
    counter = [0]

    def make(args: list[str], edit: Any = None, terminal: bool = False) -> Path:
        counter[0] += 1
        d = tmp_path / f"bundle{counter[0]}"
        d.mkdir()
        shutil.copytree(template / "rootfs", d / "rootfs", symlinks=True)
        cfg = json.loads((template / "config.json").read_text())
        cfg["process"]["args"] = args
        cfg["process"]["terminal"] = terminal
        cfg["linux"]["cgroupsPath"] = f"/rtit/{uuid.uuid4().hex[:10]}"
        if edit is not None:
            edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
        return d
    return make


@pytest.fixture(scope="session", autouse=True)
def _remove_parent_cgroups() -> Any:
    yield
    for d in Path("/sys/fs/cgroup").glob("*/rtit"):
        try:
            d.rmdir()
        except OSError:
            pass


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory that ids mapped into a user namespace (or other unprivileged ids) can reach: pytest's tmp
    dirs are 0700 root."""
    d = tempfile.mkdtemp(prefix="rtit-public-")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)
