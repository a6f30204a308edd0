"""Unit tests of husk-cri's phase-2 helpers that need no root: signal names, the undo list, the event bus,
request validation, log paths, stats arithmetic, exit reasons, the nofile limit."""
from __future__ import annotations

import asyncio
import signal

import pytest

from runtime import signals
from cri_server.api.v1 import api_pb2 as pb
from cri_server.errors import InvalidArgument
from cri_server.events import EventBus
from cri_server.oom import OomScorePolicy
from cri_server.rpc import container_create, container_status, sandbox_run, stats
from cri_server.spec.context import nofile_limit
from cri_server.tasks import ExitInfo
from cri_server.undo import Undo
from tests.support.waiting import wait_for_async


@pytest.mark.parametrize("name,num", [("SIGTERM", 15), ("TERM", 15), ("15", 15), ("sigkill", 9),
                                      ("SIGRTMIN", signal.SIGRTMIN), ("SIGRTMINPLUS3", signal.SIGRTMIN + 3),
                                      ("SIGRTMIN+1", signal.SIGRTMIN + 1), ("RTMAX-2", signal.SIGRTMAX - 2),
                                      ("SIGCLD", signal.SIGCHLD)])
def test_signal_names(name, num):
    assert signals.parse(name) == num


@pytest.mark.parametrize("bad", ["", "SIGNOPE", "0", "999", "SIGRTMAXPLUS1"])
def test_bad_signal_names(bad):
    with pytest.raises(ValueError):
        signals.parse(bad)


def test_cri_signal_enum_names_all_parse():
    for name, value in pb.Signal.items():
        if value:
            assert signals.parse(name) > 0, name


@pytest.mark.parametrize("name,want", [("SIGUSR1", pb.SIGUSR1), ("SIGRTMIN+3", pb.SIGRTMINPLUS3),
                                       ("SIGRTMAX-1", pb.SIGRTMAXMINUS1), ("SIGIOT", pb.SIGIOT),
                                       ("USR2", pb.SIGUSR2), ("10", pb.SIGUSR1), ("SIGNOPE", pb.RUNTIME_DEFAULT)])
def test_cri_signal_of_image_stop_signals(name, want):
    assert container_status.cri_signal(name) == want


def test_reported_stop_signal_order():
    """The request's, else the image's, else the default; as containerd 2.x fills ContainerStatus.stop_signal."""
    asked = pb.ContainerConfig(stop_signal=pb.SIGQUIT)
    plain = pb.ContainerConfig()
    assert container_status.reported_stop_signal(asked, "SIGUSR1", "SIGTERM") == pb.SIGQUIT
    assert container_status.reported_stop_signal(plain, "SIGUSR1", "SIGTERM") == pb.SIGUSR1
    assert container_status.reported_stop_signal(plain, "", "SIGTERM") == pb.SIGTERM
    assert container_status.reported_stop_signal(plain, "SIGNOPE", "SIGINT") == pb.SIGINT
    assert container_status.reported_stop_signal(plain, "", "") == pb.SIGTERM


def test_undo_runs_newest_first_and_survives_failures(caplog):
    done = []

    async def async_step(x):
        done.append(x)

    def failing():
        raise OSError("boom")

    u = Undo("obj")
    u.push("one", done.append, 1)
    u.push("two", failing)
    u.push("three", async_step, 3)
    asyncio.run(u.run())
    assert done == [3, 1]
    assert "undo failed: two" in caplog.text
    asyncio.run(u.run())       # already run: nothing again
    assert done == [3, 1]


def test_undo_discard():
    done = []
    u = Undo("obj")
    u.push("one", done.append, 1)
    u.discard()
    asyncio.run(u.run())
    assert done == []


def test_undo_completes_when_the_caller_is_cancelled():
    done = []

    async def slow():
        await asyncio.sleep(0.05)
        done.append("slow")

    async def main():
        u = Undo("obj")
        u.push("slow", slow)
        t = asyncio.ensure_future(u.run())
        await asyncio.sleep(0)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        await wait_for_async(lambda: done, 5, "the undo step to finish")
    asyncio.run(main())
    assert done == ["slow"]


def test_event_bus_fans_out_and_drops_slow_subscribers(monkeypatch):
    import cri_server.events as events
    monkeypatch.setattr(events, "MAX_QUEUED", 3)

    async def main():
        bus = EventBus()
        fast, slow = [], []

        async def consume(out, n):
            async for ev in bus.subscribe():
                out.append(ev)
                if len(out) == n:
                    return
        t = asyncio.ensure_future(consume(fast, 5))
        s = bus.subscribe()
        first = asyncio.ensure_future(s.__anext__())
        await asyncio.sleep(0)
        assert len(bus) == 2
        for i in range(5):
            bus.publish(i)
            await asyncio.sleep(0)
        await t
        slow.append(await first)
        # The slow one fell more than MAX_QUEUED behind: dropped, its iteration ends.
        for i in range(5, 10):
            bus.publish(i)
        rest = [ev async for ev in s]
        return fast, slow, rest, len(bus)
    fast, slow, rest, left = asyncio.run(main())
    assert fast == [0, 1, 2, 3, 4]
    assert slow == [0] and len(rest) < 9 and left == 0


def test_validate_pod_config():
    with pytest.raises(InvalidArgument, match="metadata"):
        sandbox_run.validate(pb.PodSandboxConfig())
    with pytest.raises(InvalidArgument, match="metadata.uid"):
        sandbox_run.validate(pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="a", namespace="b")))
    ok = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="a", namespace="b", uid="c"))
    sandbox_run.validate(ok)
    ok.log_directory = "relative"
    with pytest.raises(InvalidArgument, match="log_directory"):
        sandbox_run.validate(ok)


def test_port_mappings_keep_only_host_ports():
    c = pb.PodSandboxConfig(port_mappings=[pb.PortMapping(container_port=80, host_port=8080, protocol=pb.UDP,
                                                          host_ip="127.0.0.1"),
                                           pb.PortMapping(container_port=81)])
    (pm,) = sandbox_run.port_mappings(c)
    assert (pm.host_port, pm.container_port, pm.protocol, pm.host_ip) == (8080, 80, "udp", "127.0.0.1")


def test_log_file_stays_inside_the_log_directory():
    sb = pb.PodSandboxConfig(log_directory="/var/log/pods/x")
    assert container_create.log_file(sb, "c/0.log") == "/var/log/pods/x/c/0.log"
    assert container_create.log_file(sb, "") == ""
    assert container_create.log_file(pb.PodSandboxConfig(), "c.log") == ""
    for bad in ("../../etc/passwd", "/abs.log", "a/../../b"):
        with pytest.raises(InvalidArgument, match="log_path"):
            container_create.log_file(sb, bad)


def test_cpu_rate():
    r = stats.CpuRates()
    assert r.rate("a", 1_000_000_000, 100) == 0                     # first sample: 0, as containerd
    assert r.rate("a", 2_000_000_000, 500_000_100) == 500_000_000   # half a core
    assert r.rate("a", 3_000_000_000, 100) == 0                     # counter went back: a new baseline
    r.forget_missing(set())
    assert r.rate("a", 4_000_000_000, 200) == 0


def test_memory_usage_working_set():
    from shim.pb import cgroups_v1 as cg
    m = cg.Metrics(memory=cg.MemoryStat(total_inactive_file=300, total_rss=50, pg_fault=7,
                                        usage=cg.MemoryEntry(usage=1000, limit=4000)))
    u = stats.memory_usage(m, 1)
    assert (u.usage_bytes.value, u.working_set_bytes.value, u.available_bytes.value, u.rss_bytes.value,
            u.page_faults.value) == (1000, 700, 3300, 50, 7)
    unlimited = cg.Metrics(memory=cg.MemoryStat(usage=cg.MemoryEntry(usage=10, limit=(1 << 63) - 4096)))
    assert not stats.memory_usage(unlimited, 1).HasField("available_bytes")


def test_network_usage_of_this_process():
    import os
    u = stats.network_usage(os.getpid(), 5)
    assert u is not None and u.timestamp == 5
    assert all(i.name != "lo" for i in u.interfaces)


def test_exit_reasons():
    assert ExitInfo(0, 1).reason == "Completed"
    assert ExitInfo(1, 1).reason == "Error"
    assert ExitInfo(137, 1, oom=True).reason == "OOMKilled"
    assert ExitInfo(255, 1, message="the shim exited").reason == "Unknown"


def test_nofile_limit():
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert nofile_limit(OomScorePolicy(-1000)) == 1048576
    restricted = nofile_limit(OomScorePolicy(0, "no CAP_SYS_RESOURCE"))
    assert restricted == (1048576 if hard == resource.RLIM_INFINITY else min(1048576, hard))


def test_each_runtime_has_its_own_root(tmp_path):
    from cri_server.shims import ShimManager
    m = ShimManager(str(tmp_path), "/run/husk/runtime", default_runtime="husk")
    assert m.root_for("husk") == m.root_for("") == "/run/husk/runtime"
    assert m.root_for("runc") == "/run/husk/runtime-runc"
    assert m.root_for("/usr/local/bin/crun") == "/run/husk/runtime-crun"
    assert m.paths("abc").socket == str(tmp_path / "shims" / "abc" / "shim.sock")
