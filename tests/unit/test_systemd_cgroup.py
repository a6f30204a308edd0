"""The systemd cgroup driver without systemd: cgroupsPath parsing and slice expansion, unit names, unit
properties from linux.resources (runc's conversions), and the D-Bus client's calls against a fake
org.freedesktop.systemd1 (written with jeepney, the independent reference) on a private dbus-daemon (skipped where
dbus-daemon is not installed), on a peer socket as /run/systemd/private, and on a fake bus that lets the tests
forge signals a real bus would not: a JobRemoved is believed only from systemd."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.cgroups import resolve_path
from runtime.cgroups import systemd as sd
from runtime.errors import ConfigError, SetupError
from tests.support.dbusd import throwaway_bus
from tests.support.unixpeer import flooding, serve_one

INF = 2**64 - 1


def props(resources: dict[str, Any], version: int = 252) -> dict[str, Any]:
    return dict(sd.resource_properties(resources, lambda: version))


# --- paths and names ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("slice_, path", [
    ("system.slice", "/system.slice"),
    ("-.slice", "/"),
    ("kubepods.slice", "/kubepods.slice"),
    ("kubepods-burstable.slice", "/kubepods.slice/kubepods-burstable.slice"),
    ("kubepods-burstable-pod1234.slice",
     "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice"),
])
def test_expand_slice_nests_by_dashes(slice_: str, path: str) -> None:
    assert sd.expand_slice(slice_) == path


@pytest.mark.parametrize("bad", [".slice", "system", "a/b.slice", "a--b.slice", "-a.slice", "a-.slice",
                                 "system.scope", ""])
def test_bad_slice_names_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError, match="linux.cgroupsPath"):
        sd.expand_slice(bad)


def test_unit_names_follow_runc() -> None:
    assert sd.unit_name("husk", "abc") == "husk-abc.scope"
    assert sd.unit_name("", "abc") == "abc.scope"
    assert sd.unit_name("husk", "pod.slice") == "pod.slice"   # a slice, not a scope: the prefix is ignored


def test_parse_path_resolves_the_scope_under_its_slice() -> None:
    u = sd.parse_path("kubepods-burstable-podX.slice:husk:ID", "ID")
    assert (u.slice, u.name) == ("kubepods-burstable-podX.slice", "husk-ID.scope")
    assert u.path == "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podX.slice/husk-ID.scope"
    u = sd.parse_path(":husk:ID", "ID")
    assert (u.slice, u.path) == ("system.slice", "/system.slice/husk-ID.scope")     # empty slice
    u = sd.parse_path("system.slice::ID", "ID")
    assert (u.name, u.path) == ("ID.scope", "/system.slice/ID.scope")               # empty prefix
    u = sd.parse_path("-.slice:p:ID", "ID")
    assert u.path == "/p-ID.scope"                                                  # the root slice
    u = sd.parse_path(None, "abc")
    assert (u.slice, u.name) == ("system.slice", "husk-abc.scope")                  # no cgroupsPath


@pytest.mark.parametrize("bad", ["/kubepods/pod1/abc", "system.slice:abc", "a:b:c:d", "system.slice:husk:",
                                 "bad/slice.slice:husk:x", "system.slice:husk:a/b", "x:husk:y"])
def test_bad_systemd_paths_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError, match="linux.cgroupsPath"):
        sd.parse_path(bad, "id")


def test_a_slice_unit_cannot_hold_a_container() -> None:
    with pytest.raises(ConfigError, match="slice unit"):
        sd.parse_path("system.slice:husk:pod.slice", "id")


def test_slice_path_without_the_systemd_driver_is_refused() -> None:
    with pytest.raises(ConfigError, match="--systemd-cgroup"):
        resolve_path("kubepods-burstable-podX.slice:husk:abc", "abc")


# --- properties ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shares, weight", [(2, 1), (1024, 39), (262144, 10000), (512, 20)])
def test_cpu_shares_become_cpu_weight_as_runc(shares: int, weight: int) -> None:
    assert props({"cpu": {"shares": shares}})["CPUWeight"] == ("t", weight)
    assert weight == 1 + ((shares - 2) * 9999) // 262142


def test_cpu_quota_per_second_rounded_up_to_ten_ms() -> None:
    p = props({"cpu": {"quota": 50000, "period": 100000}})
    assert p["CPUQuotaPerSecUSec"] == ("t", 500000) and p["CPUQuotaPeriodUSec"] == ("t", 100000)
    assert props({"cpu": {"quota": 12345}})["CPUQuotaPerSecUSec"] == ("t", 130000)   # 123450 -> 130000
    assert "CPUQuotaPeriodUSec" not in props({"cpu": {"quota": 12345}})
    assert props({"cpu": {"quota": -1, "period": 50000}})["CPUQuotaPerSecUSec"] == ("t", INF)
    assert "CPUQuotaPeriodUSec" not in props({"cpu": {"quota": 1000, "period": 50000}}, version=241)


def test_memory_and_swap_as_runc() -> None:
    p = props({"memory": {"limit": 256 << 20, "swap": 384 << 20, "reservation": 64 << 20}})
    assert p["MemoryMax"] == ("t", 256 << 20)
    assert p["MemorySwapMax"] == ("t", 128 << 20)        # OCI swap is memory+swap
    assert p["MemoryLow"] == ("t", 64 << 20)
    assert props({"memory": {"limit": -1}}) == {"MemoryMax": ("t", INF), "MemorySwapMax": ("t", INF)}
    assert props({"memory": {"limit": 1 << 20, "swap": 1 << 20}})["MemorySwapMax"] == ("t", 0)   # no swap
    assert "MemorySwapMax" not in props({"memory": {"limit": 1 << 20}})
    with pytest.raises(ConfigError, match="memory.swap"):
        props({"memory": {"limit": 2 << 20, "swap": 1 << 20}})


def test_pids_limit_becomes_tasks_max() -> None:
    assert props({"pids": {"limit": 42}})["TasksMax"] == ("t", 42)
    assert props({"pids": {"limit": -1}})["TasksMax"] == ("t", INF)
    assert "TasksMax" not in props({"pids": {"limit": 0}})


@pytest.mark.parametrize("text, bits", [("0", b"\x01"), ("0-1", b"\x03"), ("1,3-5", b"\x3a"), ("8", b"\x00\x01"),
                                        ("0-9", b"\xff\x03"), (" 2 , ,7", b"\x84")])
def test_cpuset_bitmask_least_significant_byte_first(text: str, bits: bytes) -> None:
    assert sd.range_to_bits(text, "f") == bits


def test_cpuset_properties_need_systemd_244() -> None:
    p = props({"cpu": {"cpus": "0-1", "mems": "0"}})
    assert p["AllowedCPUs"] == ("ay", b"\x03") and p["AllowedMemoryNodes"] == ("ay", b"\x01")
    assert "AllowedCPUs" not in props({"cpu": {"cpus": "0-1"}}, version=243)
    for bad in ("", "3-1", "x", ","):
        with pytest.raises(ConfigError):
            sd.range_to_bits(bad, "linux.resources.cpu.cpus")


def test_version_is_asked_only_when_needed() -> None:
    def boom() -> int:
        raise AssertionError("version asked")
    sd.resource_properties({"memory": {"limit": 1 << 20}, "cpu": {"shares": 100, "quota": 1000}}, boom)


def test_unified_keys_with_a_property() -> None:
    p = props({"unified": {"memory.high": "1048576", "memory.low": "max", "memory.min": " 4096 ",
                           "cpu.weight": "77", "cpu.max": "max 50000", "pids.max": "10", "cpuset.cpus": "1",
                           "io.weight": "50", "memory.oom.group": "1"}})
    assert p["MemoryHigh"] == ("t", 1 << 20) and p["MemoryLow"] == ("t", INF) and p["MemoryMin"] == ("t", 4096)
    assert p["CPUWeight"] == ("t", 77) and p["TasksMax"] == ("t", 10) and p["AllowedCPUs"] == ("ay", b"\x02")
    assert p["CPUQuotaPerSecUSec"] == ("t", INF) and p["CPUQuotaPeriodUSec"] == ("t", 50000)
    assert not any(k.startswith("IO") or k.startswith("OOM") for k in p)   # files only (the v2 manager)
    for bad in ({"memory.high": "lots"}, {"cpu.max": "1 2 3"}, {"../x": "1"}, {"cgroup.procs": "1"}):
        with pytest.raises(ConfigError):
            props({"unified": bad})


def test_scope_properties() -> None:
    u = sd.parse_path("kubepods-burstable-podX.slice:husk:c1", "c1")
    p = dict(sd.scope_properties(u, 4242, "c1"))
    assert p["Slice"] == ("s", "kubepods-burstable-podX.slice") and p["PIDs"] == ("au", [4242])
    assert p["Delegate"] == ("b", True) and p["DefaultDependencies"] == ("b", False)
    for acct in ("MemoryAccounting", "CPUAccounting", "TasksAccounting", "IOAccounting"):
        assert p[acct] == ("b", True)
    assert "c1" in p["Description"][1]


def test_create_manager_validates_before_asking_systemd() -> None:
    m = sd.SystemdManager(sd.parse_path(":husk:c1", "c1"), "c1", new=True)
    with pytest.raises(ConfigError, match="linux.resources.pids.limit"):
        m.set({"pids": {"limit": -5}})
    with pytest.raises(ConfigError, match="linux.resources.cpu.cpus"):
        m.set({"cpu": {"cpus": "3-1"}})
    m.set({"memory": {"limit": 1 << 20}})
    assert m._client is None      # nothing was sent: the unit is started by apply(pid)
    m.destroy()                   # a create that never started the unit stops nothing
    assert m._client is None


def test_a_refused_create_leaves_an_existing_scope_alone(tmp_path: Any) -> None:
    """When systemd refuses the unit because it exists, the cgroup at the path is another container's: the
    failed create's cleanup (kill_all, pids, exists, destroy) must not touch it."""
    from runtime.cgroups.v2 import V2Manager
    import signal
    unit = sd.parse_path(":husk:c1", "c1")
    other = subprocess.Popen(["sleep", "60"])
    try:
        d = tmp_path / unit.path.lstrip("/")
        d.mkdir(parents=True)
        (d / "cgroup.procs").write_text(f"{other.pid}\n")
        (d / "cgroup.kill").write_text("")
        m = sd.SystemdManager(unit, "c1", new=True)
        m.fs = V2Manager(unit.path, mountpoint=str(tmp_path))
        assert m.fs.exists() and m.fs.pids() == [other.pid]
        assert not m.exists() and m.pids() == []
        m.kill_all(signal.SIGKILL)
        m.destroy()
        assert (d / "cgroup.kill").read_text() == "" and other.poll() is None and d.is_dir()
        m.started = True                     # once this create started the unit, the cgroup is its own
        assert m.exists() and m.pids() == [other.pid]
    finally:
        other.kill()
        other.wait()


def test_state_records_the_driver_and_old_records_load() -> None:
    from runtime import state as st
    rec = st.Record(id="c", pid=1, pid_start=2, bundle="/b", rootfs="/b/r", created="", cgroup_path="/x.scope",
                    config={}, systemd_unit="husk-c.scope")
    back = st.Record.from_dict(rec.to_dict())
    assert (back.cgroup_driver, back.systemd_unit) == ("systemd", "husk-c.scope")   # the driver is derived
    old = rec.to_dict()
    assert "cgroup_driver" not in old
    del old["systemd_unit"]
    back = st.Record.from_dict(old)
    assert (back.cgroup_driver, back.systemd_unit) == ("cgroupfs", "")


# --- the D-Bus client against a fake systemd -----------------------------------------------------------------
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER_IFACE = "org.freedesktop.systemd1.Manager"


def forged_job_removed(kind: str, job_id: int, unit: str, to: str) -> Any:
    """A JobRemoved saying "done" that the client must not believe: sent straight to the client's connection
    (`unicast`, `future`), from another sender, on another path, with another signature, interface or member."""
    from jeepney import DBusAddress, HeaderFields, new_signal
    job = f"{MANAGER_PATH}/job/{job_id}"
    path = f"{MANAGER_PATH}/unit/forged" if kind == "path" else MANAGER_PATH
    iface = "org.freedesktop.systemd1.Forged" if kind == "interface" else MANAGER_IFACE
    sig, body = ("uosss", (job_id, job, unit, "done", "x")) if kind == "signature" else ("uoss", (job_id, job, unit,
                                                                                                   "done"))
    member = "JobForged" if kind == "member" else "JobRemoved"
    msg = new_signal(DBusAddress(path, interface=iface), member, sig, body)
    if kind in ("unicast", "future"):
        msg.header.fields[HeaderFields.destination] = to
    if kind == "sender":
        msg.header.fields[HeaderFields.sender] = ":1.66"
    return msg


class FakeManager:
    """org.freedesktop.systemd1.Manager's answers: records every call; StartTransientUnit/StopUnit answer with a
    job and then emit JobRemoved with `self.result`; a second start of a unit is UnitExists. With `forge` set,
    forged "done" signals of that kind go out first (for `future`: at Subscribe, for the next jobs' paths)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.units: set[str] = set()
        self.result = "done"
        self.job_id = 0
        self.forge = ""

    def handle(self, msg: Any) -> list[Any]:
        from jeepney import DBusAddress, HeaderFields, MessageType, new_error, new_method_return, new_signal
        if msg.header.message_type != MessageType.method_call:
            return []
        member = msg.header.fields[HeaderFields.member]
        self.calls.append((member, tuple(msg.body)))
        if member in ("StartTransientUnit", "StopUnit"):
            name = msg.body[0]
            if member == "StartTransientUnit" and name in self.units:
                return [new_error(msg, "org.freedesktop.systemd1.UnitExists", "s",
                                  (f"Unit {name} was already loaded or has a fragment file.",))]
            if member == "StopUnit" and name not in self.units:
                return [new_error(msg, "org.freedesktop.systemd1.NoSuchUnit", "s", (f"Unit {name} not loaded.",))]
            self.job_id += 1
            job = f"/org/freedesktop/systemd1/job/{self.job_id}"
            (self.units.add if member == "StartTransientUnit" else self.units.discard)(name)
            manager = DBusAddress(MANAGER_PATH, interface=MANAGER_IFACE)
            caller = msg.header.fields.get(HeaderFields.sender, ":1.42")
            forged = [forged_job_removed(self.forge, self.job_id, name, caller)] if self.forge not in ("", "future") \
                else []
            return [new_method_return(msg, "o", (job,)), *forged,
                    new_signal(manager, "JobRemoved", "uoss", (self.job_id, job, name, self.result))]
        if member == "Get":
            return [new_method_return(msg, "v", (("s", "252.30-1~deb12u2"),))]
        if member == "Subscribe" and self.forge == "future":
            caller = msg.header.fields.get(HeaderFields.sender, ":1.42")
            return [new_method_return(msg), *(forged_job_removed("future", self.job_id + n, "husk-f.scope", caller)
                                              for n in range(1, 6))]
        return [new_method_return(msg)]   # Subscribe, SetUnitProperties, ResetFailedUnit


class FakeSystemd(FakeManager):
    """The fake manager as org.freedesktop.systemd1 on a private bus."""

    def __init__(self, address: str) -> None:
        from jeepney.bus_messages import message_bus
        from jeepney.io.blocking import open_dbus_connection
        super().__init__()
        self.conn = open_dbus_connection(bus=address)
        self.conn.send_and_get_reply(message_bus.RequestName("org.freedesktop.systemd1"), timeout=5)
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop:
            try:
                msg = self.conn.receive(timeout=0.2)
            except TimeoutError:
                continue
            except OSError:
                return
            for out in self.handle(msg):
                self.conn.send(out)

    def close(self) -> None:
        self.stop = True
        self.thread.join(5)
        self.conn.close()


class FakePrivateSocket(FakeManager):
    """The fake manager on a peer-to-peer socket, as systemd's /run/systemd/private: the SASL EXTERNAL
    handshake, then messages without a bus (a Hello would be an unknown method: recorded, and refused).
    With `bus`, a fake bus instead: it answers Hello (":1.42") and AddMatch as org.freedesktop.DBus, and sends
    systemd's messages as ":1.1" unless they name their own sender (what a forger on a real bus cannot do), and
    answers GetNameOwner(org.freedesktop.systemd1) with ":1.1"."""

    def __init__(self, path: str, bus: bool = False) -> None:
        super().__init__()
        self.bus = bus
        self.listener, self.thread = serve_one(path, self._serve)

    def _serve(self, conn: socket.socket) -> None:
        from jeepney import Parser
        buf = b""
        while b"BEGIN\r\n" not in buf:
            chunk = conn.recv(4096)
            if not chunk:
                return
            buf += chunk
            if b"AUTH EXTERNAL" in buf and b"OK" not in buf:
                conn.sendall(b"OK 0123456789abcdef0123456789abcdef\r\n")
                buf += b"OK"
        parser = Parser()
        parser.add_data(buf.split(b"BEGIN\r\n", 1)[1])
        serial = 1000
        while True:
            msg = parser.get_next_message()
            if msg is None:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                parser.add_data(chunk)
                continue
            for out in self._answer(msg):
                serial += 1
                conn.sendall(out.serialise(serial=serial))

    def _answer(self, msg: Any) -> list[Any]:
        from jeepney import HeaderFields, new_method_return
        member = msg.header.fields.get(HeaderFields.member)
        if not self.bus:
            return self.handle(msg)
        if member in ("Hello", "AddMatch", "GetNameOwner"):
            reply = (new_method_return(msg, "s", (":1.42",)) if member == "Hello" else
                     new_method_return(msg, "s", (":1.1",)) if member == "GetNameOwner" else new_method_return(msg))
            reply.header.fields[HeaderFields.sender] = "org.freedesktop.DBus"
            return [reply]
        out = self.handle(msg)
        for m in out:
            m.header.fields.setdefault(HeaderFields.sender, ":1.1")
        return out

    def close(self) -> None:
        self.listener.close()
        self.thread.join(5)


@pytest.fixture
def fake_systemd(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSystemd]:
    pytest.importorskip("jeepney")
    with throwaway_bus("husk-fake-systemd-") as address:
        monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", address)
        fake = FakeSystemd(address)
        try:
            yield fake
        finally:
            fake.close()


def test_start_transient_unit_on_the_wire(fake_systemd: FakeSystemd) -> None:
    from runtime.cgroups import systemd_dbus
    unit = sd.parse_path("kubepods-burstable-podX.slice:husk:c1", "c1")
    client = systemd_dbus.connect()
    try:
        assert client.on_bus and client.version() == 252
        properties = sd.scope_properties(unit, 4242, "c1") + sd.resource_properties(
            {"memory": {"limit": 1 << 20}, "cpu": {"cpus": "0-1"}}, client.version)
        client.start_transient_unit(unit.name, properties)
        client.set_unit_properties(unit.name, [("MemoryMax", ("t", 2 << 20))])
        client.stop_unit(unit.name)
        client.stop_unit(unit.name)        # gone already: not an error
    finally:
        client.close()
    by_name = {}
    for member, body in fake_systemd.calls:
        by_name.setdefault(member, []).append(body)
    assert "Subscribe" in by_name
    name, mode, sent, aux = by_name["StartTransientUnit"][0]
    assert (name, mode, aux) == ("husk-c1.scope", "replace", [])
    sent = dict(sent)
    assert sent["PIDs"] == ("au", [4242]) and sent["Slice"] == ("s", "kubepods-burstable-podX.slice")
    assert sent["Delegate"] == ("b", True) and sent["MemoryMax"] == ("t", 1 << 20)
    assert sent["AllowedCPUs"] == ("ay", b"\x03")
    assert by_name["SetUnitProperties"] == [("husk-c1.scope", True, [("MemoryMax", ("t", 2 << 20))])]
    assert by_name["StopUnit"][0] == ("husk-c1.scope", "replace")


def test_refused_unit_is_a_clear_error(fake_systemd: FakeSystemd) -> None:
    from runtime.cgroups import systemd_dbus
    client = systemd_dbus.connect()
    try:
        client.start_transient_unit("husk-a.scope", [])
        with pytest.raises(SetupError, match=r"husk-a\.scope.*org\.freedesktop\.systemd1\.UnitExists"):
            client.start_transient_unit("husk-a.scope", [])
        # a leftover unit is reset and the start retried once, as runc does
        assert [m for m, _ in fake_systemd.calls][-3:] == ["StartTransientUnit", "ResetFailedUnit",
                                                           "StartTransientUnit"]
        fake_systemd.result = "failed"
        with pytest.raises(SetupError, match=r"husk-b\.scope.*'failed'"):
            client.start_transient_unit("husk-b.scope", [])
    finally:
        client.close()


def test_private_socket_when_there_is_no_system_bus(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    pytest.importorskip("jeepney")
    from runtime.cgroups import systemd_dbus
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/nobus")
    monkeypatch.setattr(systemd_dbus, "PRIVATE_SOCKET", f"{tmp_path}/private")
    fake = FakePrivateSocket(f"{tmp_path}/private")
    try:
        client = systemd_dbus.connect()
        try:
            assert not client.on_bus
            client.start_transient_unit("husk-p.scope", [("PIDs", ("au", [1]))])
            client.stop_unit("husk-p.scope")
        finally:
            client.close()
    finally:
        fake.close()
    # no Hello and no AddMatch on a peer connection: Subscribe alone makes systemd send JobRemoved
    assert [m for m, _ in fake.calls] == ["Subscribe", "StartTransientUnit", "StopUnit", "ResetFailedUnit"]


def test_no_bus_and_no_private_socket_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from runtime.cgroups import systemd_dbus
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/nobus")
    monkeypatch.setattr(systemd_dbus, "PRIVATE_SOCKET", f"{tmp_path}/noprivate")
    with pytest.raises(SetupError, match="system bus.*nobus.*noprivate"):
        systemd_dbus.connect()


def test_a_bad_bus_address_is_an_error_not_a_fallback(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from runtime.cgroups import systemd_dbus
    from runtime.linux.dbus import DBusAddressError
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/bus%zz")
    monkeypatch.setattr(systemd_dbus, "PRIVATE_SOCKET", f"{tmp_path}/private")
    (tmp_path / "private").write_text("")        # present: the error must not come from the fallback
    with pytest.raises(DBusAddressError, match=r"D-Bus address .*bus%zz.*bad escape '%zz'"):
        systemd_dbus.connect()


def _start_must_see_the_real_result(client: Any, unit: str = "husk-f.scope") -> None:
    """The fake's real JobRemoved says "failed" after the forged "done": a client that believed a forgery
    would return from start_transient_unit without an error."""
    with pytest.raises(SetupError, match=rf"{unit}.*'failed'"):
        client.start_transient_unit(unit, [])


@pytest.mark.parametrize("kind", ["unicast", "sender", "path", "signature", "interface", "member", "future"])
def test_forged_job_signals_on_a_bus_do_not_finish_a_wait(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                                          kind: str) -> None:
    pytest.importorskip("jeepney")
    from runtime.cgroups import systemd_dbus
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/bus")
    fake = FakePrivateSocket(f"{tmp_path}/bus", bus=True)
    fake.result, fake.forge = "failed", kind
    try:
        client = systemd_dbus.connect()
        try:
            assert client.on_bus and client.conn.unique_name == ":1.42" and client.systemd_name == ":1.1"
            _start_must_see_the_real_result(client)
        finally:
            client.close()
    finally:
        fake.close()


def test_the_fake_bus_signals_are_believed_without_forgeries(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    pytest.importorskip("jeepney")
    from runtime.cgroups import systemd_dbus
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/bus")
    fake = FakePrivateSocket(f"{tmp_path}/bus", bus=True)
    try:
        client = systemd_dbus.connect()
        try:
            client.start_transient_unit("husk-ok.scope", [])     # believed: the start returns
            fake.result = "failed"
            _start_must_see_the_real_result(client)
        finally:
            client.close()
    finally:
        fake.close()


@pytest.mark.parametrize("kind", ["unicast", "path", "signature", "interface", "member", "future"])
def test_forged_job_signals_on_the_private_socket_do_not_finish_a_wait(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Any, kind: str) -> None:
    pytest.importorskip("jeepney")
    from runtime.cgroups import systemd_dbus
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/nobus")
    monkeypatch.setattr(systemd_dbus, "PRIVATE_SOCKET", f"{tmp_path}/private")
    fake = FakePrivateSocket(f"{tmp_path}/private")
    fake.result, fake.forge = "failed", kind
    try:
        client = systemd_dbus.connect()
        try:
            assert not client.on_bus
            _start_must_see_the_real_result(client)
        finally:
            client.close()
    finally:
        fake.close()


def test_forged_job_signals_on_a_real_bus_do_not_finish_a_wait(fake_systemd: FakeSystemd) -> None:
    """Another local process unicasts "done" for the job paths systemd will hand out next (a match rule does not
    stop a unicast), and systemd's own connection sends one it cannot mean (unicast, another signature)."""
    from jeepney import DBusAddress, new_method_call
    from jeepney.io.blocking import open_dbus_connection
    from runtime.cgroups import systemd_dbus
    client = systemd_dbus.connect()
    attacker = open_dbus_connection(bus=os.environ["DBUS_SYSTEM_BUS_ADDRESS"])
    try:
        assert client.systemd_name == fake_systemd.conn.unique_name
        for n in range(1, 6):
            attacker.send(forged_job_removed("future", n, "husk-f.scope", client.conn.unique_name))
        # a round trip with the bus: it has routed the forgeries before it answers
        attacker.send_and_get_reply(new_method_call(DBusAddress("/org/freedesktop/DBus",
                                                                bus_name="org.freedesktop.DBus",
                                                                interface="org.freedesktop.DBus"), "GetId"),
                                    timeout=5)
        fake_systemd.result = "failed"
        fake_systemd.forge = "unicast"
        _start_must_see_the_real_result(client)
        fake_systemd.forge = "signature"
        _start_must_see_the_real_result(client, "husk-g.scope")
    finally:
        attacker.close()
        client.close()


def test_a_signal_flood_neither_piles_up_nor_outlasts_the_timeouts() -> None:
    """While a call waited for its reply, every signal from anyone was held in an unbounded list, and wait_job
    then took them with no look at its deadline. Now a call holds only systemd's JobRemoved broadcasts (the check
    that believes them), and every wait ends within its timeout while forgeries and others' broadcasts pour in."""
    import _socket
    import socket
    import time
    from runtime.cgroups import systemd_dbus
    from runtime.linux import dbus
    ours, peer = socket.socketpair()
    conn = dbus.Connection(_socket.socket(fileno=ours.detach()), "unix:path=/fake-bus")
    conn.unique_name = ":1.42"
    client = systemd_dbus.Client(conn, on_bus=True)
    client.systemd_name = ":1.1"
    job = f"{MANAGER_PATH}/job/7"
    manager = dict(path=MANAGER_PATH, interface=MANAGER_IFACE, member="JobRemoved", signature="uoss",
                   body=(7, job, "husk-f.scope", "done"))
    forged = [dbus.Message(dbus.SIGNAL, destination=":1.42", sender=":1.1", **manager),   # unicast
              dbus.Message(dbus.SIGNAL, sender=":1.666", **manager),                      # not systemd's
              dbus.Message(dbus.SIGNAL, path="/a", interface="a.b", member="X", sender=":1.7")]  # anyone's
    blob = b"".join(dbus.encode_message(m, n + 1) for n, m in enumerate(forged)) * 1000
    reply = dbus.encode_message(dbus.Message(dbus.METHOD_RETURN, reply_serial=1, sender=":1.1", signature="o",
                                             body=(job,)), 9)

    def answer(peer: socket.socket) -> None:
        peer.recv(65536)                    # StartTransientUnit
        peer.sendall(blob * 3)
        peer.sendall(reply)

    try:
        with flooding(peer, blob, answer):
            (got,) = client.call("start", systemd_dbus._method(systemd_dbus.MANAGER, "StartTransientUnit",
                                                               "ssa(sv)a(sa(sv))", ("husk-f.scope", "replace", [], [])))
            assert got == job and conn.held_signals() == 0
            t0 = time.monotonic()
            with pytest.raises(SetupError, match="did not finish within 1 s"):
                client.wait_job(job, "start", timeout=1.0)
            assert time.monotonic() - t0 < 3
            t0 = time.monotonic()
            with pytest.raises(SetupError, match="did not answer within 1 s"):
                client.call("stop", systemd_dbus._method(systemd_dbus.MANAGER, "StopUnit", "ss", ("x", "replace")),
                            timeout=1.0)
            assert time.monotonic() - t0 < 3 and conn.held_signals() == 0
    finally:
        client.close()
        peer.close()


def test_a_forged_reply_does_not_make_its_sender_systemd(fake_systemd: FakeSystemd) -> None:
    """systemd's unique name was learned from the sender of the reply to Subscribe, whoever sent it: on a permissive
    bus (this session bus delivers unrequested replies) another connection that replied first to the serial of
    that call became "systemd" (its replies believed, systemd's dropped). The bus now names the owner."""
    from jeepney import DBusAddress, HeaderFields, new_method_call
    from jeepney.io.blocking import open_dbus_connection
    from runtime.cgroups import systemd_dbus
    from runtime.linux import dbus
    attacker = open_dbus_connection(bus=os.environ["DBUS_SYSTEM_BUS_ADDRESS"])
    real_handle = fake_systemd.handle

    def handle(msg: Any) -> list[Any]:
        if msg.header.fields.get(HeaderFields.member) == "Subscribe":
            # the forger answers first; a round trip with the bus: it has routed the forgery before it answers
            forged = dbus.Message(dbus.METHOD_RETURN, reply_serial=msg.header.serial,
                                  destination=msg.header.fields[HeaderFields.sender])
            attacker.sock.sendall(dbus.encode_message(forged, 1000))
            attacker.send_and_get_reply(new_method_call(DBusAddress(dbus.BUS_PATH, bus_name=dbus.BUS_NAME,
                                                                    interface=dbus.BUS_NAME), "GetId"), timeout=5)
        return real_handle(msg)
    fake_systemd.handle = handle                  # type: ignore[method-assign]
    try:
        client = systemd_dbus.connect()
        try:
            assert client.systemd_name == fake_systemd.conn.unique_name != attacker.unique_name
            client.start_transient_unit("husk-r.scope", [])      # systemd's own reply and JobRemoved count
            fake_systemd.result = "failed"
            _start_must_see_the_real_result(client, "husk-s.scope")
        finally:
            client.close()
    finally:
        attacker.close()
    assert [m for m, _ in fake_systemd.calls][0] == "Subscribe"


def _systemd_leaves(fake: FakeSystemd, conn: Any) -> None:
    """Closes the fake systemd's connection and waits until the bus (as `conn` asks it) has seen it go."""
    import time
    from runtime.linux import dbus
    fake.close()
    has_owner = dbus.method_call(dbus.BUS_NAME, dbus.BUS_PATH, dbus.BUS_NAME, "NameHasOwner", "s",
                                 ("org.freedesktop.systemd1",))
    deadline = time.monotonic() + 10
    while conn.call(has_owner, deadline, dbus.BUS_NAME).body == (True,):
        time.sleep(0.01)


def test_systemd_missing_from_the_bus_is_a_clear_error(fake_systemd: FakeSystemd) -> None:
    from runtime.cgroups import systemd_dbus
    from runtime.linux import dbus
    conn = dbus.open_bus(os.environ["DBUS_SYSTEM_BUS_ADDRESS"], 5)
    try:
        _systemd_leaves(fake_systemd, conn)
    finally:
        conn.close()
    with pytest.raises(SetupError, match=r"GetNameOwner org\.freedesktop\.systemd1: .*NameHasNoOwner"):
        systemd_dbus.connect()


def test_the_bus_answering_for_systemd_ends_a_call_at_once(fake_systemd: FakeSystemd) -> None:
    """When the bus cannot deliver a call to systemd (or systemd's reply), it answers itself, as
    org.freedesktop.DBus: ServiceUnknown, NoReply, LimitsExceeded. Those were dropped once systemd's unique name
    was known, and the caller waited out the whole call timeout (25 s)."""
    import time
    from runtime.cgroups import systemd_dbus
    client = systemd_dbus.connect()
    try:
        assert client.systemd_name == fake_systemd.conn.unique_name
        _systemd_leaves(fake_systemd, client.conn)       # a restart, a crash
        stop = systemd_dbus._method(systemd_dbus.MANAGER, "StopUnit", "ss", ("x.scope", "replace"))
        stop.flags = 2                # NO_AUTO_START: a session bus may have a service file for systemd1
        t0 = time.monotonic()
        with pytest.raises(systemd_dbus.DBusError, match="stop systemd unit x.scope") as err:
            client.call("stop systemd unit x.scope", stop, timeout=5)
        assert err.value.name in ("org.freedesktop.DBus.Error.NameHasNoOwner",      # dbus-daemon 1.14
                                  "org.freedesktop.DBus.Error.ServiceUnknown")
        assert time.monotonic() - t0 < 2
    finally:
        client.close()


def test_cgroup_v1_host_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.cgroups as cg
    monkeypatch.setattr(cg, "is_unified", lambda root=cg.CGROUP_ROOT: False)
    with pytest.raises(SetupError, match="cgroup v2"):
        sd.check_host()


def test_dbus_client_is_not_imported_by_the_driver_module() -> None:
    code = ("import sys; from runtime.cgroups import systemd, manager_for; "
            "manager_for('/system.slice/x.scope', 'x.scope'); "
            "print(any(m.startswith('jeepney') or m.endswith(('systemd_dbus', 'linux.dbus')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("systemd", [False, True])
def test_the_shims_in_process_driver_passes_the_driver_to_create(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                                                  systemd: bool) -> None:
    """husk-cri's systemd_cgroup reaches runtime.lifecycle.create in the shim's fork (the binary driver passes
    --systemd-cgroup on the command line instead)."""
    from shim import runtime_driver as rd
    from shim.stdio import ChildStdio
    driver = rd.InProcessRuntime(rd.RuntimeOptions(root=str(tmp_path), systemd_cgroup=systemd))
    seen: dict[str, Any] = {}

    def fake_forked(op: str, cid: str, stdio: Any, fn: Any, *args: Any, **kw: Any) -> None:
        seen.update(fn=fn, kw=kw)
    monkeypatch.setattr(driver, "_forked", fake_forked)
    (tmp_path / "pid").write_text("42")
    assert driver.create("c1", "/bundle", ChildStdio(stdin=0, stdout=1, stderr=2), str(tmp_path / "pid")) == 42
    assert seen["fn"] is driver.lc.create and seen["kw"]["systemd_cgroup"] is systemd
    import inspect
    assert "systemd_cgroup" in inspect.signature(driver.lc.create).parameters
