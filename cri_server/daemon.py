"""husk-cri's start-up and shutdown: directories, policies, the spawner, the gRPC server, signals.

Order matters: the shim spawner (which forks every shim) starts before grpc is imported, because a process
running gRPC threads must never fork. SIGTERM stops serving and leaves pods and containers running
(they belong to their shims). This module wires parts together; the RPC logic lives in cri_server/rpc.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import sys
import time
from typing import Any

from cri_server import logs, oom
from cri_server.config import Config

log = logging.getLogger("cri_server")

_SUN_PATH_MAX = 107   # a unix socket path's bytes (sun_path is 108 with its NUL)


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


def bound_name(path: str, pid: int) -> str:
    """Where husk-cri binds its CRI socket before renaming it to `path` (see serve())."""
    return os.path.join(os.path.dirname(path), f".{pid}.sock")


def clear_stale_bound(path: str) -> None:
    """Removes the temporary sockets (bound_name) that husk-cris killed between bind and rename left beside
    `path`; one that still answers is another husk-cri starting and stays."""
    d = os.path.dirname(path)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return
    for n in names:
        if n.startswith(".") and n.endswith(".sock") and n[1:-5].isdigit():
            try:
                clear_stale_socket(os.path.join(d, n))
            except StartupError:
                continue


def start_spawner(config: Config) -> Any:
    """The single-threaded shim spawner (a fresh, protected interpreter with shim/ and runtime/ imported, see
    shim/spawner.py), started before grpc is imported and before any thread exists: every shim is forked from
    it, never from this process."""
    from shim.spawner import SYSTEMD_MODULES, Spawner, SpawnError
    spawner = Spawner()
    try:
        spawner.start(preload=SYSTEMD_MODULES if config.runtime.systemd_cgroup else ())
    except SpawnError as e:
        log.warning("no shim spawner (%s); shims start as fresh processes", e)
        return None
    log.info("shim spawner started", extra={"pid": spawner.pid})
    return spawner


def protect_interpreter() -> str:
    """The CVE-2019-5736 guard, once for the whole daemon: re-executes husk-cri (same command line, pid and
    environment) from the protected interpreter of runtime/exeguard.py, so that the spawner, every shim forked
    from it and the in-process runtime they run start protected and skip the per-container re-exec. Does not
    return when it re-executes; returns "" once protected, or why it could not be (containers then pay one
    re-exec each, as a fresh shim does)."""
    from runtime import exeguard
    from runtime.errors import SetupError
    try:
        exeguard.reexec_self()
    except (SetupError, OSError) as e:
        return str(e)
    return ""


def set_process_name() -> None:
    """comm "husk-cri" (it was "python3", or the protected interpreter's name after the re-exec), so that
    `pgrep -x husk-cri` / `pkill -x husk-cri` find the daemon alone: its spawner is "husk-cri-spawne" and
    its shims "husk-shim" (runtime/linux/proctitle.py). The command line stays (it shows the flags). Before threads."""
    from runtime.linux import syscalls as sc
    try:
        sc.set_name("husk-cri")
    except OSError as e:
        log.debug("cannot set the process name: %s", e)


def run(config: Config) -> int:
    unprotected = protect_interpreter()
    set_process_name()
    from cri_server import sdnotify
    sdnotify.take_socket()                   # before the spawner: shims and runtimes must not inherit it
    logs.setup(config.server.log_level, config.server.log_format)
    if unprotected:
        log.warning("the interpreter is not protected; every container start re-executes it",
                    extra={"reason": unprotected})
    prepare_dirs(config)
    policy = oom.detect(config.runtime.restrict_oom_score_adj)
    if policy.minimum > oom.OOM_SCORE_ADJ_MIN:
        log.warning("oom_score_adj is restricted", extra={"minimum": policy.minimum, "reason": policy.reason})
    spawner = start_spawner(config)
    try:
        rc = run_loop(serve(config, policy, spawner))
    finally:
        if spawner is not None:
            spawner.stop()
    exit_now(rc)
    return rc  # not reached


def run_loop(main: Any) -> Any:
    """asyncio.run(main), less its wait for the default executor's threads: a worker still walking a container's
    upper directory for a stats RPC that the shutdown cancelled must not hold up the stop (the work is dropped
    with the process, which ends right after). Tasks left are cancelled and awaited, as asyncio.run does."""
    import asyncio
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            left = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in left:
                t.cancel()
            if left:
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()  # shuts the default executor down without waiting for its threads


def exit_now(rc: int) -> None:
    """End the process once serve() has closed everything that holds state (gRPC server, shims' connections,
    databases): flush the logs and stdio and _exit, skipping the interpreter's teardown (the join of executor
    threads, atexit hooks, freeing a gc-frozen heap module by module), which was most of a stop's time."""
    logging.shutdown()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(rc)


def default_runtime(config: Config) -> str:
    """The runtime of the default handler as the shim names it; in-process needs runtime.lifecycle."""
    from cri_server.context import in_process_available, shim_runtime
    runtime = shim_runtime(config.runtime.runtime)
    if runtime == "husk" and not in_process_available():
        log.warning("runtime.runtime is in-process, but this husk has no runtime.lifecycle: using runc")
        return "runc"
    return runtime


def start_metrics(config: Config, services: Any) -> Any:
    """The Prometheus endpoint (cri_server/prometheus.py) when `metrics.address` is set, else None: without it
    prometheus_client is never imported and no interceptor is in the RPC path."""
    if not config.metrics.address:
        return None
    import asyncio

    from cri_server import prometheus
    host, port = config.metrics.host_port()
    try:
        return prometheus.start(host, port, prometheus.snapshot_from_loop(asyncio.get_running_loop(), services))
    except OSError as e:
        raise StartupError(f"metrics.address: cannot serve on {config.metrics.address}: {e.strerror or e}") from None


async def serve(config: Config, policy: oom.OomScorePolicy, spawner: Any = None,
                ready: Any = None) -> int:
    import asyncio
    import signal

    import grpc

    from cri_server import recovery
    from cri_server.api.v1 import api_pb2_grpc
    from cri_server.config import ConfigError
    from cri_server.context import RuntimeSettings, Services
    from cri_server.images.service import ImageService
    from cri_server.network.cni import CniManager
    from cri_server.rpc.streaming import make_server, tls_context
    from cri_server.service import ImageServicer, RuntimeServicer
    from cri_server.shims import ShimManager
    from cri_server.spec.context import HostInfo
    from cri_server.store.store import Store
    from cri_server.tasks import TaskMonitor

    try:
        tls = tls_context(config.streaming)     # before anything else: a bad file changes nothing
    except ConfigError as e:
        raise StartupError(str(e)) from None
    store = Store(config.db_path)
    runtime = default_runtime(config)
    services = Services(
        config=config, store=store, oom=policy,
        cni=CniManager(config.cni.conf_dir, config.cni.bin_dirs, config.cni_cache_dir, config.cni.plugin_timeout),
        settings=RuntimeSettings(pod_cidr=store.get_meta("pod_cidr")),
        images=ImageService(config.paths.root, config.registry.config_dir, pull_worker=True),
        shims=ShimManager(config.paths.state, config.runtime.runtime_root, spawner,
                          debug=config.server.log_level.lower() == "debug", default_runtime=runtime,
                          systemd_cgroup=config.runtime.systemd_cgroup),
        host=HostInfo.detect(policy, config.runtime.systemd_cgroup,
                             config.runtime.tolerate_missing_hugetlb_controller), default_runtime=runtime)
    from cri_server.rpc import events as rpc_events
    from cri_server.rpc.container_lifecycle import remove_locked
    from cri_server.rpc.sandbox_stop import remove_sandbox_locked
    services.tasks = TaskMonitor(services, on_stopped=lambda object_id: rpc_events.publish_stopped(services, object_id))
    await recovery.recover(services, remove_locked=remove_locked, remove_sandbox_locked=remove_sandbox_locked)
    services.streaming = make_server(services, tls)
    if services.streaming is not None:
        await services.streaming.start()
    metrics = start_metrics(config, services)
    server = grpc.aio.server(interceptors=[metrics.interceptor] if metrics is not None else None,
                             options=[("grpc.max_receive_message_length", 16 << 20),
                                      ("grpc.max_send_message_length", 16 << 20)])
    api_pb2_grpc.add_RuntimeServiceServicer_to_server(RuntimeServicer(services), server)
    api_pb2_grpc.add_ImageServiceServicer_to_server(ImageServicer(services), server)

    path = config.socket_path
    clear_stale_socket(path)
    # Bound under a name of its own and renamed into place once it listens with its mode and group: a client
    # that waits for the path to appear (a script, a path unit, kubelet's first dial) never finds it refusing
    # connections or still 0600. gRPC binds in add_insecure_port but listens only in start().
    bound = bound_name(path, os.getpid())
    if len(bound.encode()) > _SUN_PATH_MAX:
        bound = path                  # the longer name would not fit sun_path: bind in place, as before
    clear_stale_bound(path)           # a killed husk-cri's (ours too, if it had our pid)
    old_umask = os.umask(0o177)  # the socket is never wider than 0600 before the chmod below
    try:
        server.add_insecure_port(f"unix://{bound}")
    finally:
        os.umask(old_umask)
    try:
        await server.start()
        os.chmod(bound, int(config.server.socket_mode, 8))
        if config.server.socket_group:
            import grp
            g = config.server.socket_group
            os.chown(bound, -1, int(g) if g.isdigit() else grp.getgrnam(g).gr_gid)
        if bound != path:
            os.rename(bound, path)
    except BaseException:
        if bound != path:             # e.g. an unknown socket_group: no socket left under the temporary name
            with contextlib.suppress(FileNotFoundError):
                os.unlink(bound)
        raise

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    net = services.cni.status()
    log.info("husk-cri serving", extra={"endpoint": f"unix://{path}", "pid": os.getpid(),
                                        "runtime": services.default_runtime,
                                        "streaming": services.streaming.base_url if services.streaming else "",
                                        "network_ready": net.ready, "network": net.message or net.config_file})
    # The one line on stdout: where kubelet and crictl connect (the logs go to stderr).
    print(f"husk-cri: serving CRI v1 on unix://{path}"
          + (f", streaming on {services.streaming.base_url}" if services.streaming else ""), flush=True)
    # What start-up made (modules, grpc, the index) lives as long as the daemon: out of the collector's reach,
    # a full collection scans only what came later instead of stalling the loop for tens of ms under the
    # garbage of the stats RPCs (kubelet's relist latency; scripts/bench/relist).
    import gc
    gc.collect()
    gc.freeze()
    if ready is not None:
        ready.set()
    from cri_server import sdnotify
    sdnotify.notify(sdnotify.READY)          # a Type=notify unit (contrib/systemd) is started from here on
    try:
        await stop.wait()
    finally:
        log.info("husk-cri stopping; pods and containers keep running")
        sdnotify.notify(sdnotify.STOPPING)
        services.events.close()
        t_stop = time.monotonic()
        # Returns as soon as no RPC is in flight (at once when none is); the grace bounds only RPCs still running.
        await server.stop(config.server.shutdown_grace)
        phases = {"grpc": time.monotonic() - t_stop}
        if metrics is not None:
            await metrics.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        t = time.monotonic()
        await services.tasks.close()
        if services.streaming is not None:
            await services.streaming.stop()
        # the exec cleanups of the sessions and ExecSync calls just cancelled, before the shim connections go
        # (the module is loaded already: the streaming backend imports it at start-up)
        from cri_server.streaming import shimexec
        await shimexec.drain_closes(shimexec.KILL_WAIT)
        await services.shims.close()
        phases["shims"] = time.monotonic() - t
        t = time.monotonic()
        await services.images.close()
        store.close()
        phases["databases"] = time.monotonic() - t
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        log.info("husk-cri stopped", extra={"ms": round((time.monotonic() - t_stop) * 1e3, 1),
                                            **{f"{k}_ms": round(v * 1e3, 1) for k, v in phases.items()}})
    return 0
