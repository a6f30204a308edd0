"""The one D-Bus connection of the systemd cgroup driver: org.freedesktop.systemd1.Manager calls and job waits.

Owns connecting (the system bus, $DBUS_SYSTEM_BUS_ADDRESS honoured, else systemd's private peer-to-peer socket
/run/systemd/private, root only), subscribing to the manager's JobRemoved signal, and StartTransientUnit /
StopUnit / SetUnitProperties / ResetFailedUnit with a wait for each job. Must not decide unit names or
properties (systemd.py does). Imported only when the systemd driver is used.

The client library is jeepney (pure Python, blocking I/O, no event loop), chosen by measured import cost
(`python -X importtime`, sum of the import times above a bare interpreter, medians of 7 runs on the 2-core
development host): jeepney 0.9 (`jeepney.io.blocking` + `bus_messages`) ~28 ms, 0.5 MB installed;
dbus-fast 5.2 (`dbus_fast.aio`, its only non-GLib I/O, which needs asyncio) ~130 ms, 2.9 MB.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

from jeepney import DBusAddress, HeaderFields, MessageType, new_method_call
from jeepney.bus_messages import MatchRule, message_bus
from jeepney.io.blocking import DBusConnection, DBusConnectionBase, prep_socket

from runtime.errors import SetupError

log = logging.getLogger(__name__)

SYSTEM_BUS = "unix:path=/run/dbus/system_bus_socket"
PRIVATE_SOCKET = "/run/systemd/private"
MANAGER_IFACE = "org.freedesktop.systemd1.Manager"
MANAGER = DBusAddress("/org/freedesktop/systemd1", bus_name="org.freedesktop.systemd1", interface=MANAGER_IFACE)
PROPERTIES = DBusAddress("/org/freedesktop/systemd1", bus_name="org.freedesktop.systemd1",
                         interface="org.freedesktop.DBus.Properties")
CALL_TIMEOUT = 25.0   # s for a method reply (D-Bus's default)
JOB_TIMEOUT = 30.0    # s for a job to finish, as runc waits
UNIT_EXISTS = "org.freedesktop.systemd1.UnitExists"
NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"
LOAD_FAILED = "org.freedesktop.systemd1.LoadFailed"


class DBusError(SetupError):
    """An error reply: `name` is the D-Bus error name, `text` its message."""

    def __init__(self, what: str, name: str, text: str) -> None:
        super().__init__(f"{what}: {name}: {text}" if text else f"{what}: {name}")
        self.name = name
        self.text = text


class _PeerConnection(DBusConnection):
    """A connection to systemd's private socket: peer-to-peer, so no bus to say Hello to."""

    def __init__(self, sock: Any) -> None:   # noqa: D107 - DBusConnection's __init__ would call Hello
        DBusConnectionBase.__init__(self, sock, False)
        from jeepney.io.common import MessageFilters
        self._filters = MessageFilters()
        self.unique_name = None


def _unix_path(address: str) -> str:
    """The socket of a D-Bus address (unix:path=... or unix:abstract=...; the first usable one)."""
    from jeepney.bus import get_connectable_addresses
    try:
        return next(get_connectable_addresses(address))
    except (RuntimeError, ValueError, StopIteration) as e:
        raise SetupError(f"D-Bus address {address!r}: {e}") from None


def connect(timeout: float = 5.0) -> "Client":
    """The system bus (subscribed to JobRemoved), or, when it cannot be reached, systemd's private socket."""
    address = os.environ.get("DBUS_SYSTEM_BUS_ADDRESS") or SYSTEM_BUS
    try:
        sock = prep_socket(_unix_path(address), timeout=timeout)
    except (OSError, TimeoutError) as bus_err:
        if not os.path.exists(PRIVATE_SOCKET):
            raise SetupError(f"systemd cgroup driver: connect to the system bus {address}: {bus_err}; "
                             f"and there is no {PRIVATE_SOCKET}") from None
        try:
            sock = prep_socket(PRIVATE_SOCKET, timeout=timeout)
        except (OSError, TimeoutError, ValueError) as e:
            raise SetupError(f"systemd cgroup driver: connect to the system bus {address}: {bus_err}; "
                             f"connect to {PRIVATE_SOCKET}: {e}") from None
        log.debug("systemd: no system bus (%s), using %s", bus_err, PRIVATE_SOCKET)
        client = Client(_PeerConnection(sock), on_bus=False)
    else:
        client = Client(DBusConnection(sock), on_bus=True)
    try:
        client.subscribe()
    except BaseException:
        client.close()
        raise
    return client


class Client:
    """Blocking calls on systemd's manager. Every JobRemoved signal seen while waiting for anything is kept,
    so a job that finishes before its caller starts waiting is not missed."""

    def __init__(self, conn: DBusConnection, on_bus: bool) -> None:
        self.conn = conn
        self.on_bus = on_bus
        self._jobs: dict[str, str] = {}     # job path -> result, from JobRemoved
        self._version: int | None = None

    def close(self) -> None:
        self.conn.close()

    # --- the wire -----------------------------------------------------------------------------------------
    def _recv(self, deadline: float) -> Any:
        msg = self.conn.receive(timeout=max(deadline - time.monotonic(), 0.0))
        h = msg.header
        if (h.message_type == MessageType.signal and h.fields.get(HeaderFields.member) == "JobRemoved"
                and h.fields.get(HeaderFields.interface) == MANAGER_IFACE):
            _id, job, _unit, result = msg.body
            self._jobs[job] = result
        return msg

    def call(self, what: str, msg: Any, timeout: float = CALL_TIMEOUT) -> tuple[Any, ...]:
        serial = next(self.conn.outgoing_serial)
        self.conn.send(msg, serial=serial)
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self._recv(deadline)
            except TimeoutError:
                raise SetupError(f"{what}: systemd did not answer within {timeout:.0f} s") from None
            except (OSError, ValueError) as e:
                raise SetupError(f"{what}: D-Bus connection to systemd: {e}") from None
            if reply.header.fields.get(HeaderFields.reply_serial) != serial:
                continue
            if reply.header.message_type == MessageType.error:
                name = reply.header.fields.get(HeaderFields.error_name, "")
                text = reply.body[0] if reply.body and isinstance(reply.body[0], str) else ""
                raise DBusError(what, name, text)
            return tuple(reply.body)

    def wait_job(self, job: str, what: str, timeout: float = JOB_TIMEOUT) -> str:
        """The result of `job` ("done", "failed", "timeout", "canceled", "dependency", "skipped")."""
        deadline = time.monotonic() + timeout
        while job not in self._jobs:
            try:
                self._recv(deadline)
            except TimeoutError:
                raise SetupError(f"{what}: systemd's job {job} did not finish within {timeout:.0f} s") from None
            except (OSError, ValueError) as e:
                raise SetupError(f"{what}: D-Bus connection to systemd: {e}") from None
        return self._jobs.pop(job)

    def subscribe(self) -> None:
        """JobRemoved reaches us only if we ask: on the bus a match rule plus the manager's Subscribe (it sends
        job signals only while someone is subscribed); on the private socket Subscribe alone."""
        if self.on_bus:
            rule = MatchRule(type="signal", sender="org.freedesktop.systemd1", interface=MANAGER_IFACE,
                             member="JobRemoved", path="/org/freedesktop/systemd1")
            self.call("D-Bus AddMatch", message_bus.AddMatch(rule))
        self.call("systemd Subscribe", new_method_call(MANAGER, "Subscribe"))

    # --- the manager's methods ----------------------------------------------------------------------------
    def version(self) -> int:
        """systemd's version number ("252.30-1~deb12u2" -> 252); 0 if it cannot be read."""
        if self._version is None:
            (variant,) = self.call("systemd Version", new_method_call(PROPERTIES, "Get", "ss",
                                                                      (MANAGER_IFACE, "Version")))
            text = str(variant[1]) if isinstance(variant, tuple) else str(variant)
            digits = ""
            for ch in text:
                if not ch.isdigit():
                    break
                digits += ch
            self._version = int(digits) if digits else 0
        return self._version

    def start_transient_unit(self, name: str, properties: list[Any]) -> None:
        """StartTransientUnit(name, "replace", properties, no aux units), then waits for its job. A leftover
        failed unit of the same name is reset and the start retried once, as runc does."""
        what = f"start systemd unit {name}"
        msg = new_method_call(MANAGER, "StartTransientUnit", "ssa(sv)a(sa(sv))", (name, "replace", properties, []))
        try:
            (job,) = self.call(what, msg)
        except DBusError as e:
            if e.name != UNIT_EXISTS:
                raise
            self.reset_failed_unit(name)
            msg = new_method_call(MANAGER, "StartTransientUnit", "ssa(sv)a(sa(sv))",
                                  (name, "replace", properties, []))
            (job,) = self.call(what, msg)
        result = self.wait_job(job, what)
        if result != "done":
            self.reset_failed_unit(name)
            raise SetupError(f"{what}: systemd's job finished with result {result!r}")
        log.debug("systemd unit %s started", name)

    def stop_unit(self, name: str) -> None:
        """StopUnit(name, "replace") and waits for the job; a unit that is already gone is not an error."""
        what = f"stop systemd unit {name}"
        try:
            (job,) = self.call(what, new_method_call(MANAGER, "StopUnit", "ss", (name, "replace")))
        except DBusError as e:
            if e.name not in (NO_SUCH_UNIT, LOAD_FAILED):
                raise
            return
        result = self.wait_job(job, what)
        if result != "done":
            log.warning("%s: systemd's job finished with result %r", what, result)
        self.reset_failed_unit(name)

    def set_unit_properties(self, name: str, properties: list[Any]) -> None:
        """SetUnitProperties(name, runtime=true, properties): changes a running unit (not persisted)."""
        self.call(f"set properties of systemd unit {name}",
                  new_method_call(MANAGER, "SetUnitProperties", "sba(sv)", (name, True, properties)))

    def reset_failed_unit(self, name: str) -> None:
        try:
            self.call(f"reset failed systemd unit {name}",
                      new_method_call(MANAGER, "ResetFailedUnit", "s", (name,)))
        except DBusError as e:
            if e.name not in (NO_SUCH_UNIT, LOAD_FAILED):
                log.debug("%s", e)
