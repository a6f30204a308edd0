"""husk-cri's Prometheus metrics: http://<[metrics] address>/metrics in the text exposition format.

Owns the metric definitions, the gRPC interceptor that times every RPC, the collector that counts pods, containers
and shims when scraped, and the hooks it sets in images/pull.py, network/cni.py and trace.py. Imported only when
metrics are on, so prometheus_client is never loaded otherwise and those hooks stay None. The HTTP server runs on
its own threads; the store is read on the event loop only (the collector asks the loop for a snapshot).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import grpc
import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cri_server.store.records import ContainerState, SandboxState

log = logging.getLogger(__name__)

# RPCs go from 0.1 ms (a list from memory) to minutes (a pull, a stop with a long grace period).
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
               120.0)
PULL_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
CNI_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SNAPSHOT_TIMEOUT = 5.0      # seconds a scrape waits for the event loop's answer


class Metrics:
    """The metric objects of one husk-cri, in a registry of their own (the process and Python ones included)."""

    def __init__(self) -> None:
        prometheus_client.disable_created_metrics()   # no *_created series: half the lines, nothing lost
        r = self.registry = CollectorRegistry(auto_describe=False)
        prometheus_client.ProcessCollector(registry=r)
        prometheus_client.PlatformCollector(registry=r)
        self.rpc_seconds = Histogram("husk_cri_rpc_duration_seconds", "Time to answer a unary CRI RPC, by method",
                                     ["method"], buckets=RPC_BUCKETS, registry=r)
        self.rpc_errors = Counter("husk_cri_rpc_errors", "CRI RPCs that ended with a status other than OK, by "
                                  "method and gRPC code", ["method", "code"], registry=r)
        self.image_pulls = Counter("husk_cri_image_pulls", "Image pulls that did the work (concurrent pulls of "
                                   "one reference count once), by result", ["result"], registry=r)
        self.image_pull_bytes = Counter("husk_cri_image_pull_bytes", "Bytes of image layers downloaded from "
                                        "registries", registry=r)
        self.image_pull_seconds = Histogram("husk_cri_image_pull_duration_seconds", "Time an image pull took, "
                                            "failed ones included", buckets=PULL_BUCKETS, registry=r)
        self.cni_seconds = Histogram("husk_cri_cni_plugin_duration_seconds", "Time of one CNI plugin call, by "
                                     "command (ADD, DEL, CHECK) and plugin type", ["op", "plugin"],
                                     buckets=CNI_BUCKETS, registry=r)
        self.cni_errors = Counter("husk_cri_cni_plugin_errors", "CNI plugin calls that failed or timed out",
                                  ["op", "plugin"], registry=r)
        self.step_seconds = Histogram("husk_cri_startup_step_duration_seconds", "Time of one step of a sandbox's "
                                      "or container's start-up (cri_server/trace.py), failed ones included",
                                      ["kind", "step"], buckets=STEP_BUCKETS, registry=r)
        self.step_failures = Counter("husk_cri_startup_step_failures", "Start-up steps that failed",
                                     ["kind", "step"], registry=r)

    # --- the hooks' targets -----------------------------------------------------------------
    def pull_started(self, task: "asyncio.Task[Any]", started: float) -> None:
        task.add_done_callback(lambda t: self._pull_done(t, started))

    def _pull_done(self, task: "asyncio.Task[Any]", started: float) -> None:
        self.image_pull_seconds.observe(time.monotonic() - started)
        if task.cancelled():
            result = "canceled"
        else:
            result = "failure" if task.exception() is not None else "success"
        self.image_pulls.labels(result).inc()

    def cni_call(self, op: str, plugin: str, seconds: float, failed: bool) -> None:
        self.cni_seconds.labels(op, plugin).observe(seconds)
        if failed:
            self.cni_errors.labels(op, plugin).inc()

    def startup_step(self, kind: str, step: str, seconds: float, failed: bool) -> None:
        self.step_seconds.labels(kind, step).observe(seconds)
        if failed:
            self.step_failures.labels(kind, step).inc()


# --- per-RPC: a server interceptor --------------------------------------------------------------
def status_code(context: Any, exc: BaseException | None) -> str:
    """The gRPC code the client gets: what context.abort() set (every CriError goes through it, service.py),
    CANCELLED for a cancelled handler, UNKNOWN for any other exception grpc sends on, else the code set."""
    code = None
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 -- a context without a code: decide from the exception
        pass
    if code is not None and code != grpc.StatusCode.OK:
        return code.name if isinstance(code, grpc.StatusCode) else str(code)
    if exc is None:
        return "OK"
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELLED"
    return "UNKNOWN"


class RpcInterceptor(grpc.aio.ServerInterceptor):
    """Times unary RPCs (`husk_cri_rpc_duration_seconds`) and counts non-OK endings of every RPC
    (`husk_cri_rpc_errors_total`). Each method's handler is wrapped once and then reused."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        hit = self._wrapped.get(details.method)
        if hit is not None and hit[0] is handler:
            return hit[1]
        wrapped = self.wrap(details.method.rpartition("/")[2], handler)
        self._wrapped[details.method] = (handler, wrapped)
        return wrapped

    def wrap(self, method: str, handler: Any) -> Any:
        """`handler` with its behaviour measured; synchronous behaviours (grpc runs them in a thread) are left."""
        if inspect.iscoroutinefunction(handler.unary_unary):
            return handler._replace(unary_unary=self._unary(method, handler.unary_unary))
        if inspect.isasyncgenfunction(handler.unary_stream):
            return handler._replace(unary_stream=self._stream(method, handler.unary_stream))
        return handler

    def _unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        seconds = self.metrics.rpc_seconds.labels(method)
        errors = self.metrics.rpc_errors

        async def unary(request: Any, context: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await behavior(request, context)
            except BaseException as e:
                errors.labels(method, status_code(context, e)).inc()
                raise
            finally:
                seconds.observe(time.perf_counter() - t0)
        return unary

    def _stream(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        # A stream lasts as long as its client wants (GetContainerEvents: the kubelet's life): no duration.
        errors = self.metrics.rpc_errors

        async def stream(request: Any, context: Any) -> Any:
            try:
                async for item in behavior(request, context):
                    yield item
            except GeneratorExit:
                raise
            except BaseException as e:
                errors.labels(method, status_code(context, e)).inc()
                raise
        return stream


# --- pods, containers and shims: read when scraped ------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    """What the collector needs from the store, taken on the event loop in one go."""
    pods: dict[str, int] = field(default_factory=dict)          # SandboxState value -> count
    containers: dict[str, int] = field(default_factory=dict)    # ContainerState value -> count
    shim_pids: tuple[int, ...] = ()
    spawner_pid: int = 0


def take_snapshot(services: Any) -> Snapshot:
    """Counts by state and the pids of live shims (a record's shim_pid is dropped when its task exits)."""
    pods: dict[str, int] = {}
    containers: dict[str, int] = {}
    pids = []
    for s in services.store.list_sandboxes():
        pods[s.state.value] = pods.get(s.state.value, 0) + 1
        if s.shim_address and s.extra.get("shim_pid"):
            pids.append(int(s.extra["shim_pid"]))
    for c in services.store.list_containers():
        containers[c.state.value] = containers.get(c.state.value, 0) + 1
        if c.shim_address and c.extra.get("shim_pid"):
            pids.append(int(c.extra["shim_pid"]))
    spawner = getattr(services.shims, "spawner", None) if services.shims is not None else None
    # A pod's sandbox and containers share one shim: each process once.
    return Snapshot(pods, containers, tuple(dict.fromkeys(pids)), int(getattr(spawner, "pid", 0) or 0))


def snapshot_from_loop(loop: asyncio.AbstractEventLoop, services: Any) -> Callable[[], Snapshot | None]:
    """A snapshot function for the scrape threads: runs take_snapshot on `loop`, None when it does not answer."""
    async def take() -> Snapshot:
        return take_snapshot(services)

    def get() -> Snapshot | None:
        try:
            fut = asyncio.run_coroutine_threadsafe(take(), loop)
        except RuntimeError as e:            # the loop is closed: husk-cri is stopping
            log.debug("metrics snapshot: %s", e)
            return None
        try:
            return fut.result(SNAPSHOT_TIMEOUT)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            log.warning("metrics: the event loop did not answer within %gs; pod, container and shim series left "
                        "out of this scrape", SNAPSHOT_TIMEOUT)
            return None
    return get


def pss_bytes(pid: int) -> int | None:
    """The process's proportional set size from /proc/<pid>/smaps_rollup; None when it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


class StateCollector(Collector):
    """husk_cri_pods{state}, husk_cri_containers{state}, husk_cri_shims, husk_cri_shims_pss_bytes and
    husk_cri_spawner_pss_bytes, computed at scrape time: nothing is counted per RPC."""

    def __init__(self, snapshot: Callable[[], Snapshot | None],
                 pss: Callable[[int], int | None] = pss_bytes) -> None:
        self._snapshot = snapshot
        self._pss = pss

    def collect(self) -> Iterator[Any]:
        snap = self._snapshot()
        if snap is None:
            return
        pods = GaugeMetricFamily("husk_cri_pods", "Pod sandboxes by state", labels=["state"])
        for ss in SandboxState:
            pods.add_metric([ss.value], snap.pods.get(ss.value, 0))
        yield pods
        containers = GaugeMetricFamily("husk_cri_containers", "Containers by state", labels=["state"])
        for cs in ContainerState:
            containers.add_metric([cs.value], snap.containers.get(cs.value, 0))
        yield containers
        sizes = [p for p in map(self._pss, snap.shim_pids) if p is not None]
        yield GaugeMetricFamily("husk_cri_shims", "Running shims (one per pod: its sandbox and containers)",
                                value=len(sizes))
        yield GaugeMetricFamily("husk_cri_shims_pss_bytes", "Proportional set size of all shims together "
                                "(/proc/<pid>/smaps_rollup)", value=sum(sizes))
        if snap.spawner_pid:
            spawner = self._pss(snap.spawner_pid)
            if spawner is not None:
                yield GaugeMetricFamily("husk_cri_spawner_pss_bytes", "Proportional set size of the shim spawner "
                                        "(the zygote every shim is forked from)", value=spawner)


# --- the server -----------------------------------------------------------------------------------
class MetricsServer:
    """The metrics of a running husk-cri: its registry, interceptor and HTTP server; close() undoes start()."""

    def __init__(self, metrics: Metrics, httpd: Any, thread: Any) -> None:
        self.metrics = metrics
        self.interceptor = RpcInterceptor(metrics)
        self._httpd = httpd
        self._thread = thread

    @property
    def address(self) -> tuple[str, int]:
        return self._httpd.server_address[:2]

    async def close(self) -> None:
        """Removes the hooks and stops serving (a few ms; off the loop, as it joins threads)."""
        unhook(self.metrics)
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        # httpd.shutdown() returns once serve_forever() sees the request, which its select() notices only every
        # 0.5 s unless a connection wakes it up: connect until it has stopped.
        stopper = threading.Thread(target=self._httpd.shutdown, name="husk-cri-metrics-stop")
        stopper.start()
        host, port = self.address
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        while stopper.is_alive():
            try:
                socket.create_connection((host, port), timeout=0.2).close()
            except OSError:
                pass
            stopper.join(0.02)
        self._httpd.server_close()
        self._thread.join(5)


def hook(m: Metrics) -> None:
    from cri_server import trace
    from cri_server.images import pull
    from cri_server.network import cni
    pull.on_pull = m.pull_started
    pull.on_fetched = m.image_pull_bytes.inc
    cni.observer = m.cni_call
    trace.add_observer(m.startup_step)


def unhook(m: Metrics) -> None:
    from cri_server import trace
    from cri_server.images import pull
    from cri_server.network import cni
    pull.on_pull = None
    pull.on_fetched = None
    cni.observer = None
    trace.remove_observer(m.startup_step)


def start(host: str, port: int, snapshot: Callable[[], Snapshot | None]) -> MetricsServer:
    """Binds host:port (OSError when it cannot) and serves; the hooks are set once the port is ours."""
    m = Metrics()
    m.registry.register(StateCollector(snapshot))
    httpd, thread = prometheus_client.start_http_server(port, host, registry=m.registry)
    thread.name = "husk-cri-metrics"
    hook(m)
    server = MetricsServer(m, httpd, thread)
    log.info("metrics serving", extra={"address": "%s:%d" % server.address})
    return server
