"""The one D-Bus connection of the systemd cgroup driver: org.freedesktop.systemd1.Manager calls and job waits.

Owns connecting (the system bus, $DBUS_SYSTEM_BUS_ADDRESS honoured, else systemd's private peer-to-peer socket
/run/systemd/private, root only), subscribing to the manager's JobRemoved signal, and StartTransientUnit /
StopUnit / SetUnitProperties / ResetFailedUnit with a wait for each job, believing replies and JobRemoved
signals only from systemd (on the bus: from the unique name the bus says owns org.freedesktop.systemd1; the
bus's own error replies count too). Must not decide unit names or properties (systemd.py does) nor speak the
wire format (runtime/linux/dbus.py does). Imported only when the systemd driver is used.

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
_LOGGED_IGNORED = 5   # forged JobRemoved signals logged per client: anyone on the bus can send a flood of them


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
    """Blocking calls on systemd's manager. A JobRemoved is believed only from systemd (see _from_systemd) and
    only for a job this client started; one that arrives before its caller starts waiting is kept (while a call
    waits for its reply, the connection holds back systemd's JobRemoved broadcasts and drops other signals)."""

    def __init__(self, conn: dbus.Connection, on_bus: bool) -> None:
        self.conn = conn
        self.on_bus = on_bus
        self.systemd_name: str | None = None    # systemd's unique name on the bus, as the bus says (subscribe)
        self._jobs: dict[str, str] = {}         # job path -> result ("" while it runs)
        self._version: int | None = None
        self._ignored = 0                       # JobRemoved signals not from systemd (forgeries)

    def close(self) -> None:
        self.conn.close()

    # --- the wire -----------------------------------------------------------------------------------------
    def _reply_from(self, msg: dbus.Message) -> tuple[str, ...] | None:
        """Whose reply counts: on the private socket the peer's (systemd itself); on the bus the bus's own for its
        calls, and for systemd's systemd's (the name the bus gave, see subscribe) or the bus's: the bus answers in
        systemd's stead when it cannot deliver the call or its reply (ServiceUnknown, NoReply, LimitsExceeded,
        ...), and only the bus can send as org.freedesktop.DBus."""
        if not self.on_bus:
            return None
        if msg.destination == dbus.BUS_NAME or self.systemd_name is None:
            return (dbus.BUS_NAME,)
        return (self.systemd_name, dbus.BUS_NAME)

    def call(self, what: str, msg: dbus.Message, timeout: float = CALL_TIMEOUT) -> tuple[Any, ...]:
        if self.on_bus and msg.destination != dbus.BUS_NAME and self.systemd_name is None:
            raise SetupError(f"{what}: systemd's unique name on the bus is not known (subscribe() asks the bus)")
        deadline = time.monotonic() + timeout
        try:
            reply = self.conn.call(msg, deadline, self._reply_from(msg), keep=self._from_systemd)
        except TimeoutError:
            raise SetupError(f"{what}: systemd did not answer within {timeout:.0f} s") from None
        except dbus.UndecodableMessage as e:
            raise SetupError(f"{what}: the reply cannot be read: {e}") from None
        except (OSError, dbus.DBusProtocolError) as e:
            raise SetupError(f"{what}: D-Bus connection to systemd: {describe(e)}") from None
        if reply.type == dbus.ERROR:
            raise DBusError(what, reply.error_name or "", dbus.error_text(reply))
        return reply.body

    def _from_systemd(self, msg: dbus.Message) -> bool:
        """A JobRemoved broadcast by systemd's manager. Match rules only filter broadcasts: any local process can
        unicast a signal to our connection (it then has a DESTINATION), and only the bus-set SENDER tells who
        broadcast it (systemd_name, from the bus). On the private socket the peer is systemd itself."""
        if (msg.type != dbus.SIGNAL or msg.member != "JobRemoved" or msg.interface != MANAGER_IFACE
                or msg.path != MANAGER_PATH or msg.signature != "uoss"):
            return False
        if msg.destination is not None or (self.on_bus and (self.systemd_name is None
                                                            or msg.sender != self.systemd_name)):
            self._ignored += 1
            if self._ignored <= _LOGGED_IGNORED:
                log.debug("systemd: ignoring a JobRemoved from %s to %s: not systemd's broadcast%s", msg.sender,
                          msg.destination, " (further ones are not logged)" if self._ignored == _LOGGED_IGNORED
                          else "")
            return False
        return True

    def wait_job(self, job: str, what: str, timeout: float = JOB_TIMEOUT) -> str:
        """The result of `job` ("done", "failed", "timeout", "canceled", "dependency", "skipped")."""
        self._jobs.setdefault(job, "")
        deadline = time.monotonic() + timeout
        while not self._jobs[job]:
            try:
                msg = self.conn.receive(deadline)
            except TimeoutError:
                raise SetupError(f"{what}: systemd's job {job} did not finish within {timeout:.0f} s") from None
            except (OSError, dbus.DBusProtocolError) as e:
                raise SetupError(f"{what}: D-Bus connection to systemd: {describe(e)}") from None
            if self._from_systemd(msg):
                _id, path, _unit, result = msg.body
                if path in self._jobs:          # not other clients' jobs: nothing piles up
                    self._jobs[path] = result or "?"
        return self._jobs.pop(job)

    def subscribe(self) -> None:
        """On the bus, first asks the bus (only its reply counts) who owns org.freedesktop.systemd1: the one
        sender whose replies and JobRemoved signals count from then on. A reply from systemd would not do: on a
        permissive bus anyone can send us a reply to the serial of our next call, and become "systemd".
        JobRemoved reaches us only if we ask: on the bus a match rule plus the manager's Subscribe (it sends job
        signals only while someone is subscribed); on the private socket (the peer is systemd) Subscribe alone."""
        if self.on_bus:
            body = self.call(f"D-Bus GetNameOwner {SYSTEMD}", dbus.method_call(
                dbus.BUS_NAME, dbus.BUS_PATH, dbus.BUS_NAME, "GetNameOwner", "s", (SYSTEMD,)))
            owner = body[0] if len(body) == 1 else body
            if not isinstance(owner, str) or owner[:1] != ":" or not dbus.valid_bus_name(owner):
                raise SetupError(f"D-Bus GetNameOwner {SYSTEMD}: the bus answered {owner!r}, not a unique name")
            self.systemd_name = owner
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
