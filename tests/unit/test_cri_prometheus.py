"""cri_server/prometheus.py without a daemon: the collector's series from a fake store, the interceptor's codes
and timings, the pull/CNI/trace hooks, the endpoint itself, and the `[metrics] address` key."""
from __future__ import annotations

import asyncio
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cri_server import config as cfg
from cri_server import prometheus as prom
from cri_server import trace
from cri_server.errors import NotFound
from cri_server.images import pull
from cri_server.network import cni
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState


def samples(registry: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """name + sorted labels -> value, from the text the endpoint would serve."""
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def sandbox(sid: str, state: SandboxState, shim_pid: int = 0) -> SandboxRecord:
    return SandboxRecord(id=sid, name=sid, pod_name=sid, pod_uid=sid, pod_namespace="ns", attempt=0, state=state,
                         created_at=0, shim_address="/s" if shim_pid else "",
                         extra={"shim_pid": shim_pid} if shim_pid else {})


def container(cid: str, state: ContainerState, shim_pid: int = 0) -> ContainerRecord:
    return ContainerRecord(id=cid, sandbox_id="p", name=cid, container_name=cid, attempt=0, state=state,
                           created_at=0, shim_address="/s" if shim_pid else "",
                           extra={"shim_pid": shim_pid} if shim_pid else {})


@dataclass
class FakeStore:
    sandboxes: list[SandboxRecord] = field(default_factory=list)
    containers: list[ContainerRecord] = field(default_factory=list)

    def list_sandboxes(self) -> list[SandboxRecord]:
        return self.sandboxes

    def list_containers(self) -> list[ContainerRecord]:
        return self.containers


@dataclass
class FakeServices:
    store: FakeStore
    shims: Any = None


@dataclass
class FakeSpawner:
    pid: int


@dataclass
class FakeShims:
    spawner: Any


def test_collector_counts_by_state_and_sums_shim_pss() -> None:
    store = FakeStore(
        [sandbox("a", SandboxState.READY, shim_pid=101), sandbox("b", SandboxState.READY, shim_pid=102),
         sandbox("c", SandboxState.NOTREADY)],
        [container("x", ContainerState.RUNNING, shim_pid=201), container("y", ContainerState.EXITED),
         container("z", ContainerState.CREATED, shim_pid=999)])
    snap = prom.take_snapshot(FakeServices(store, FakeShims(FakeSpawner(7))))
    assert sorted(snap.shim_pids) == [101, 102, 201, 999] and snap.spawner_pid == 7
    pss = {101: 3 << 20, 102: 4 << 20, 201: 5 << 20, 7: 30 << 20}      # 999 is gone
    m = prom.Metrics()
    m.registry.register(prom.StateCollector(lambda: snap, pss=pss.get))
    got = samples(m.registry)
    assert got[("husk_cri_pods", (("state", "ready"),))] == 2
    assert got[("husk_cri_pods", (("state", "notready"),))] == 1
    assert got[("husk_cri_pods", (("state", "creating"),))] == 0
    assert got[("husk_cri_containers", (("state", "running"),))] == 1
    assert got[("husk_cri_containers", (("state", "exited"),))] == 1
    assert got[("husk_cri_containers", (("state", "created"),))] == 1
    assert got[("husk_cri_containers", (("state", "unknown"),))] == 0
    assert got[("husk_cri_shims", ())] == 3
    assert got[("husk_cri_shims_pss_bytes", ())] == 12 << 20
    assert got[("husk_cri_spawner_pss_bytes", ())] == 30 << 20
    assert ("process_resident_memory_bytes", ()) in got


def test_collector_leaves_its_series_out_when_the_loop_does_not_answer() -> None:
    m = prom.Metrics()
    m.registry.register(prom.StateCollector(lambda: None))
    names = {name for name, _ in samples(m.registry)}
    assert not {n for n in names if n.startswith(("husk_cri_pods", "husk_cri_shims"))}


def test_snapshot_from_loop_runs_on_the_loop() -> None:
    store = FakeStore([sandbox("a", SandboxState.READY, shim_pid=5)], [])

    async def main() -> prom.Snapshot | None:
        get = prom.snapshot_from_loop(asyncio.get_running_loop(), FakeServices(store))
        return await asyncio.to_thread(get)
    snap = asyncio.run(main())
    assert snap is not None and snap.pods == {"ready": 1} and snap.shim_pids == (5,)


def test_pss_of_this_process_and_of_a_missing_one() -> None:
    import os
    assert (prom.pss_bytes(os.getpid()) or 0) > 0
    assert prom.pss_bytes(2 ** 22 + 1) is None


class FakeContext:
    """What the handlers use of grpc.aio.ServicerContext: abort() sets the code and raises."""

    def __init__(self) -> None:
        self._code: Any = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self._code = code
        raise grpc.aio.AbortError(details)

    def code(self) -> Any:
        return self._code


def run_unary(interceptor: prom.RpcInterceptor, name: str, behavior: Any) -> Any:
    handler = grpc.unary_unary_rpc_method_handler(behavior)
    wrapped = interceptor.wrap(name, handler)
    assert wrapped.unary_unary is not behavior

    async def call() -> Any:
        return await wrapped.unary_unary(object(), FakeContext())
    return asyncio.run(call())


def test_interceptor_times_rpcs_and_counts_errors_by_code() -> None:
    from cri_server.service import _bind
    m = prom.Metrics()
    icpt = prom.RpcInterceptor(m)

    async def ok(_svc: Any, _req: Any) -> str:
        return "fine"

    async def missing(_svc: Any, _req: Any) -> str:
        raise NotFound("container x: not found")

    async def broken(_svc: Any, _req: Any) -> str:
        raise ValueError("bug")

    servicer = type("S", (), {"services": None})()
    for name, fn in (("Version", ok), ("ContainerStatus", missing), ("StartContainer", broken)):
        bound = _bind(name, fn)

        async def behavior(req: Any, ctx: Any, bound: Any = bound) -> Any:
            return await bound(servicer, req, ctx)
        if fn is ok:
            assert run_unary(icpt, name, behavior) == "fine"
        else:
            with pytest.raises(grpc.aio.AbortError):
                run_unary(icpt, name, behavior)

    async def cancelled(_req: Any, _ctx: Any) -> None:
        raise asyncio.CancelledError()

    async def plain_exception(_req: Any, _ctx: Any) -> None:
        raise RuntimeError("escaped the servicer")
    with pytest.raises(asyncio.CancelledError):
        run_unary(icpt, "ExecSync", cancelled)
    with pytest.raises(RuntimeError):
        run_unary(icpt, "Status", plain_exception)
    got = samples(m.registry)
    assert got[("husk_cri_rpc_errors_total", (("code", "NOT_FOUND"), ("method", "ContainerStatus")))] == 1
    assert got[("husk_cri_rpc_errors_total", (("code", "INTERNAL"), ("method", "StartContainer")))] == 1
    assert got[("husk_cri_rpc_errors_total", (("code", "CANCELLED"), ("method", "ExecSync")))] == 1
    assert got[("husk_cri_rpc_errors_total", (("code", "UNKNOWN"), ("method", "Status")))] == 1
    assert not [k for k in got if k[0] == "husk_cri_rpc_errors_total" and ("method", "Version") in k[1]]
    for method in ("Version", "ContainerStatus", "StartContainer", "ExecSync", "Status"):
        assert got[("husk_cri_rpc_duration_seconds_count", (("method", method),))] == 1


def test_interceptor_counts_stream_errors_and_wraps_each_method_once() -> None:
    m = prom.Metrics()
    icpt = prom.RpcInterceptor(m)

    async def events(_req: Any, ctx: Any) -> Any:
        yield 1
        await ctx.abort(grpc.StatusCode.UNAVAILABLE, "closing")
    handler = grpc.unary_stream_rpc_method_handler(events)

    @dataclass
    class Details:
        method: str
    calls = []

    async def continuation(d: Any) -> Any:
        calls.append(d.method)
        return handler if d.method.endswith("GetContainerEvents") else None

    async def main() -> list[Any]:
        name = "/runtime.v1.RuntimeService/GetContainerEvents"
        first = await icpt.intercept_service(continuation, Details(name))
        assert await icpt.intercept_service(continuation, Details(name)) is first
        assert await icpt.intercept_service(continuation, Details("/x/Unknown")) is None
        got = []
        with pytest.raises(grpc.aio.AbortError):
            async for item in first.unary_stream(object(), FakeContext()):
                got.append(item)
        return got
    assert asyncio.run(main()) == [1]
    got = samples(m.registry)
    assert got[("husk_cri_rpc_errors_total", (("code", "UNAVAILABLE"), ("method", "GetContainerEvents")))] == 1
    assert not [k for k in got if k[0].startswith("husk_cri_rpc_duration") and ("method", "GetContainerEvents")
                in k[1]]


def test_status_code_prefers_what_abort_set() -> None:
    ctx = FakeContext()
    ctx._code = grpc.StatusCode.ALREADY_EXISTS
    assert prom.status_code(ctx, grpc.aio.AbortError("x")) == "ALREADY_EXISTS"
    assert prom.status_code(FakeContext(), None) == "OK"
    assert prom.status_code(object(), ValueError()) == "UNKNOWN"


def test_hooks_feed_pulls_cni_and_startup_steps_and_go_away() -> None:
    m = prom.Metrics()
    prom.hook(m)
    try:
        async def main() -> None:
            async def fine() -> int:
                assert pull.on_pull is not None and pull.on_fetched is not None
                pull.on_pull(asyncio.current_task(), 0.0)  # type: ignore[arg-type]
                pull.on_fetched(1000)
                pull.on_fetched(24)
                return 1

            async def fails() -> int:
                assert pull.on_pull is not None
                pull.on_pull(asyncio.current_task(), 0.0)  # type: ignore[arg-type]
                raise OSError("registry down")

            async def hangs() -> int:
                assert pull.on_pull is not None
                pull.on_pull(asyncio.current_task(), 0.0)  # type: ignore[arg-type]
                await asyncio.sleep(3600)
                return 0
            await asyncio.create_task(fine())
            with pytest.raises(OSError):
                await asyncio.create_task(fails())
            t = asyncio.create_task(hangs())
            await asyncio.sleep(0)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
        asyncio.run(main())
        assert cni.observer is not None
        cni.observer("ADD", "bridge", 0.02, False)
        cni.observer("DEL", "portmap", 0.5, True)
        tr = trace.Trace("sandbox", "id1")
        with tr.step("cni.add"):
            pass
        with pytest.raises(KeyError), tr.step("shim.spawn"):
            raise KeyError("x")
    finally:
        prom.unhook(m)
    assert pull.on_pull is None and pull.on_fetched is None and cni.observer is None
    got = samples(m.registry)
    for result in ("success", "failure", "canceled"):
        assert got[("husk_cri_image_pulls_total", (("result", result),))] == 1
    assert got[("husk_cri_image_pull_bytes_total", ())] == 1024
    assert got[("husk_cri_image_pull_duration_seconds_count", ())] == 3
    assert got[("husk_cri_cni_plugin_duration_seconds_count", (("op", "ADD"), ("plugin", "bridge")))] == 1
    assert got[("husk_cri_cni_plugin_errors_total", (("op", "DEL"), ("plugin", "portmap")))] == 1
    assert ("husk_cri_cni_plugin_errors_total", (("op", "ADD"), ("plugin", "bridge"))) not in got
    assert got[("husk_cri_startup_step_duration_seconds_count", (("kind", "sandbox"), ("step", "cni.add")))] == 1
    assert got[("husk_cri_startup_step_failures_total", (("kind", "sandbox"), ("step", "shim.spawn")))] == 1
    tr2 = trace.Trace("sandbox", "id2")
    with tr2.step("cni.add"):
        pass
    assert samples(m.registry)[("husk_cri_startup_step_duration_seconds_count",
                                (("kind", "sandbox"), ("step", "cni.add")))] == 1     # unhooked: not counted


def test_endpoint_serves_the_text_format_and_stops() -> None:
    store = FakeStore([sandbox("a", SandboxState.READY)], [])
    server = prom.start("127.0.0.1", 0, lambda: prom.take_snapshot(FakeServices(store)))
    try:
        host, port = server.address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = resp.read().decode()
    finally:
        asyncio.run(server.close())
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert [s.value for s in fams["husk_cri_pods"].samples if s.labels == {"state": "ready"}] == [1]
    assert not server._thread.is_alive()
    assert pull.on_pull is None
    import socket
    with socket.socket() as s, pytest.raises(OSError):
        s.settimeout(2)
        s.connect((host, port))


@pytest.mark.parametrize("address, expected", [("127.0.0.1:9101", ("127.0.0.1", 9101)), (":9101", ("0.0.0.0", 9101)),
                                               ("[::1]:9101", ("::1", 9101)), ("localhost:0", ("localhost", 0))])
def test_metrics_address_forms(address: str, expected: tuple[str, int]) -> None:
    assert cfg.MetricsConfig(address).host_port() == expected


@pytest.mark.parametrize("address", ["9101", "127.0.0.1:", "::1:9101", "host:70000", "host:x"])
def test_metrics_address_errors_name_the_key(address: str) -> None:
    with pytest.raises(cfg.ConfigError, match=r"^x\.toml: metrics\.address: "):
        cfg.from_mapping({"metrics": {"address": address}}, "x.toml")
    with pytest.raises(cfg.ConfigError, match=r"metrics\.address"):
        cfg.with_overrides(cfg.Config(), {"metrics_address": address})


def test_metrics_are_off_by_default() -> None:
    from cri_server.daemon import start_metrics
    assert cfg.Config().metrics.address == ""
    assert start_metrics(cfg.Config(), None) is None
