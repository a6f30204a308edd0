"""Helpers for the shim's integration and e2e tests: busybox bundles, a running shim, cleanup.

Everything gets a unique `hshim-` prefixed name; cleanup kills only processes these helpers started.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field

from tests.support.waiting import wait_for  # the suites import it from here too

BUSYBOX = "/usr/bin/busybox"
APPLETS = ("sh", "cat", "echo", "sleep", "seq", "yes", "head", "true", "false", "ls", "kill", "printf",
           "dd", "tr", "wc", "tail", "env", "id", "stty", "ps")
TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def unique(prefix: str = "hshim") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def make_rootfs(path: str) -> None:
    os.makedirs(os.path.join(path, "bin"), exist_ok=True)
    for d in ("proc", "sys", "dev", "tmp", "etc"):
        os.makedirs(os.path.join(path, d), exist_ok=True)
    shutil.copy2(BUSYBOX, os.path.join(path, "bin", "busybox"))
    for a in APPLETS:
        os.symlink("busybox", os.path.join(path, "bin", a))


def make_bundle(base: str, cid: str, args: list[str], terminal: bool = False, memory_limit: int = 0,
                rootfs: bool = True) -> str:
    bundle = os.path.join(base, cid)
    os.makedirs(bundle)
    if rootfs:
        make_rootfs(os.path.join(bundle, "rootfs"))
    else:
        os.makedirs(os.path.join(bundle, "rootfs"))
    subprocess.run(["runc", "spec", "-b", bundle], check=True)
    with open(os.path.join(bundle, "config.json")) as f:
        spec = json.load(f)
    spec["process"]["args"] = args
    spec["process"]["terminal"] = terminal
    spec["process"]["env"] = ["PATH=/bin", "TERM=xterm"]
    spec["root"]["readonly"] = False
    spec["linux"]["cgroupsPath"] = f"/hshim-test/{cid}"
    spec["hostname"] = cid[:60]
    if memory_limit:
        spec["linux"].setdefault("resources", {})["memory"] = {"limit": memory_limit, "swap": memory_limit}
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(spec, f)
    return bundle


@dataclass
class RunningShim:
    cid: str
    address: str
    state_dir: str
    runtime: str
    runtime_root: str
    proc: subprocess.Popen
    log_path: str
    extra_cleanup: list = field(default_factory=list)

    def client(self, **kw):
        from shim.client import TaskClient
        return TaskClient(self.address, **kw)

    def log(self) -> str:
        try:
            with open(self.log_path) as f:
                return f.read()
        except OSError:
            return ""


def start_shim(tmp: str, runtime: str, cid: str | None = None, ttrpc_address: str = "",
               env: dict | None = None) -> RunningShim:
    cid = cid or unique()
    state_dir = os.path.join(tmp, f"state-{cid}")
    address = os.path.join(tmp, f"{cid}.sock")
    root = os.path.join(tmp, "runtime-root")
    log_path = os.path.join(tmp, f"{cid}-shim.log")
    args = [sys.executable, "-m", "shim.main", "serve", "--id", cid, "--address", address,
            "--state-dir", state_dir, "--runtime", runtime, "--runtime-root", root, "--debug"]
    if ttrpc_address:
        args += ["--ttrpc-address", ttrpc_address]
    logf = open(log_path, "ab")
    proc = subprocess.Popen(args, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL, cwd=TOP,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    logf.close()

    def listening() -> bool:                # the file exists from bind(), connections work after listen()
        if proc.poll() is not None:
            with open(log_path, errors="replace") as f:
                raise RuntimeError(f"shim exited {proc.returncode}: {f.read()}")
        return _connectable(address)
    wait_for(listening, 20, f"the shim to listen on {address} (log: {log_path})", interval=0.02)
    return RunningShim(cid, address, state_dir, runtime, root, proc, log_path)


def _connectable(path: str) -> bool:
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def cleanup_shim(s: RunningShim) -> None:
    """Force-removes the container (whatever state it is in), then ends the shim by its pid."""
    if s.runtime == "husk":
        subprocess.run([sys.executable, "-c", "import sys, runtime.lifecycle as l; l.delete(sys.argv[1], sys.argv[2], force=True)",
                        s.runtime_root, s.cid], cwd=TOP, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        subprocess.run([s.runtime, "--root", s.runtime_root, "delete", "--force", s.cid],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if s.proc.poll() is None:
        s.proc.send_signal(signal.SIGKILL)
    s.proc.wait(10)
    for fn in s.extra_cleanup:
        fn()
    remove_cgroup(f"/hshim-test/{s.cid}")


def remove_cgroup(rel: str) -> None:
    """Removes the container's cgroup (if the runtime left it) and its parent once empty, in every hierarchy
    (each v1 controller's, or the unified one at /sys/fs/cgroup itself)."""
    base = "/sys/fs/cgroup"
    for root in [base, *(os.path.join(base, ctrl) for ctrl in os.listdir(base))]:
        d = os.path.join(root, rel.lstrip("/"))
        for target in (d, os.path.dirname(d)):
            try:
                os.rmdir(target)
            except OSError:
                pass




def runtimes_available() -> list[str]:
    out = ["runc"]
    try:
        import runtime.lifecycle  # noqa: F401
        out.append("husk")
    except ImportError:
        pass
    return out


HUSK_BINARY = os.path.join(TOP, ".venv", "bin", "husk")   # the fast launcher scripts/install-deps writes


def cgroup_v2_unified() -> bool:
    return os.path.exists("/sys/fs/cgroup/cgroup.controllers")


def binary_runtimes() -> list[str]:
    """The runc-compatible binaries the shim can drive here, each through its command line: runc, husk's own
    launcher (a binary like the others, not the in-process driver) and crun, which refuses a hybrid host's
    cgroups and so is driven only where /sys/fs/cgroup is cgroup v2."""
    out = ["runc"]
    if os.access(HUSK_BINARY, os.X_OK):
        out.append(HUSK_BINARY)
    if shutil.which("crun") is not None and cgroup_v2_unified():
        out.append("crun")
    return out


def lifecycle_runtimes() -> list[str]:
    """Every runtime the shim's lifecycle tests run against: husk in-process and every binary above."""
    return [r for r in runtimes_available() if r != "runc"] + binary_runtimes()


def runtime_id(runtime: str) -> str:
    """A test id: "husk" is the in-process driver, "husk-binary" the launcher run as a binary."""
    return "husk-binary" if runtime == HUSK_BINARY else os.path.basename(runtime)


# --- a tiny OCI image (static busybox) for containerd e2e tests ------------------------------------
def build_busybox_oci_archive(out_path: str, ref: str) -> None:
    """Writes an OCI image layout tar (one layer: static busybox + applet links) that `ctr images import`
    takes; `ref` becomes the image name through the io.containerd.image.name annotation."""
    import gzip
    import hashlib
    import io
    import tarfile

    def blob(data: bytes) -> tuple[str, bytes]:
        return "sha256:" + hashlib.sha256(data).hexdigest(), data

    layer_raw = io.BytesIO()
    with tarfile.open(fileobj=layer_raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for d in ("bin", "proc", "sys", "dev", "tmp", "etc"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 0
            tf.addfile(ti)
        with open(BUSYBOX, "rb") as f:
            data = f.read()
        ti = tarfile.TarInfo("bin/busybox")
        ti.size, ti.mode, ti.mtime = len(data), 0o755, 0
        tf.addfile(ti, io.BytesIO(data))
        for a in APPLETS:
            ti = tarfile.TarInfo(f"bin/{a}")
            ti.type, ti.linkname, ti.mode, ti.mtime = tarfile.SYMTYPE, "busybox", 0o777, 0
            tf.addfile(ti)
    diff_id = "sha256:" + hashlib.sha256(layer_raw.getvalue()).hexdigest()
    layer_digest, layer = blob(gzip.compress(layer_raw.getvalue(), mtime=0))
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Env": ["PATH=/bin"], "Cmd": ["sh"]},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    config_digest, _ = blob(config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": config_digest, "size": len(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                       "digest": layer_digest, "size": len(layer)}]}).encode()
    manifest_digest, _ = blob(manifest)
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
        "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1]}}]}).encode()
    with tarfile.open(out_path, "w") as tf:
        def add(name: str, data: bytes) -> None:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
            tf.addfile(ti, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index)
        for digest, data in ((layer_digest, layer), (config_digest, config), (manifest_digest, manifest)):
            add(f"blobs/sha256/{digest.split(':')[1]}", data)
