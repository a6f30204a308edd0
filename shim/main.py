"""Command lines: `husk-shim` (husk's own) and `containerd-shim-husk-v2` (containerd's shim v2 contract).

containerd runs `containerd-shim-husk-v2 -namespace NS -address ADDR -publish-binary BIN -id ID [-debug]
start` in the bundle dir (TTRPC_ADDRESS in the environment): it prints the socket address and leaves a
detached shim behind; `... -bundle DIR delete` cleans up after a dead shim and prints a DeleteResponse.
Parsing is hand-written: this runs once per container and must not import argparse/click.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time

SOCKET_DIR = "/run/containerd/s"
HUSK_SHIM_ROOT = "/run/husk/shim"


def _parse_go_flags(argv: list[str], bool_flags: set[str]) -> tuple[dict[str, str], list[str]]:
    """Go `flag` package syntax: -name value, -name=value, --name value; booleans without value."""
    flags: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest += argv[i + 1:]
            break
        if a.startswith("-") and len(a) > 1:
            name = a.lstrip("-")
            if "=" in name:
                name, value = name.split("=", 1)
                flags[name] = value
            elif name in bool_flags:
                flags[name] = "true"
            else:
                if i + 1 >= len(argv):
                    raise SystemExit(f"flag -{name} needs a value")
                flags[name] = argv[i + 1]
                i += 1
        else:
            rest.append(a)
        i += 1
    return flags, rest


def _runtime_choice() -> str:
    from shim.runtime_driver import default_runtime
    return default_runtime()


# --- containerd-shim-husk-v2 ----------------------------------------------------------------
def socket_address(containerd_address: str, namespace: str, container_id: str) -> str:
    """Where the shim for (containerd, namespace, id) listens: like containerd's own shims, a hash in a
    short directory (unix socket paths are limited to 108 bytes)."""
    d = hashlib.sha256(os.path.join(containerd_address, namespace, container_id).encode()).hexdigest()
    return os.path.join(os.environ.get("HUSK_SHIM_SOCKET_DIR", SOCKET_DIR), d)


def _can_connect(path: str) -> bool:
    from shim.unixpath import connect_unix
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        connect_unix(s, path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _containerd_config(flags: dict[str, str], bundle: str):
    from shim.service import ShimConfig
    ns = flags.get("namespace") or os.environ.get("NAMESPACE") or "default"
    cid = flags.get("id", "")
    if not cid:
        raise SystemExit("-id is required")
    return ShimConfig(
        id=cid, namespace=ns, address=socket_address(flags.get("address", ""), ns, cid),
        state_dir=bundle, bundle=bundle, runtime=_runtime_choice(),
        runtime_root=os.environ.get("HUSK_SHIM_RUNTIME_ROOT", "/run/containerd/husk"),
        ttrpc_address=os.environ.get("TTRPC_ADDRESS", ""),
        allowed_uids=(0, os.getuid()), write_address_file=True)


def _open_shim_log(bundle: str) -> int:
    """containerd reads the fifo `log` in the bundle; without a reader (or fifo) logs go to /dev/null."""
    try:
        return os.open(os.path.join(bundle, "log"), os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)


# The annotations that group containers into one shim, as containerd-shim-runc-v2 reads them (its
# groupLabels): the CRI plugin puts the pod's sandbox id on the pause container and every container of the pod.
GROUP_ANNOTATIONS = ("io.containerd.runc.v2.group", "io.kubernetes.cri.sandbox-id")


def grouping_id(bundle: str, container_id: str) -> str:
    """The id whose shim serves `container_id`: its group from <bundle>/config.json's annotations, else
    itself (a container of a pod goes to the shim of the pod's sandbox, whose socket is derived from it)."""
    try:
        with open(os.path.join(bundle, "config.json")) as f:
            annotations = json.load(f).get("annotations") or {}
    except (OSError, ValueError, AttributeError):
        return container_id
    for key in GROUP_ANNOTATIONS:
        group = annotations.get(key) if isinstance(annotations, dict) else None
        if isinstance(group, str) and group:
            return group
    return container_id


def containerd_start(flags: dict[str, str]) -> int:
    from shim.daemon import _write_atomic, launch_fresh
    bundle = os.getcwd()
    cfg = _containerd_config(flags, bundle)
    group = grouping_id(bundle, cfg.id)
    if group != cfg.id:
        cfg.address = socket_address(flags.get("address", ""), cfg.namespace, group)
    # Save the runtime choice for `delete`, which must find the same runtime and root after a crash.
    with open(os.path.join(bundle, "runtime.json"), "w") as f:
        json.dump({"runtime": cfg.runtime, "runtime_root": os.path.join(cfg.runtime_root, cfg.namespace)}, f)
    def join() -> int:
        # the group's shim runs (or a second start of the same id): it serves this container too
        _write_atomic(os.path.join(bundle, "address"), f"unix://{cfg.address}")
        sys.stdout.write(f"unix://{cfg.address}")
        return 0

    os.makedirs(os.path.dirname(cfg.address), mode=0o711, exist_ok=True)
    from shim.ttrpc_server import listen_unix
    # Two starts of one group at once (a pod's containers created together): without the lock both found no
    # socket, and the second's listen replaced the first's socket, leaving two shims for one group.
    import fcntl
    lock = os.open(cfg.address + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(cfg.address):
            if _can_connect(cfg.address):
                return join()
            os.unlink(cfg.address)      # left by a shim that died
        listener = listen_unix(cfg.address)
    finally:
        os.close(lock)                  # the socket listens now: a later start connects to it
    log_fd = _open_shim_log(bundle)
    os.set_blocking(log_fd, True)
    try:
        launch_fresh(cfg, listener, log_fd, debug=flags.get("debug") == "true")
    except (OSError, RuntimeError, ValueError) as err:
        os.unlink(cfg.address)
        sys.stderr.write(f"containerd-shim-husk-v2 start {cfg.id}: {err}\n")
        return 1
    finally:
        listener.close()
        os.close(log_fd)
    sys.stdout.write(f"unix://{cfg.address}")
    sys.stdout.flush()
    return 0


def containerd_delete(flags: dict[str, str]) -> int:
    """Cleans up after a shim containerd could not reach: runtime delete --force, unmount, report."""
    from shim import exitfile
    from shim.pb import google, task as taskpb
    from shim.rootfs import unmount_rootfs
    from shim.runtime_driver import RuntimeFailure, RuntimeOptions, make_driver
    bundle = flags.get("bundle") or os.getcwd()
    cid = flags.get("id", "")
    ns = flags.get("namespace") or "default"
    # The dead shim could not remove its socket. First: the runtime's delete below may be slow (it waits
    # for the killed init to be reaped) and containerd gives this command a few seconds only.
    try:
        with open(os.path.join(bundle, "address")) as f:
            sock = f.read().strip()
        if sock.startswith("unix://") and not _can_connect(sock[len("unix://"):]):
            os.unlink(sock[len("unix://"):])
    except OSError:
        pass
    runtime, root = _runtime_choice(), os.path.join("/run/containerd/husk", ns)
    try:
        with open(os.path.join(bundle, "runtime.json")) as f:
            saved = json.load(f)
        runtime, root = saved["runtime"], saved["runtime_root"]
    except (OSError, ValueError, KeyError):
        pass
    try:
        make_driver(runtime, RuntimeOptions(root=root), os.path.join(bundle, "runtime-log.json")).delete(cid, force=True)
    except (RuntimeFailure, ImportError) as err:
        sys.stderr.write(f"husk-shim delete {cid}: {err}\n")
    if os.path.ismount(os.path.join(bundle, "rootfs")):
        unmount_rootfs(os.path.join(bundle, "rootfs"))
    rec = exitfile.read(bundle, "")
    ns_now = time.time_ns()
    resp = taskpb.DeleteResponse(
        pid=rec.pid if rec else 0, exit_status=rec.exit_status if rec else 128 + 9,
        exited_at=google.Timestamp(seconds=(rec.exited_at_ns if rec else ns_now) // 10**9,
                                   nanos=(rec.exited_at_ns if rec else ns_now) % 10**9))
    sys.stdout.buffer.write(resp.encode())
    sys.stdout.flush()
    return 0


def containerd_main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    flags, rest = _parse_go_flags(argv, {"debug", "v", "version"})
    if "v" in flags or "version" in flags:
        from shim.service import VERSION
        print(f"containerd-shim-husk-v2: {VERSION}")
        return 0
    cmd = rest[0] if rest else ""
    if cmd == "start":
        return containerd_start(flags)
    if cmd == "delete":
        return containerd_delete(flags)
    sys.stderr.write(f"containerd-shim-husk-v2: unknown command {cmd!r} (want start or delete)\n")
    return 2


# --- husk-shim --------------------------------------------------------------------------------
USAGE = """usage: husk-shim start|serve --id ID [--address SOCK] [--state-dir DIR] [--bundle DIR]
                 [--namespace NS] [--runtime husk|runc|crun|PATH] [--runtime-root DIR]
                 [--ttrpc-address SOCK] [--log FILE] [--debug]
  serve   run the shim in the foreground
  start   start a detached shim (fresh interpreter) and print {"address": ..., "pid": ...}
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    cmd = argv[0]
    flags, rest = _parse_go_flags(argv[1:], {"debug"})
    if cmd not in ("start", "serve") or rest or "id" not in flags:
        sys.stderr.write(USAGE)
        return 2
    from shim.service import ShimConfig
    cid = flags["id"]
    state_dir = flags.get("state-dir") or os.path.join(HUSK_SHIM_ROOT, cid)
    cfg = ShimConfig(id=cid, address=flags.get("address") or os.path.join(state_dir, "shim.sock"),
                     state_dir=state_dir, namespace=flags.get("namespace", "default"),
                     runtime=flags.get("runtime") or _runtime_choice(),
                     runtime_root=flags.get("runtime-root") or "/run/husk/runtime",
                     ttrpc_address=flags.get("ttrpc-address", ""), bundle=flags.get("bundle", ""),
                     allowed_uids=(0, os.getuid()))
    debug = flags.get("debug") == "true"
    if cmd == "serve":
        from shim.daemon import serve, setup_logging
        setup_logging(cid, debug)
        return serve(cfg)
    from shim.daemon import launch_fresh
    from shim.ttrpc_server import listen_unix
    os.makedirs(state_dir, mode=0o711, exist_ok=True)
    os.makedirs(os.path.dirname(cfg.address) or ".", mode=0o711, exist_ok=True)
    listener = listen_unix(cfg.address)
    log_path = flags.get("log") or os.path.join(state_dir, "shim.log")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
    pid = launch_fresh(cfg, listener, log_fd, debug=debug)
    listener.close()
    os.close(log_fd)
    sys.stdout.write(json.dumps({"address": f"unix://{cfg.address}", "pid": pid}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
