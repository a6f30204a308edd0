"""The one D-Bus connection of the systemd cgroup driver: org.freedesktop.systemd1.Manager calls and job waits.

Owns connecting (the system bus, $DBUS_SYSTEM_BUS_ADDRESS honoured, else systemd's private peer-to-peer socket
/run/systemd/private, root only), subscribing to the manager's JobRemoved signal, and StartTransientUnit /
StopUnit / SetUnitProperties / ResetFailedUnit with a wait for each job. Must not decide unit names or
properties (systemd.py does) nor speak the wire format (runtime/linux/dbus.py does). Imported only when the
systemd driver is used.

The client is husk's own (runtime/linux/dbus.py): jeepney cost ~20 ms of imports (logging, typing, socket,
enum) on every `husk create/delete/update --systemd-cgroup`; jeepney stays the tests' reference.
"""
from __future__ import annotations

import os
import time

from runtime import logutil
from runtime.errors import SetupError, describe
from runtime.linux import dbus
from runtime.linux.dbus import DBusError  # noqa: F401 - callers catch systemd_dbus.DBusError

TYPE_CHECKING = False  # typing costs ~2 ms to import; annotations are strings here
if TYPE_CHECKING:
    from typing import Any

log = logutil.Logger(__name__)

SYSTEM_BUS = "unix:path=/run/dbus/system_bus_socket"
PRIVATE_SOCKET = "/run/systemd/private"
SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER_IFACE = "org.freedesktop.systemd1.Manager"
MANAGER = (SYSTEMD, MANAGER_PATH, MANAGER_IFACE)                      # destination, path, interface
PROPERTIES = (SYSTEMD, MANAGER_PATH, "org.freedesktop.DBus.Properties")
CALL_TIMEOUT = 25.0   # s for a method reply (D-Bus's default)
JOB_TIMEOUT = 30.0    # s for a job to finish, as runc waits
UNIT_EXISTS = "org.freedesktop.systemd1.UnitExists"
NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"
LOAD_FAILED = "org.freedesktop.systemd1.LoadFailed"


def _method(target: tuple[str, str, str], member: str, signature: str = "", body: tuple = ()) -> dbus.Message:
    return dbus.method_call(target[0], target[1], target[2], member, signature, body)


def connect(timeout: float = 5.0) -> "Client":
    """The system bus (subscribed to JobRemoved), or, when it cannot be reached or does not answer, systemd's
    private socket. A malformed $DBUS_SYSTEM_BUS_ADDRESS is an error, not a reason to fall back."""
    address = os.environ.get("DBUS_SYSTEM_BUS_ADDRESS") or SYSTEM_BUS
    try:
        conn = dbus.open_bus(address, timeout)
    except OSError as bus_err:      # refused, missing, closed or silent (TimeoutError is an OSError)
        if not os.path.exists(PRIVATE_SOCKET):
            raise SetupError(f"systemd cgroup driver: connect to the system bus {address}: {describe(bus_err)}; "
                             f"and there is no {PRIVATE_SOCKET}") from None
        try:
            conn = dbus.open_peer(PRIVATE_SOCKET, timeout)
        except OSError as e:
            raise SetupError(f"systemd cgroup driver: connect to the system bus {address}: {describe(bus_err)}; "
                             f"connect to {PRIVATE_SOCKET}: {describe(e)}") from None
        log.debug("systemd: no system bus (%s), using %s", describe(bus_err), PRIVATE_SOCKET)
        client = Client(conn, on_bus=False)
    else:
        client = Client(conn, on_bus=True)
    try:
        client.subscribe()
    except BaseException:
        client.close()
        raise
    return client


class Client:
    """Blocking calls on systemd's manager. Every JobRemoved signal seen while waiting for anything is kept,
    so a job that finishes before its caller starts waiting is not missed."""

    def __init__(self, conn: dbus.Connection, on_bus: bool) -> None:
        self.conn = conn
        self.on_bus = on_bus
        self._jobs: dict[str, str] = {}     # job path -> result, from JobRemoved
        self._version: int | None = None

    def close(self) -> None:
        self.conn.close()

    # --- the wire -----------------------------------------------------------------------------------------
    def call(self, what: str, msg: dbus.Message, timeout: float = CALL_TIMEOUT) -> tuple[Any, ...]:
        deadline = time.monotonic() + timeout
        try:
            reply = self.conn.call(msg, deadline)
        except TimeoutError:
            raise SetupError(f"{what}: systemd did not answer within {timeout:.0f} s") from None
        except (OSError, dbus.DBusProtocolError) as e:
            raise SetupError(f"{what}: D-Bus connection to systemd: {describe(e)}") from None
        if reply.type == dbus.ERROR:
            raise DBusError(what, reply.error_name or "", dbus.error_text(reply))
        return reply.body

    def wait_job(self, job: str, what: str, timeout: float = JOB_TIMEOUT) -> str:
        """The result of `job` ("done", "failed", "timeout", "canceled", "dependency", "skipped")."""
        deadline = time.monotonic() + timeout
        while job not in self._jobs:
            try:
                msg = self.conn.receive(deadline)
            except TimeoutError:
                raise SetupError(f"{what}: systemd's job {job} did not finish within {timeout:.0f} s") from None
            except (OSError, dbus.DBusProtocolError) as e:
                raise SetupError(f"{what}: D-Bus connection to systemd: {describe(e)}") from None
            if (msg.type == dbus.SIGNAL and msg.member == "JobRemoved" and msg.interface == MANAGER_IFACE
                    and msg.signature == "uoss"):
                _id, path, _unit, result = msg.body
                self._jobs[path] = result
        return self._jobs.pop(job)

    def subscribe(self) -> None:
        """JobRemoved reaches us only if we ask: on the bus a match rule plus the manager's Subscribe (it sends
        job signals only while someone is subscribed); on the private socket Subscribe alone."""
        if self.on_bus:
            rule = dbus.match_rule(type="signal", sender=SYSTEMD, interface=MANAGER_IFACE, member="JobRemoved",
                                   path=MANAGER_PATH)
            self.call("D-Bus AddMatch", dbus.add_match(rule))
        self.call("systemd Subscribe", _method(MANAGER, "Subscribe"))

    # --- the manager's methods ----------------------------------------------------------------------------
    def version(self) -> int:
        """systemd's version number ("252.30-1~deb12u2" -> 252); 0 if it cannot be read."""
        if self._version is None:
            (variant,) = self.call("systemd Version", _method(PROPERTIES, "Get", "ss",
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
        msg = _method(MANAGER, "StartTransientUnit", "ssa(sv)a(sa(sv))", (name, "replace", properties, []))
        try:
            (job,) = self.call(what, msg)
        except DBusError as e:
            if e.name != UNIT_EXISTS:
                raise
            self.reset_failed_unit(name)
            msg = _method(MANAGER, "StartTransientUnit", "ssa(sv)a(sa(sv))",
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
            (job,) = self.call(what, _method(MANAGER, "StopUnit", "ss", (name, "replace")))
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
                  _method(MANAGER, "SetUnitProperties", "sba(sv)", (name, True, properties)))

    def reset_failed_unit(self, name: str) -> None:
        try:
            self.call(f"reset failed systemd unit {name}",
                      _method(MANAGER, "ResetFailedUnit", "s", (name,)))
        except DBusError as e:
            if e.name not in (NO_SUCH_UNIT, LOAD_FAILED):
                log.debug("%s", e)
