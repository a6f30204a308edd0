"""The start-up trace: each step of a sandbox's or container's creation with its start, duration and error.

A `Trace` records steps as context managers (`with tr.step("cni.add"): ...`), nested by the steps still open;
the finished trace is kept in the record's `extra["trace"]` (JSON) so it survives a restart and read-only tools
(`husk-cri trace ID`) see it; a failed creation's is kept in the store's meta table. Every finished step goes to
every observer (`add_observer`, the metrics use it) and a step slower than `slow_step_seconds` logs a warning
naming the pod and the step. Also: the runtime's stage timings (runtime/stages.py) as nested steps, the waterfall,
and `husk-cri trace` (through offline.py's read-only store access). The recorder itself does no I/O.

Step names are stable (they are metric label values); the table is in cri_server/README.md.
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

log = logging.getLogger(__name__)

Observer = Callable[[str, str, float, bool], None]

_observers: list[Observer] = []

KEY = "trace"        # the key in the record's extra and in the verbose info map


def add_observer(fn: Observer) -> None:
    """fn(kind, step name, seconds, failed) is called for every finished step ("sandbox" or "container")."""
    _observers.append(fn)


def remove_observer(fn: Observer) -> None:
    with contextlib.suppress(ValueError):
        _observers.remove(fn)


@dataclass
class Step:
    name: str
    start: int                 # wall clock, nanoseconds since the epoch
    duration: int = 0          # nanoseconds
    error: str = ""
    parent: int = -1           # index of the enclosing step in Trace.steps, -1 for a top-level step

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "start": self.start, "duration": self.duration}
        if self.error:
            d["error"] = self.error
        if self.parent >= 0:
            d["parent"] = self.parent
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Step":
        return cls(name=str(d["name"]), start=int(d["start"]), duration=int(d.get("duration", 0)),
                   error=str(d.get("error", "")), parent=int(d.get("parent", -1)))


class Trace:
    """The steps of one creation. Used from one task at a time (an RPC handler), so a stack gives the nesting."""

    def __init__(self, kind: str, object_id: str, pod: str = "", slow_step_seconds: float = 2.0) -> None:
        self.kind = kind               # "sandbox" | "container"
        self.object_id = object_id
        self.pod = pod                 # "namespace/name", for the slow-step warning
        self.slow_step_seconds = slow_step_seconds   # [trace] slow_step_seconds; 0: no warning
        self.steps: list[Step] = []
        self._open: list[int] = []

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[Step]:
        """Times the block; an exception leaving it is kept as the step's error and re-raised."""
        st = Step(name, time.time_ns(), parent=self._open[-1] if self._open else -1)
        idx = len(self.steps)
        self.steps.append(st)
        self._open.append(idx)
        t0 = time.perf_counter_ns()
        try:
            yield st
        except BaseException as e:
            if not st.error:
                st.error = _describe(e)
            raise
        finally:
            st.duration = time.perf_counter_ns() - t0
            self._open.pop()
            self._finished(st)

    def add(self, name: str, start: int, duration: int, error: str = "", parent: int | None = None) -> Step:
        """A step timed elsewhere (the runtime's stages); nested under the open step unless `parent` is given."""
        if parent is None:
            parent = self._open[-1] if self._open else -1
        st = Step(name, int(start), max(0, int(duration)), error, parent)
        self.steps.append(st)
        self._finished(st)
        return st

    def _finished(self, st: Step) -> None:
        seconds = st.duration / 1e9
        failed = bool(st.error)
        for fn in list(_observers):
            try:
                fn(self.kind, st.name, seconds, failed)
            except Exception:  # noqa: BLE001 -- an observer must never break the RPC
                log.exception("trace observer failed", extra={"id": self.object_id, "step": st.name})
        if 0 < self.slow_step_seconds <= seconds:
            log.warning("slow %s step %s: %.3f s (pod %s, id %s)", self.kind, st.name, seconds,
                        self.pod or "?", self.object_id,
                        extra={"id": self.object_id, "pod": self.pod, "step": st.name, "seconds": round(seconds, 3)})

    @property
    def failed(self) -> bool:
        return any(s.error for s in self.steps)

    def failed_with(self, e: BaseException) -> None:
        """Keeps `e` in the trace when no step holds an error yet (a failure between steps), as step "error"."""
        if not self.failed:
            self.add("error", time.time_ns(), 0, _describe(e), parent=-1)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.object_id, "pod": self.pod, "steps": [s.to_json() for s in self.steps]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Trace":
        tr = cls(str(d.get("kind", "")), str(d.get("id", "")), str(d.get("pod", "")))
        tr.steps = [Step.from_json(s) for s in d.get("steps", ())]
        return tr


def resume(extra: Any, kind: str, object_id: str, pod: str, slow_step_seconds: float) -> Trace:
    """The record's trace, to add later steps to (StartContainer); a new one for a record that has none."""
    tr = of_record(extra) or Trace(kind, object_id)
    tr.kind, tr.object_id, tr.pod, tr.slow_step_seconds = kind, object_id, pod, slow_step_seconds
    return tr


def with_trace(extra: Any, tr: Trace) -> dict[str, Any]:
    """`extra` with the trace in it, for the record's next write."""
    return {**extra, KEY: tr.to_json()}


def _describe(e: BaseException) -> str:
    msg = getattr(e, "message", None) or str(e)
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def of_record(extra: Any) -> Trace | None:
    """The trace kept in a record's extra, or None (records made before traces existed)."""
    d = extra.get(KEY) if hasattr(extra, "get") else None
    if not d:
        return None
    try:
        return Trace.from_json(d)
    except (KeyError, TypeError, ValueError) as e:
        log.warning("unreadable start-up trace: %s", e)
        return None


# --- failed creations --------------------------------------------------------------------------
# A failed RunPodSandbox or CreateContainer leaves no record: its trace is kept in the store's meta table
# under "failed_trace:<finish ns>:<id>" (the newest KEEP_FAILED only), where `husk-cri trace` finds it.
FAILED_PREFIX = "failed_trace:"
KEEP_FAILED = 50


def save_failed(store: Any, tr: "Trace") -> None:
    """Keeps the trace of a creation that failed; never raises (the RPC's own error matters more)."""
    import sqlite3
    try:
        store.set_meta(f"{FAILED_PREFIX}{time.time_ns():020d}:{tr.object_id}", json.dumps(tr.to_json()))
        keys = store.meta_keys(FAILED_PREFIX)
        for k in keys[:max(len(keys) - KEEP_FAILED, 0)]:
            store.delete_meta(k)
    except (sqlite3.Error, OSError) as e:
        log.warning("keep the trace of a failed creation: %s", e, extra={"id": tr.object_id})


def failed_id(key: str) -> str:
    return key.rsplit(":", 1)[-1]


# --- the runtime's stages -----------------------------------------------------------------------
def request_runtime_stages(bundle: str) -> None:
    """Asks the runtime of the next create in `bundle` for its stage timings (runtime/stages.py)."""
    from runtime import stages
    try:
        stages.request(bundle)
    except OSError as e:
        log.warning("ask for the runtime's stage timings in %s: %s", bundle, e)


def add_runtime_stages(tr: "Trace", bundle: str) -> None:
    """The runtime's stages of the create that just ran in `bundle`, as steps "runtime.<stage>" nested under
    the open step; none with a binary runtime that does not write them (runc)."""
    from runtime import stages
    for name, start, duration in stages.read(bundle):
        tr.add(f"runtime.{name}", start, duration)


# --- the waterfall -----------------------------------------------------------------------------
def _depth(steps: Sequence[Step], i: int) -> int:
    d, p = 0, steps[i].parent
    while 0 <= p < len(steps) and d < 32:
        d, p = d + 1, steps[p].parent
    return d


def _fmt_ms(ns: int) -> str:
    ms = ns / 1e6
    return f"{ms:.1f}ms" if ms < 1000 else f"{ms / 1000:.2f}s"


def waterfall(tr: Trace, width: int | None = None) -> str:
    """One line per step: name indented by nesting, start offset, duration, a bar scaled to `width` columns."""
    if width is None:
        width = shutil.get_terminal_size((100, 24)).columns
    steps = tr.steps
    if not steps:
        return "(no steps recorded)\n"
    t0 = min(s.start for s in steps)
    end = max(s.start + s.duration for s in steps)
    total = max(end - t0, 1)
    names = ["  " * _depth(steps, i) + s.name for i, s in enumerate(steps)]
    name_w = min(max(len(n) for n in names), 40)
    prefix_w = name_w + 1 + 9 + 1 + 9 + 1
    bar_w = max(width - prefix_w - 2, 10)
    lines = [f"{'step':<{name_w}} {'start':>9} {'duration':>9} |total {_fmt_ms(total)}"]
    for s, n in zip(steps, names):
        off = s.start - t0
        a = min(int(off * bar_w / total), bar_w - 1)
        b = max(a + 1, min(int((off + s.duration) * bar_w / total), bar_w))
        bar = " " * a + ("X" if s.error else "#") * (b - a)
        lines.append(f"{n[:name_w]:<{name_w}} {'+' + _fmt_ms(off):>9} {_fmt_ms(s.duration):>9} |{bar}")
        if s.error:
            lines.append(f"{'':<{name_w}}   error: {s.error}")
    return "\n".join(lines) + "\n"


# --- `husk-cri trace` (read-only, cri_server/offline.py's store access) ------------------------------------------
def read_failed(db_path: str) -> list[tuple[int, Trace]]:
    """The kept traces of failed creations, oldest first, as (finish ns, trace)."""
    import sqlite3
    from cri_server import offline
    db = offline.open_store_readonly(db_path)
    try:
        rows = db.execute("SELECT key, value FROM meta WHERE substr(key, 1, ?) = ? ORDER BY key",
                          (len(FAILED_PREFIX), FAILED_PREFIX)).fetchall()
    except sqlite3.Error as e:
        raise offline.OfflineError(f"{db_path}: cannot read: {e}") from None
    finally:
        db.close()
    out = []
    for key, value in rows:
        try:
            out.append((int(key[len(FAILED_PREFIX):].split(":", 1)[0]), Trace.from_json(json.loads(value))))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def find(db_path: str, id_or_prefix: str) -> Trace:
    """The trace of the sandbox or container `id_or_prefix` (a unique prefix), else of a failed creation."""
    from cri_server import offline
    snap = offline.read_records(db_path)
    try:
        r = offline.resolve(snap, id_or_prefix)
    except offline.OfflineError as e:
        failed = [t for _, t in read_failed(db_path) if id_or_prefix and t.object_id.startswith(id_or_prefix)]
        if len({t.object_id for t in failed}) == 1:
            return failed[-1]
        raise e from None
    tr = of_record(r.extra)
    if tr is None:
        raise offline.OfflineError(f"{r.id[:13]} has no start-up trace (created before husk-cri recorded them)")
    return tr


def cmd_trace(config: Any, out: Any, id_or_prefix: str, failed: bool = False, width: int = 0) -> int:
    """`husk-cri trace ID` prints the waterfall; `--failed` lists the kept traces of failed creations."""
    if failed:
        for ns, t in read_failed(config.db_path):
            bad = next((s for s in reversed(t.steps) if s.error), None)   # the innermost failed step
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))
            out.write(f"{when} {t.kind:<9} {t.object_id[:13]} {t.pod or '-'} "
                      f"{bad.name if bad else '?'}: {bad.error if bad else ''}\n")
        return 0
    tr = find(config.db_path, id_or_prefix)
    out.write(f"{tr.kind} {tr.object_id} {tr.pod}{'  (failed)' if tr.failed else ''}\n")
    out.write(waterfall(tr, width or None))
    return 0
