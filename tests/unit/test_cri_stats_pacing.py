"""The stats sweeps share the event loop with the List RPCs (rpc/stats.py's Pacer and sweep): a ListPodSandbox
that arrives during a ListPodSandboxStats of many pods is answered before the sweep ends, the sweep keeps its
order and its bound on objects in flight. No timing: a slice of 0 s makes every piece of work a slice."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from cri_server.api.v1 import api_pb2 as pb
from cri_server.config import Config
from cri_server.context import Services
from cri_server.network.cni import CniManager
from cri_server.oom import OomScorePolicy
from cri_server.rpc import metrics, sandbox_status, stats
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState
from cri_server.store.store import Store
from shim.pb import cgroups_v1 as cg

PODS = 40


class Shims:
    """Every object's shim answers Stats at once (a reading is a few counters)."""

    def __init__(self) -> None:
        self.in_flight = self.most_in_flight = 0

    async def call(self, object_id, address, method, timeout=None, **kw):
        assert method == "Stats"
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0)          # the answer comes in a later loop iteration, as a socket's would
        self.in_flight -= 1
        m = cg.Metrics(cpu=cg.CPUStat(usage=cg.CPUUsage(total=10**9)),
                       memory=cg.MemoryStat(usage=cg.MemoryEntry(usage=4096, limit=1 << 63)))
        return SimpleNamespace(stats=SimpleNamespace(value=m.encode(), type_url=cg.Metrics.FULL_NAME))


@pytest.fixture
def svc(tmp_path, monkeypatch):
    monkeypatch.setattr(stats, "_SLICE_S", 0.0)
    store = Store(str(tmp_path / "meta.db"))
    s = Services(config=Config(), store=store, cni=CniManager(str(tmp_path), [], str(tmp_path)),
                 oom=OomScorePolicy(-1000))
    now = time.time_ns()
    for i in range(PODS):
        store.put_sandbox(SandboxRecord(id=f"sb{i}", name=f"n{i}", pod_name=f"p{i}", pod_uid=f"u{i}",
                                        pod_namespace="ns", attempt=0, state=SandboxState.READY, created_at=now,
                                        shim_address=f"unix:///s/sb{i}"))
        store.put_container(ContainerRecord(id=f"c{i}", sandbox_id=f"sb{i}", name=f"c{i}", container_name="c",
                                            attempt=0, state=ContainerState.RUNNING, created_at=now,
                                            shim_address=f"unix:///s/c{i}"))
    s.shims = Shims()
    yield s
    store.close()


async def _race(sweep_coro, svc) -> list[str]:
    """The sweep and a ListPodSandbox that gets to its handler a few loop iterations later (as a gRPC request
    does): the order they finish in."""
    done: list[str] = []

    async def sweep_call():
        await sweep_coro
        done.append("sweep")

    async def list_call():
        for _ in range(10):
            await asyncio.sleep(0)
        resp = await sandbox_status.list_pod_sandbox(svc, pb.ListPodSandboxRequest())
        assert len(resp.items) == PODS
        done.append("list")

    await asyncio.gather(sweep_call(), list_call())
    return done


def test_a_list_during_a_pod_stats_sweep_does_not_wait_for_it(svc):
    order = asyncio.run(_race(stats.list_pod_sandbox_stats(svc, pb.ListPodSandboxStatsRequest()), svc))
    assert order == ["list", "sweep"]


def test_a_list_during_a_container_stats_sweep_of_fresh_readings_does_not_wait_for_it(svc):
    async def go():
        await stats.list_container_stats(svc, pb.ListContainerStatsRequest())    # readings now fresh
        return await _race(stats.list_container_stats(svc, pb.ListContainerStatsRequest()), svc)
    assert asyncio.run(go()) == ["list", "sweep"]


def test_a_list_during_a_metrics_sweep_does_not_wait_for_it(svc):
    order = asyncio.run(_race(metrics.list_pod_sandbox_metrics(svc, pb.ListPodSandboxMetricsRequest()), svc))
    assert order == ["list", "sweep"]


def test_a_sweep_answers_in_order_with_a_bounded_number_in_flight(svc):
    resp = asyncio.run(stats.list_pod_sandbox_stats(svc, pb.ListPodSandboxStatsRequest()))
    assert [s.attributes.id for s in resp.stats] == [f"sb{i}" for i in range(PODS)]
    assert all(len(s.linux.containers) == 1 and s.linux.memory.usage_bytes.value == 8192 for s in resp.stats)
    # Each pod in flight has its pause and its container's shim asked; the stats RPCs sample one pod at a time
    # (with 8 in flight their continuations ran back to back in one loop iteration, past the Pacer's slice)
    assert svc.shims.most_in_flight <= 2 * stats._STATS_SWEEP_CONCURRENCY == 2


def test_pacer_yields_only_past_its_slice():
    async def go(slice_s):
        p = stats.Pacer(slice_s)
        for _ in range(20):
            await p.pause()
        return p.yields
    assert asyncio.run(go(3600.0)) == 0
    assert asyncio.run(go(0.0)) == 19
