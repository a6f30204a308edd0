"""Inspection without husk-cri: `husk-cri pods|ps|inspect|logs` read the metadata store read-only and ask each shim.

Safe whether husk-cri runs, is stopped or hangs: the store is opened as a read-only SQLite reader (never written,
no file created, no lock a writer waits on; held only while the records are read), and every shim gets one State
call with a short timeout, so a hung shim costs that timeout and nothing more. Columns and JSON follow crictl's.
Every command says on stderr that it read the state directly (stdout stays machine-readable).

`open_store_readonly` and `read_records` are the public read-only store access (other offline tools use them).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sqlite3
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterable, Iterator

from cri_server.store import sqlitedb
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState
from cri_server.store.store import records_from_connection

log = logging.getLogger(__name__)

SHIM_TIMEOUT = 1.0          # seconds one shim gets to answer State
STORE_TIMEOUT = 2.0         # SQLite busy timeout of the reader (a WAL reader normally never waits)
TRUNCATED_ID_LEN = 13       # crictl's truncatedIDLen
POD_NAME_LABEL = "io.kubernetes.pod.name"            # crictl ps's POD and NAMESPACE come from these labels
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"


class OfflineError(Exception):
    """The store cannot be read or an id does not name one object; the message says which and why."""


# --- the store, read-only -----------------------------------------------------------------------------------
def open_store_readonly(db_path: str, timeout: float = STORE_TIMEOUT) -> sqlite3.Connection:
    """A read-only connection to husk-cri's metadata database at `db_path` (`Config.db_path`).

    Never writes and never creates a file: a missing database is an OfflineError, not an empty one. While
    husk-cri has the database open (its `-wal` and `-shm` exist) this is an ordinary WAL reader (`mode=ro`): it
    sees the last committed state and blocks no writer. When they are absent (husk-cri stopped cleanly, the WAL
    checkpointed into the file) SQLite would create them even for `mode=ro`, so the file is opened `immutable`
    instead (no locks, no side files). Close the connection as soon as the rows are read: an open read
    transaction keeps husk-cri's checkpoints from going past it.
    """
    if not os.path.isfile(db_path):
        raise OfflineError(f"{db_path}: no metadata database here (wrong --root or --config?)")
    if not os.access(db_path, os.R_OK):
        raise OfflineError(f"{db_path}: not readable (run as root)")
    try:
        db = sqlitedb.open_readonly(db_path, busy_timeout=timeout)
    except (sqlite3.Error, FileNotFoundError) as e:
        raise OfflineError(f"{db_path}: cannot open read-only: {e}") from None
    return db


@dataclass(frozen=True)
class Snapshot:
    """The records of one consistent read of the store."""
    db_path: str
    sandboxes: list[SandboxRecord]
    containers: list[ContainerRecord]

    def sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        return next((s for s in self.sandboxes if s.id == sandbox_id), None)


def read_records(db_path: str, timeout: float = STORE_TIMEOUT) -> Snapshot:
    """Every sandbox and container record, read in one read transaction (open_store_readonly's rules).

    A file opened `immutable` (husk-cri was not running) is read again as an ordinary WAL reader if husk-cri
    opened it meanwhile (its `-wal` appeared): an immutable reader takes no lock and could see a torn write.
    """
    for attempt in (1, 2):
        was_in_use = sqlitedb.in_use(db_path)
        db = open_store_readonly(db_path, timeout)
        try:
            db.execute("BEGIN")
            recs = records_from_connection(db)     # columns a newer or older husk-cri lacks keep their default
            db.execute("COMMIT")
        except sqlite3.Error as e:
            if attempt == 1 and not was_in_use and sqlitedb.in_use(db_path):
                continue
            raise OfflineError(f"{db_path}: cannot read: {e}") from None
        finally:
            db.close()
        if attempt == 1 and not was_in_use and sqlitedb.in_use(db_path):
            continue
        return Snapshot(db_path, recs.sandboxes, recs.containers)
    raise OfflineError(f"{db_path}: husk-cri started while the store was read; try again")


def resolve(snap: Snapshot, id_or_prefix: str) -> SandboxRecord | ContainerRecord:
    """The container or sandbox whose id is `id_or_prefix` or starts with it; OfflineError when none or several."""
    if not id_or_prefix:
        raise OfflineError("an id must not be empty")
    every: list[SandboxRecord | ContainerRecord] = [*snap.containers, *snap.sandboxes]
    exact = [r for r in every if r.id == id_or_prefix]
    if exact:
        return exact[0]
    matches = [r for r in every if r.id.startswith(id_or_prefix)]
    if not matches:
        raise OfflineError(f"no container or pod sandbox has an id starting with {id_or_prefix!r}")
    if len(matches) > 1:
        raise OfflineError(f"id prefix {id_or_prefix!r} is ambiguous: "
                           f"{', '.join(r.id[:TRUNCATED_ID_LEN] for r in matches)}")
    return matches[0]


# --- live state from the shims --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Live:
    """What the shim (or, once it is gone, its exit file) says about one task. `source`: shim, exit-file,
    store (husk-cri already recorded the end and stopped the shim) or unreachable."""
    source: str
    status: str = ""                # the shim's task status: CREATED, RUNNING, STOPPED, PAUSED...
    pid: int = 0
    exit_code: int = 0
    exited_at: int = 0              # ns
    error: str = ""
    hung: bool = False              # the shim's socket accepted but it did not answer in time

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v not in ("", 0) or k == "source"}


def shim_dir(state_dir: str, object_id: str) -> str:
    from cri_server.shims import SHIMS_DIR
    return os.path.join(state_dir, SHIMS_DIR, object_id)


def probe(state_dir: str, object_id: str, address: str, timeout: float = SHIM_TIMEOUT) -> Live:
    """One State call to the shim of `object_id`; its exit file when it does not answer."""
    if not address:
        return Live("store")
    from shim import exitfile
    from shim import ttrpc_wire as w
    from shim.client import call_task_once
    from shim.pb.task_types import Status
    try:
        resp = call_task_once(address, "State", timeout=timeout, id=object_id)
    except (OSError, ConnectionError, w.TtrpcError) as e:
        why = "no answer in %.1fs (hung?)" % timeout if isinstance(e, TimeoutError) else str(e)
        rec = exitfile.read(shim_dir(state_dir, object_id))
        if rec is not None:
            return Live("exit-file", "STOPPED", rec.pid, rec.exit_status, rec.exited_at_ns, f"shim gone: {why}")
        return Live("unreachable", error=f"shim at {address}: {why}", hung=isinstance(e, TimeoutError))
    exited = resp.exited_at
    at = exited.seconds * 1_000_000_000 + exited.nanos if exited is not None else 0
    return Live("shim", Status.NAMES.get(resp.status, str(resp.status)), resp.pid, resp.exit_status, at)


def probe_all(state_dir: str, objects: Iterable[SandboxRecord | ContainerRecord],
              timeout: float = SHIM_TIMEOUT) -> dict[str, Live]:
    """probe() of every object at once: the whole costs one timeout however many shims hang."""
    todo = list(objects)
    if not todo:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(todo))) as pool:
        futures = {r.id: pool.submit(probe, state_dir, r.id, r.shim_address, timeout) for r in todo}
        return {oid: f.result() for oid, f in futures.items()}


def live_container(r: ContainerRecord, live: Live) -> ContainerRecord:
    """The record as husk-cri would report it had it seen what the shim says."""
    if live.source == "store":
        return r
    from cri_server.tasks import pending_exit
    pending = pending_exit(r)
    if pending is not None and live.source != "shim":
        # husk-cri read the exit and was stopped before recording it (its Delete may have removed the task and
        # the shim's exit file): what it will record at its next start.
        return dataclasses.replace(r, state=ContainerState.EXITED, exit_code=pending.exit_code,
                                   finished_at=pending.exited_at, reason=r.reason or pending.reason)
    if live.source == "unreachable":
        return dataclasses.replace(r, state=ContainerState.UNKNOWN if r.state == ContainerState.RUNNING else r.state)
    if live.status == "STOPPED":
        if r.state == ContainerState.EXITED:
            return r
        return dataclasses.replace(r, state=ContainerState.EXITED, exit_code=live.exit_code,
                                   finished_at=live.exited_at or r.finished_at,
                                   reason=r.reason or ("Completed" if live.exit_code == 0 else "Error"))
    if live.status in ("RUNNING", "PAUSED", "PAUSING"):
        return dataclasses.replace(r, state=ContainerState.RUNNING, pid=live.pid or r.pid)
    if live.status == "CREATED":
        return dataclasses.replace(r, state=ContainerState.CREATED)
    return dataclasses.replace(r, state=ContainerState.UNKNOWN)


def live_sandbox(r: SandboxRecord, live: Live) -> SandboxRecord:
    if live.source in ("store",) or r.state != SandboxState.READY:
        return r
    if live.source == "shim" and live.status in ("RUNNING", "PAUSED", "PAUSING"):
        return r
    return dataclasses.replace(r, state=SandboxState.NOTREADY)


# --- tables as crictl prints them -----------------------------------------------------------------------------
def human_duration(seconds: float) -> str:
    """docker/go-units HumanDuration, which crictl's CREATED column uses."""
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    minutes = s // 60
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = round(seconds / 3600)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{int(seconds / 3600) // 24 // 365} years"


def created(ns: int, now_ns: int) -> str:
    return human_duration((now_ns - ns) / 1e9) + " ago"


def truncate_id(object_id: str, prefix: str = "") -> str:
    """crictl's getTruncatedID: the prefix (e.g. "sha256:") dropped, then 13 characters."""
    if prefix and object_id.startswith(prefix):
        object_id = object_id[len(prefix):]
    return object_id[:TRUNCATED_ID_LEN]


def table(header: list[str], rows: list[list[str]]) -> str:
    """Go's tabwriter as crictl sets it up (minwidth 20, padding 3, spaces); the last column is not padded."""
    widths = [max(20, max(len(r[i]) for r in [header, *rows]) + 3) for i in range(len(header) - 1)]
    lines = []
    for r in [header, *rows]:
        lines.append("".join(c.ljust(w) for c, w in zip(r, widths)) + r[-1])
    return "\n".join(lines) + "\n"


POD_STATES = {SandboxState.READY: "Ready", SandboxState.NOTREADY: "NotReady", SandboxState.CREATING: "NotReady"}
CONTAINER_STATES = {ContainerState.CREATED: "Created", ContainerState.RUNNING: "Running",
                    ContainerState.EXITED: "Exited", ContainerState.UNKNOWN: "Unknown"}


def pods_table(sandboxes: list[SandboxRecord], now_ns: int) -> str:
    """`crictl pods`: every listed sandbox (Ready and NotReady), newest first."""
    rows = [[truncate_id(s.id), created(s.created_at, now_ns), POD_STATES[s.state], s.pod_name, s.pod_namespace,
             str(s.attempt), s.runtime_handler or "(default)"]
            for s in sorted(listed_sandboxes(sandboxes), key=lambda s: -s.created_at)]
    return table(["POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT", "RUNTIME"], rows)


def _image_column(image: str) -> str:
    algo, sep, hexpart = image.partition(":")
    if sep and algo in ("sha256", "sha512") and hexpart and all(c in "0123456789abcdef" for c in hexpart):
        return truncate_id(image, algo + ":")
    return image


def ps_table(containers: list[ContainerRecord], now_ns: int, all_states: bool = False) -> str:
    """`crictl ps [-a]` (1.36's columns): running containers (every one with -a), newest first."""
    shown = [c for c in listed_containers(containers) if all_states or c.state == ContainerState.RUNNING]
    rows = [[truncate_id(c.id), _image_column(c.image), created(c.created_at, now_ns), CONTAINER_STATES[c.state],
             c.container_name, str(c.attempt), truncate_id(c.sandbox_id), c.labels.get(POD_NAME_LABEL, "unknown"),
             c.labels.get(POD_NAMESPACE_LABEL, "unknown")]
            for c in sorted(shown, key=lambda c: -c.created_at)]
    return table(["CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID", "POD", "NAMESPACE"], rows)


def listed_sandboxes(sandboxes: Iterable[SandboxRecord]) -> list[SandboxRecord]:
    """What ListPodSandbox lists: not the ones still being created."""
    return [s for s in sandboxes if s.state != SandboxState.CREATING]


def listed_containers(containers: Iterable[ContainerRecord]) -> list[ContainerRecord]:
    return [c for c in containers if not c.extra.get("creating")]


# --- inspect ------------------------------------------------------------------------------------------------
def _message_json(msg: Any, times: tuple[str, ...] = ()) -> Any:
    """protojson with every field (crictl's EmitUnpopulated: unset messages are null); the `times` (ns since the
    epoch) as RFC 3339 text, as crictl's inspect shows them."""
    from google.protobuf import json_format
    doc = json.loads(json_format.MessageToJson(msg, always_print_fields_with_no_presence=True))
    for f in msg.DESCRIPTOR.fields:
        if f.json_name not in doc:      # only unset singular messages are left out (lists and maps print empty)
            doc[f.json_name] = None
    for key in times:
        doc[key] = rfc3339(int(doc.get(key) or 0))
    return doc


def rfc3339(ns: int) -> str:
    """Go's time.Format(RFC3339Nano) in UTC; 0 is Go's zero time, as crictl prints an unset time."""
    if not ns:
        return "0001-01-01T00:00:00Z"
    sec, frac = divmod(ns, 1_000_000_000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
    return text + (f".{frac:09d}".rstrip("0") if frac else "") + "Z"


def _spec(bundle: str) -> Any:
    if not bundle:
        return None
    try:
        with open(os.path.join(bundle, "config.json"), "rb") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def inspect_doc(snap: Snapshot, r: SandboxRecord | ContainerRecord, live: Live,
                default_stop_signal: str = "SIGTERM") -> dict[str, Any]:
    """`crictl inspect` / `inspectp`'s document: {"status": <CRI status>, "info": {...}} plus what was read how."""
    from cri_server.api.v1 import api_pb2 as pb
    bundle = str(r.extra.get("bundle", ""))
    if isinstance(r, ContainerRecord):
        from cri_server.rpc.container_status import to_status
        shown = live_container(r, live)
        status = _message_json(to_status(shown, default_stop_signal), ("createdAt", "startedAt", "finishedAt"))
        info: dict[str, Any] = {"pid": shown.pid, "sandboxID": r.sandbox_id, "shimAddress": r.shim_address,
                                **dict(r.extra)}
        config = pb.ContainerConfig.FromString(r.config) if r.config else None
        kind = "container"
    else:
        from cri_server.rpc.sandbox_status import to_status as sandbox_status
        sb = live_sandbox(r, live)
        status = _message_json(sandbox_status(sb), ("createdAt",))
        info = {"pid": r.pid, "netnsPath": r.netns_path, "shimAddress": r.shim_address,
                "cgroupParent": r.cgroup_parent, "podDir": r.pod_dir, "state": sb.state.value, **dict(r.extra)}
        config = pb.PodSandboxConfig.FromString(r.config) if r.config else None
        kind = "podSandbox"
    info["config"] = _message_json(config) if config is not None else None
    if bundle:
        info["runtimeSpecPath"] = os.path.join(bundle, "config.json")
        info["runtimeSpec"] = _spec(bundle)
    info["live"] = live.to_json()
    doc = {"status": status, "info": info, "kind": kind, "readDirectly": snap.db_path}
    trace = getattr(r, "trace", None) or info.pop("trace", None)
    if trace:       # the start-up trace: a key of its own in verbose status, so at the top as crictl shows it
        doc["trace"] = trace if not isinstance(trace, (bytes, str)) else _maybe_json(trace)
    return doc


def _maybe_json(v: bytes | str) -> Any:
    try:
        return json.loads(v)
    except ValueError:
        return v.decode(errors="replace") if isinstance(v, bytes) else v


# --- logs ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LogRecord:
    stream: str         # stdout or stderr
    partial: bool       # P: the line goes on in the next record
    text: bytes         # without the newline


def parse_cri_line(line: bytes) -> LogRecord | None:
    """`<RFC3339Nano> <stdout|stderr> <P|F> <text>` -> LogRecord; None for a line not in that format."""
    if line.endswith(b"\n"):
        line = line[:-1]
    parts = line.split(b" ", 3)
    if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
        return None
    tag = parts[2]
    if tag not in (b"P", b"F"):     # kubelet's tag may hold more flags after ':'; the first one is P or F
        tag = tag.split(b":", 1)[0]
        if tag not in (b"P", b"F"):
            return None
    return LogRecord(parts[1].decode(), tag == b"P", parts[3] if len(parts) == 4 else b"")


class LogLines:
    """Raw file lines in, (stream, logical line) out: P records are joined with what follows them on their
    stream, as crictl logs prints them. A line the file does not finish yet is kept until it does."""

    def __init__(self) -> None:
        self._raw = b""
        self._partial: dict[str, bytes] = {}

    def feed(self, data: bytes) -> Iterator[tuple[str, bytes]]:
        self._raw += data
        *complete, self._raw = self._raw.split(b"\n")
        for raw in complete:
            rec = parse_cri_line(raw)
            if rec is None:
                if raw:
                    log.debug("not a CRI log line", extra={"line": raw[:80]})
                continue
            text = self._partial.pop(rec.stream, b"") + rec.text
            if rec.partial:
                self._partial[rec.stream] = text
            else:
                yield rec.stream, text + b"\n"

    def end_of_file(self) -> Iterator[tuple[str, bytes]]:
        """The file ends (rotated away): a record it did not finish counts as finished there."""
        if self._raw:
            yield from self.feed(b"\n")

    def flush(self) -> Iterator[tuple[str, bytes]]:
        """Partial lines left at the end (a stream that ended without a newline)."""
        for stream, text in self._partial.items():
            yield stream, text
        self._partial = {}


def tail(lines: Iterable[tuple[str, bytes]], n: int) -> list[tuple[str, bytes]]:
    """The last `n` lines (all with a negative n, as crictl's --tail -1)."""
    return list(lines) if n < 0 else list(deque(lines, maxlen=n)) if n else []


class LogFollower:
    """Reads the log at `path` to its end and, with `follow`, what is appended later, across kubelet's
    rotations (rename away + ReopenContainerLog: the old file is read to its end, then the new one from its
    start). `running()` is asked when nothing new came for a while: following stops once it is false."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines = LogLines()
        self._f: IO[bytes] | None = None
        self._ino: tuple[int, int] | None = None

    def _open(self) -> bool:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return False
        st = os.fstat(f.fileno())
        if self._f is not None:
            self._f.close()
        self._f, self._ino = f, (st.st_dev, st.st_ino)
        return True

    def _read(self) -> Iterator[tuple[str, bytes]]:
        assert self._f is not None
        while chunk := self._f.read(256 << 10):
            yield from self.lines.feed(chunk)

    def _rotated(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) != self._ino

    def existing(self) -> Iterator[tuple[str, bytes]]:
        if not self._open():
            raise OfflineError(f"{self.path}: the container's log file does not exist")
        yield from self._read()

    def follow(self, running: Callable[[], bool], poll: float = 0.2, check_every: float = 1.0
               ) -> Iterator[tuple[str, bytes]]:
        idle_since = time.monotonic()
        while True:
            got = False
            if self._f is not None:
                for item in self._read():
                    got = True
                    yield item
            if self._rotated():
                if self._f is not None:
                    yield from self._read()        # what was written before the rename
                    yield from self.lines.end_of_file()
                self._open()
                continue
            if got:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= check_every:
                if not running():
                    if self._f is not None:
                        yield from self._read()
                    yield from self.lines.end_of_file()
                    yield from self.lines.flush()
                    return
                idle_since = time.monotonic()
            time.sleep(poll)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


# --- the commands (called from cli.py with the effective Config) ---------------------------------------------
def note(db_path: str, state_dir: str, err: IO[str] | None = None) -> None:
    """The line every command prints first, on stderr."""
    print(f"# read directly from {db_path} and the shims in {os.path.join(state_dir, 'shims')} "
          f"(husk-cri not asked)", file=err or sys.stderr, flush=True)


def cmd_pods(config: Any, out: IO[str], timeout: float = SHIM_TIMEOUT) -> int:
    snap = read_records(config.db_path)
    shown = listed_sandboxes(snap.sandboxes)
    lives = probe_all(config.paths.state, shown, timeout)
    _warn_unreachable(lives)
    out.write(pods_table([live_sandbox(s, lives[s.id]) for s in shown], time.time_ns()))
    return 0


def cmd_ps(config: Any, out: IO[str], all_states: bool = False, timeout: float = SHIM_TIMEOUT) -> int:
    snap = read_records(config.db_path)
    shown = listed_containers(snap.containers)
    lives = probe_all(config.paths.state, shown, timeout)
    _warn_unreachable(lives)
    out.write(ps_table([live_container(c, lives[c.id]) for c in shown], time.time_ns(), all_states))
    return 0


def cmd_inspect(config: Any, out: IO[str], ids: list[str], timeout: float = SHIM_TIMEOUT) -> int:
    snap = read_records(config.db_path)
    records = [resolve(snap, i) for i in ids]
    lives = probe_all(config.paths.state, records, timeout)
    docs = [inspect_doc(snap, r, lives[r.id], config.runtime.default_stop_signal) for r in records]
    json.dump(docs[0] if len(docs) == 1 else docs, out, indent=2, sort_keys=True)
    out.write("\n")
    return 0


def cmd_logs(config: Any, out: IO[bytes], err: IO[bytes], container_id: str, follow: bool = False,
             tail_lines: int = -1, timeout: float = SHIM_TIMEOUT) -> int:
    snap = read_records(config.db_path)
    r = resolve(snap, container_id)
    if not isinstance(r, ContainerRecord):
        raise OfflineError(f"{r.id[:TRUNCATED_ID_LEN]} is a pod sandbox; logs are a container's")
    if not r.log_path:
        raise OfflineError(f"container {r.id[:TRUNCATED_ID_LEN]} has no log file (its config sets no log_path)")
    streams = {"stdout": out, "stderr": err}
    follower = LogFollower(r.log_path)
    try:
        lines = list(follower.existing())
        if not follow:
            lines += [*follower.lines.end_of_file(), *follower.lines.flush()]
        for stream, text in tail(lines, tail_lines):
            streams[stream].write(text)
        out.flush()
        err.flush()
        if not follow:
            return 0

        def running() -> bool:
            # The shim writes the log: once it is gone (or says the task stopped) nothing more comes. A shim
            # that hangs may still write, so following goes on.
            live = probe(config.paths.state, r.id, r.shim_address, timeout)
            return live.hung or (live.source == "shim" and live.status != "STOPPED")

        for stream, text in follower.follow(running):
            streams[stream].write(text)
            streams[stream].flush()
        return 0
    finally:
        follower.close()


def _warn_unreachable(lives: dict[str, Live]) -> None:
    for oid, live in sorted(lives.items()):
        if live.source == "unreachable":
            print(f"# {oid[:TRUNCATED_ID_LEN]}: {live.error}; state shown as Unknown/NotReady", file=sys.stderr)
