"""The per-container state directory under --root: id checks, locking, the persisted record, liveness.

Imports only stdlib modules that are cheap at start-up (no json on the read path: the record is marshal data
with a format version, plus a JSON twin used when the marshal format cannot be read). Creates no process.
"""
from __future__ import annotations

import errno
import fcntl
import marshal
import os
import sys
TYPE_CHECKING = False  # typing costs ~2 ms to import; mypy treats this name as typing's

from runtime.errors import ContainerExists, ContainerNotFound, InvalidContainerId

FORMAT = 1
STATE_FILE = "state.marshal"
STATE_JSON = "state.json"
FIFO = "exec.sock"  # the start socket (runtime/sync.py), in the role of runc's exec.fifo
LEGACY_FIFO = "exec.fifo"  # what a container created by an older husk still waits on (started by opening it)
MAX_ID_LEN = 1024
# The runtime-spec version husk implements (1.2.0: idmapped mounts, timeOffsets, ioPriority, execCPUAffinity; it
# refuses 1.2.1/1.3 additions such as linux.netDevices and linux.memoryPolicy): the ociVersion of its states and
# hook states, of `husk spec` and of the specs husk-cri builds (cri_server/spec/builder.py).
OCI_VERSION = "1.2.0"
# The ociVersion of a spec that uses nothing newer than 1.0.2: what husk-cri writes unless a pod needs a newer
# field (idmapped mounts), so runtimes that refuse 1.2 specs still run its pods (crun 1.8: "unknown version").
OCI_VERSION_BASELINE = "1.0.2"

if TYPE_CHECKING:
    from typing import Any


def validate_id(container_id: str) -> None:
    if not container_id:
        raise InvalidContainerId(container_id, "must not be empty")
    if len(container_id) > MAX_ID_LEN:
        raise InvalidContainerId(container_id, f"longer than {MAX_ID_LEN} characters")
    if container_id in (".", ".."):
        raise InvalidContainerId(container_id, "must not be '.' or '..'")
    for ch in container_id:
        # runc's rule: letters, digits, and _ + - . only; this excludes path separators and NUL
        if not (ch.isascii() and (ch.isalnum() or ch in "_+-.")):
            raise InvalidContainerId(container_id, f"character {ch!r} is not allowed (use A-Z a-z 0-9 _ + - .)")


class Record:
    """What create persists for the other verbs. `config` is the full config.json dict.
    A plain class rather than a dataclass: `dataclasses` imports inspect, too slow for `husk state`."""
    __slots__ = ("id", "pid", "pid_start", "bundle", "rootfs", "created", "cgroup_path", "config", "owner",
                 "annotations", "no_new_keyring", "version", "systemd_unit", "cgroup_hier", "cgroup2_mount")

    def __init__(self, id: str, pid: int, pid_start: int, bundle: str, rootfs: str, created: str,
                 cgroup_path: str, config: "dict[str, Any]", owner: str = "",
                 annotations: "dict[str, str] | None" = None, no_new_keyring: bool = False,
                 version: int = FORMAT, systemd_unit: str = "",
                 cgroup_hier: "dict[str, str] | None" = None, cgroup2_mount: str = "") -> None:
        self.id = id
        self.pid = pid
        self.pid_start = pid_start          # /proc/<pid>/stat starttime: detects pid reuse
        self.bundle = bundle
        self.rootfs = rootfs
        self.created = created              # RFC 3339 with nanoseconds, UTC
        self.cgroup_path = cgroup_path
        self.config = config
        self.owner = owner
        self.annotations = annotations or {}
        self.no_new_keyring = no_new_keyring  # create's --no-new-keyring: exec then keeps its caller's keyring
        self.version = version
        # set: the cgroup is the transient scope `systemd_unit` (husk --systemd-cgroup); cgroup_path is still its
        # cgroupfs path, which every verb but update and delete uses as is
        self.systemd_unit = systemd_unit
        # cgroup v1/hybrid: controller -> mount point of its hierarchy as create found them (runc keeps its
        # cgroup_paths too), so the other verbs need not read /proc/self/mountinfo (ms on a node with many mounts)
        self.cgroup_hier = cgroup_hier or {}
        # cgroup v2: the cgroup2 mount create used, for the same reason (empty in records of older husks: the
        # verbs then detect the hierarchy as before)
        self.cgroup2_mount = cgroup2_mount

    @property
    def cgroup_driver(self) -> str:
        return "systemd" if self.systemd_unit else "cgroupfs"

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "id": self.id, "pid": self.pid, "pid_start": self.pid_start,
                "bundle": self.bundle, "rootfs": self.rootfs, "created": self.created,
                "cgroup_path": self.cgroup_path, "config": self.config, "owner": self.owner,
                "annotations": self.annotations, "no_new_keyring": self.no_new_keyring,
                "systemd_unit": self.systemd_unit, "cgroup_hier": self.cgroup_hier,
                "cgroup2_mount": self.cgroup2_mount}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Record":
        return cls(id=d["id"], pid=d["pid"], pid_start=d["pid_start"], bundle=d["bundle"], rootfs=d["rootfs"],
                   created=d["created"], cgroup_path=d["cgroup_path"], config=d["config"],
                   owner=d.get("owner", ""), annotations=d.get("annotations") or {},
                   no_new_keyring=d.get("no_new_keyring", False), version=d["version"],
                   systemd_unit=d.get("systemd_unit", ""), cgroup_hier=d.get("cgroup_hier"),
                   cgroup2_mount=d.get("cgroup2_mount", ""))


def container_dir(root: str, container_id: str) -> str:
    validate_id(container_id)
    return os.path.join(root, container_id)


class Lock:
    """An exclusive flock on the container's directory, held for the duration of one command."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def acquire(self) -> None:
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ContainerNotFound(os.path.basename(self.path)) from None
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        # the directory may have been removed by the holder we waited for (delete)
        if not os.path.exists(os.path.join(self.path, STATE_FILE)) and not os.path.exists(
                os.path.join(self.path, ".creating")):
            self.release()
            raise ContainerNotFound(os.path.basename(self.path))

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Lock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def create_dir(root: str, container_id: str) -> tuple[str, Lock]:
    """Makes <root>/<id> (ContainerExists if present) and returns it locked, marked as being created."""
    path = container_dir(root, container_id)
    os.makedirs(root, mode=0o711, exist_ok=True)
    try:
        os.mkdir(path, 0o711)
    except FileExistsError:
        raise ContainerExists(container_id) from None
    with open(os.path.join(path, ".creating"), "w"):
        pass
    lock = Lock(path)
    lock.acquire()
    return path, lock


def remove_dir(path: str) -> None:
    """Removes a container's state dir (flat: a few files and the fifo); cheaper than importing shutil."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return
    for name in names:
        try:
            os.unlink(os.path.join(path, name))
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            import shutil
            shutil.rmtree(os.path.join(path, name), ignore_errors=True)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass


def save(path: str, rec: Record) -> None:
    d = rec.to_dict()
    _atomic_write(os.path.join(path, STATE_JSON), dumps_json(d).encode())
    _atomic_write(os.path.join(path, STATE_FILE), marshal.dumps((FORMAT, sys.version_info[:2], d)))
    try:
        os.unlink(os.path.join(path, ".creating"))
    except FileNotFoundError:
        pass


def load(root: str, container_id: str) -> Record:
    path = container_dir(root, container_id)
    try:
        with open(os.path.join(path, STATE_FILE), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ContainerNotFound(container_id) from None
    try:
        fmt, pyver, d = marshal.loads(data)
        if fmt != FORMAT or tuple(pyver) != tuple(sys.version_info[:2]):
            raise ValueError("format")
    except (ValueError, EOFError, TypeError):
        import json  # another Python wrote the marshal file: read the JSON twin
        with open(os.path.join(path, STATE_JSON)) as f:
            d = json.load(f)
    return Record.from_dict(d)


def _atomic_write(path: str, data: bytes) -> None:
    # not durable on purpose: the state lives on tmpfs (/run) and dies with the boot, as runc's does
    from runtime.fsutil import atomic_write   # only create and update write: start/delete/state skip the import
    atomic_write(path, data, mode=0o600, durable=False)


def write_pid_file(path: str, pid: int) -> None:
    """runc's way: a temp file next to the target, then rename, so readers never see a partial pid (runc does
    not fsync it either)."""
    from runtime.fsutil import atomic_write
    atomic_write(os.path.abspath(path), str(pid), mode=0o644, durable=False)


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, starttime) from /proc/<pid>/stat, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as e:
        if e.errno == errno.ESRCH:
            return None
        raise
    rest = data[data.rindex(b")") + 2:].split()
    return rest[0].decode(), int(rest[19])


def init_alive(rec: Record) -> bool:
    """True if the recorded init still exists (same start time: not a reused pid) and is not a zombie."""
    st = proc_stat(rec.pid)
    return st is not None and st[1] == rec.pid_start and st[0] not in ("Z", "X")


def status(root: str, rec: Record) -> str:
    if not init_alive(rec):
        return "stopped"
    cdir = os.path.join(root, rec.id)
    if os.path.exists(os.path.join(cdir, FIFO)) or os.path.exists(os.path.join(cdir, LEGACY_FIFO)):
        return "created"
    if _frozen(rec):
        return "paused"
    return "running"


def cgroup_manager(rec: Record) -> Any:
    """The cgroupfs manager of the container's cgroup (runtime.cgroups.manager_for), on v1 with the hierarchies
    create recorded, on v2 with the cgroup2 mount it recorded (no mount table read either way). Not for update and
    delete of a --systemd-cgroup container (they go through systemd)."""
    if rec.cgroup_hier:
        from runtime.cgroups.v1 import V1Manager
        return V1Manager(rec.cgroup_path, hier=dict(rec.cgroup_hier))
    if rec.cgroup2_mount:
        from runtime.cgroups.v2 import V2Manager
        return V2Manager(rec.cgroup_path, rec.cgroup2_mount)
    from runtime.cgroups import manager_for
    return manager_for(rec.cgroup_path)


def _frozen(rec: Record) -> bool:
    try:
        return cgroup_manager(rec).frozen()
    except OSError:
        return False


def oci_state(root: str, rec: Record) -> dict[str, Any]:
    st = status(root, rec)
    return {"ociVersion": OCI_VERSION, "id": rec.id, "pid": rec.pid if st != "stopped" else 0,
            "status": st, "bundle": rec.bundle, "rootfs": rec.rootfs, "created": rec.created,
            "owner": rec.owner, "annotations": rec.annotations}


def list_ids(root: str) -> list[str]:
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    return [n for n in names if os.path.exists(os.path.join(root, n, STATE_FILE))]


def now_rfc3339() -> str:
    import time
    ns = time.time_ns()
    sec, frac = divmod(ns, 1_000_000_000)
    t = time.gmtime(sec)
    return (f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
            f".{frac:09d}Z")


# --- a small JSON writer: `state` output without importing json (json imports re: ~10 ms) ---------
_ESC = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _str(s: str) -> str:
    out = []
    for ch in s:
        e = _ESC.get(ch)
        if e is not None:
            out.append(e)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def dumps_json(v: Any, indent: int | None = None, _level: int = 0) -> str:
    """JSON text for str/int/float/bool/None/list/dict values; `indent` pretty-prints like json.dumps."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, dict):
        if not v:
            return "{}"
        items = [f"{_str(str(k))}: {dumps_json(x, indent, _level + 1)}" if indent is not None
                 else f"{_str(str(k))}:{dumps_json(x, indent, _level + 1)}" for k, x in v.items()]
        return _join("{", "}", items, indent, _level)
    if isinstance(v, (list, tuple)):
        if not v:
            return "[]"
        return _join("[", "]", [dumps_json(x, indent, _level + 1) for x in v], indent, _level)
    raise TypeError(f"cannot encode {type(v).__name__} as JSON")


def _join(open_: str, close: str, items: list[str], indent: int | None, level: int) -> str:
    if indent is None:
        return open_ + ",".join(items) + close
    pad = " " * (indent * (level + 1))
    return open_ + "\n" + ",\n".join(pad + i for i in items) + "\n" + " " * (indent * level) + close
