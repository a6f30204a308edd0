"""Task events reach containerd's Events/Forward in order; OOM kills become TaskOOM and the exit reason (root)."""
from __future__ import annotations

import json
import threading

import pytest

from shim.loop import Loop
from shim.pb import events as ev
from shim.pb import events_service, google
from shim.protobuf import lookup
from shim.ttrpc_server import Server, Service, listen_unix
from tests.shim_fixtures import cleanup_shim, lifecycle_runtimes, make_bundle, runtime_id, start_shim, wait_for

pytestmark = pytest.mark.root


@pytest.fixture(params=lifecycle_runtimes(), ids=runtime_id)
def runtime(request):
    """The events come from the shim, whatever runs the container: husk in-process and every runtime binary."""
    return request.param


class FakeEvents:
    def __init__(self):
        self.got = []
        self.lock = threading.Lock()

    def Forward(self, ctx, req):
        env = req.envelope
        msg = lookup(env.event.type_url).decode(env.event.value)
        with self.lock:
            self.got.append((env.topic, env.namespace, msg))
        return google.Empty()

    def topics(self):
        with self.lock:
            return [t for t, _, _ in self.got]


@pytest.fixture
def events_server(tmp_path):
    path = str(tmp_path / "events.sock")
    loop = Loop()
    impl = FakeEvents()
    srv = Server(loop, listen_unix(path), [Service("containerd.services.events.ttrpc.v1.Events",
                                                   events_service.SERVICES["containerd.services.events.ttrpc.v1.Events"],
                                                   impl)])
    stop = threading.Event()
    t = threading.Thread(target=lambda: [loop.run_once(0.05) for _ in iter(stop.is_set, True)], daemon=True)
    t.start()
    yield path, impl
    stop.set()
    t.join()
    srv.close()


def test_event_order(tmp_path, events_server, runtime):
    path, impl = events_server
    s = start_shim(str(tmp_path), runtime, ttrpc_address=path)
    try:
        bundle = make_bundle(str(tmp_path), s.cid, ["sleep", "1000"])
        spec = google.Any(type_url="x", value=json.dumps({"args": ["true"], "cwd": "/", "env": ["PATH=/bin"]}).encode())
        with s.client() as c:
            c.Create(id=s.cid, bundle=bundle)
            c.Start(id=s.cid)
            c.Exec(id=s.cid, exec_id="e", spec=spec)
            c.Start(id=s.cid, exec_id="e")
            c.Wait(id=s.cid, exec_id="e", timeout=30)
            c.Delete(id=s.cid, exec_id="e")
            c.Pause(id=s.cid)
            c.Resume(id=s.cid)
            c.Kill(id=s.cid, signal=9)
            c.Wait(id=s.cid, timeout=30)
            c.Delete(id=s.cid)
        want = ["/tasks/create", "/tasks/start", "/tasks/exec-added", "/tasks/exec-started", "/tasks/exit",
                "/tasks/delete", "/tasks/paused", "/tasks/resumed", "/tasks/exit", "/tasks/delete"]
        wait_for(lambda: len(impl.topics()) >= len(want), 10, "events")
        assert impl.topics() == want
        exits = [m for t, _, m in impl.got if t == "/tasks/exit"]
        assert exits[0].id == "e" and exits[0].exit_status == 0
        assert exits[1].id == s.cid and exits[1].exit_status == 137 and exits[1].container_id == s.cid
        assert all(ns == "default" for _, ns, _ in impl.got)
    finally:
        cleanup_shim(s)


def test_events_queued_while_containerd_is_away(tmp_path, runtime):
    """No events server at first: events are kept and delivered in order once it appears."""
    path = str(tmp_path / "late.sock")
    s = start_shim(str(tmp_path), runtime, ttrpc_address=path)
    try:
        bundle = make_bundle(str(tmp_path), s.cid, ["true"])
        with s.client() as c:
            c.Create(id=s.cid, bundle=bundle)
            c.Start(id=s.cid)
            c.Wait(id=s.cid, timeout=30)
            loop = Loop()
            impl = FakeEvents()
            srv = Server(loop, listen_unix(path), [Service(
                "containerd.services.events.ttrpc.v1.Events",
                events_service.SERVICES["containerd.services.events.ttrpc.v1.Events"], impl)])
            def three_events() -> bool:
                loop.run_once(0.05)
                return len(impl.got) >= 3
            try:
                wait_for(three_events, 10, lambda: f"3 events, got {impl.topics()}", interval=0)
            finally:
                srv.close()
            assert impl.topics()[:3] == ["/tasks/create", "/tasks/start", "/tasks/exit"]
            c.Delete(id=s.cid)
    finally:
        cleanup_shim(s)


def test_oom_kill(tmp_path, events_server, runtime):
    path, impl = events_server
    s = start_shim(str(tmp_path), runtime, ttrpc_address=path)
    try:
        bundle = make_bundle(str(tmp_path), s.cid, ["dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1"],
                             memory_limit=32 << 20)
        with s.client() as c:
            c.Create(id=s.cid, bundle=bundle)
            c.Start(id=s.cid)
            assert c.Wait(id=s.cid, timeout=60).exit_status == 137
            wait_for(lambda: "/tasks/exit" in impl.topics(), 10, "exit event")
            topics = impl.topics()
            assert "/tasks/oom" in topics and topics.index("/tasks/oom") < topics.index("/tasks/exit")
            exit_ev = [m for t, _, m in impl.got if t == "/tasks/exit"][0]
            assert exit_ev.exit_reason == 1          # OOMKILLED
            from shim import exitfile
            assert exitfile.read(s.state_dir).oom_killed
            c.Delete(id=s.cid)
    finally:
        cleanup_shim(s)
