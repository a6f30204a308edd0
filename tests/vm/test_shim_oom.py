"""The shim's OOM watcher on the host's cgroups (v2: inotify on memory.events; v1: the eventfd): a container killed
over its memory limit gives containerd a TaskOOM event before TaskExit, and the exit is recorded as OOM-killed.
Driven through husk-shim with husk (in-process) and with runc, as containerd would."""
from __future__ import annotations

import threading

import pytest

from shim import exitfile
from shim.loop import Loop
from shim.pb import events_service
from shim.ttrpc_server import Server, Service, listen_unix
from tests.integration.shim.test_shim_events import FakeEvents
from tests.shim_fixtures import cleanup_shim, make_bundle, start_shim, wait_for

pytestmark = [pytest.mark.vm, pytest.mark.root, pytest.mark.cgroup_v1_too]

EVENTS = "containerd.services.events.ttrpc.v1.Events"
OOM_EXIT_REASON = 1      # the shim's exit reason OOMKILLED


@pytest.fixture
def events(tmp_path):
    """A fake containerd events service on a unix socket: (its address, the FakeEvents that records)."""
    path = str(tmp_path / "events.sock")
    loop = Loop()
    impl = FakeEvents()
    srv = Server(loop, listen_unix(path), [Service(EVENTS, events_service.SERVICES[EVENTS], impl)])
    stop = threading.Event()
    t = threading.Thread(target=lambda: [loop.run_once(0.05) for _ in iter(stop.is_set, True)], daemon=True)
    t.start()
    yield path, impl
    stop.set()
    t.join()
    srv.close()


@pytest.mark.parametrize("runtime", ["husk", "runc"])
def test_oom_kill_reaches_containerd(tmp_path, events, runtime, cgroup_version) -> None:
    if runtime == "runc" and cgroup_version == 1:
        pytest.skip("runc on cgroup v1: tests/integration/shim/test_shim_events.py")
    path, impl = events
    s = start_shim(str(tmp_path), runtime, ttrpc_address=path)
    try:
        bundle = make_bundle(str(tmp_path), s.cid, ["dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1"],
                             memory_limit=32 << 20)
        with s.client() as c:
            c.Create(id=s.cid, bundle=bundle)
            c.Start(id=s.cid)
            assert c.Wait(id=s.cid, timeout=120).exit_status == 137
            wait_for(lambda: "/tasks/exit" in impl.topics(), 30, "exit event")
            topics = impl.topics()
            assert "/tasks/oom" in topics and topics.index("/tasks/oom") < topics.index("/tasks/exit"), topics
            exit_ev = [m for t, _, m in impl.got if t == "/tasks/exit"][0]
            assert exit_ev.exit_reason == OOM_EXIT_REASON
            assert exitfile.read(s.state_dir).oom_killed
            c.Delete(id=s.cid)
    finally:
        cleanup_shim(s)
