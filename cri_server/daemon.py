"""husk-cri's start-up and shutdown: directories, policies, the spawner, the gRPC server, signals.

Order matters: everything that forks (the shim spawner, phase 2) starts before grpc is imported, because a
process running gRPC threads must never fork. SIGTERM stops serving and leaves pods and containers running
(they belong to their shims). This module wires parts together; the RPC logic lives in cri_server/rpc.
"""
from __future__ import annotations

import logging
import os
import socket
import stat
from typing import Any

from cri_server import logs, oom
from cri_server.config import Config

log = logging.getLogger("cri_server")


class StartupError(RuntimeError):
    """husk-cri cannot start; the message says what to fix."""


def prepare_dirs(config: Config) -> None:
    for d, mode in ((config.paths.root, 0o711), (config.sandboxes_dir, 0o711), (config.containers_dir, 0o711),
                    (config.cni_cache_dir, 0o700), (config.paths.state, 0o711), (config.netns_dir, 0o711),
                    (os.path.dirname(config.socket_path), 0o711)):
        os.makedirs(d, mode=mode, exist_ok=True)


def clear_stale_socket(path: str) -> None:
    """Removes a socket left by a dead husk-cri; refuses when a live server still answers on it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise StartupError(f"{path} exists and is not a socket; refusing to replace it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)
            return
    raise StartupError(f"another server is listening on {path}")


def start_spawner(config: Config) -> Any:
    """Phase 2 starts the single-threaded shim spawner (shim/spawner.py) here, before any gRPC thread
    exists. Until the shim lands nothing is forked, so there is nothing to start."""
    return None


def run(config: Config) -> int:
    logs.setup(config.server.log_level, config.server.log_format)
    prepare_dirs(config)
    policy = oom.detect(config.runtime.restrict_oom_score_adj)
    if policy.minimum > oom.OOM_SCORE_ADJ_MIN:
        log.warning("oom_score_adj is restricted", extra={"minimum": policy.minimum, "reason": policy.reason})
    spawner = start_spawner(config)
    import asyncio
    return asyncio.run(serve(config, policy, spawner))


async def serve(config: Config, policy: oom.OomScorePolicy, spawner: Any = None,
                ready: "asyncio.Event | None" = None) -> int:
    import asyncio
    import signal

    import grpc

    from cri_server.api.v1 import api_pb2_grpc
    from cri_server.context import RuntimeSettings, Services
    from cri_server.network.cni import CniManager
    from cri_server.service import ImageServicer, RuntimeServicer
    from cri_server.store.store import Store

    store = Store(config.db_path)
    services = Services(
        config=config, store=store, oom=policy,
        cni=CniManager(config.cni.conf_dir, config.cni.bin_dirs, config.cni_cache_dir, config.cni.plugin_timeout),
        settings=RuntimeSettings(pod_cidr=store.get_meta("pod_cidr")))
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 16 << 20),
                                      ("grpc.max_send_message_length", 16 << 20)])
    api_pb2_grpc.add_RuntimeServiceServicer_to_server(RuntimeServicer(services), server)
    api_pb2_grpc.add_ImageServiceServicer_to_server(ImageServicer(services), server)

    path = config.socket_path
    clear_stale_socket(path)
    old_umask = os.umask(0o177)  # the socket is never wider than 0600 before the chmod below
    try:
        server.add_insecure_port(f"unix://{path}")
    finally:
        os.umask(old_umask)
    await server.start()
    os.chmod(path, int(config.server.socket_mode, 8))
    if config.server.socket_group:
        import grp
        g = config.server.socket_group
        os.chown(path, -1, int(g) if g.isdigit() else grp.getgrnam(g).gr_gid)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    net = services.cni.status()
    log.info("husk-cri serving", extra={"endpoint": f"unix://{path}", "pid": os.getpid(),
                                        "network_ready": net.ready, "network": net.message or net.config_file})
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        log.info("husk-cri stopping; pods and containers keep running")
        await server.stop(config.server.shutdown_grace)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        store.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return 0
