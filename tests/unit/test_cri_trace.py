"""The start-up trace (cri_server/trace.py): recorder, observers, slow-step warning, persistence, waterfall,
and the runtime's stage file format (runtime/stages.py)."""
from __future__ import annotations

import io
import json
import logging
from types import SimpleNamespace

import pytest

from cri_server import offline, trace
from cri_server.store.records import SandboxRecord, SandboxState
from cri_server.store.store import Store, sandbox_name
from runtime import stages


def test_steps_nest_and_keep_errors() -> None:
    tr = trace.Trace("sandbox", "abc", "ns/p")
    with tr.step("outer"):
        with tr.step("inner"):
            pass
    with pytest.raises(ValueError):
        with tr.step("bad"):
            raise ValueError("no such plugin")
    names = [(s.name, s.parent) for s in tr.steps]
    assert names == [("outer", -1), ("inner", 0), ("bad", -1)]
    assert tr.steps[2].error == "ValueError: no such plugin" and tr.failed
    assert tr.steps[0].start <= tr.steps[1].start and tr.steps[0].duration >= tr.steps[1].duration


def test_failed_with_adds_an_error_step_only_when_no_step_failed() -> None:
    tr = trace.Trace("sandbox", "abc")
    with tr.step("ok"):
        pass
    tr.failed_with(RuntimeError("between steps"))
    assert tr.steps[-1].name == "error" and "between steps" in tr.steps[-1].error
    n = len(tr.steps)
    tr.failed_with(RuntimeError("again"))
    assert len(tr.steps) == n


def test_every_observer_sees_every_step_and_a_broken_one_breaks_nothing(caplog) -> None:
    seen = []

    def broken(*args) -> None:
        raise KeyError("observer bug")

    def good(kind: str, name: str, seconds: float, failed: bool) -> None:
        seen.append((kind, name, failed, seconds >= 0))
    trace.add_observer(broken)
    trace.add_observer(good)
    try:
        tr = trace.Trace("container", "cid")
        with tr.step("spec"):
            pass
        with pytest.raises(OSError):
            with tr.step("rootfs"):
                raise OSError("boom")
        tr.add("runtime.rootfs", 1, 5)
    finally:
        trace.remove_observer(broken)
        trace.remove_observer(good)
    assert seen == [("container", "spec", False, True), ("container", "rootfs", True, True),
                    ("container", "runtime.rootfs", False, True)]
    assert "trace observer failed" in caplog.text


def test_slow_step_warning_names_pod_and_step(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cri_server.trace")
    tr = trace.Trace("sandbox", "sid123", "default/web", slow_step_seconds=1e-9)
    with tr.step("cni"):
        pass
    rec = [r for r in caplog.records if "slow" in r.getMessage()]
    assert rec and "default/web" in rec[0].getMessage() and "cni" in rec[0].getMessage()
    assert rec[0].step == "cni" and rec[0].pod == "default/web"
    caplog.clear()
    quiet = trace.Trace("sandbox", "sid", "default/web", slow_step_seconds=0)
    quiet.add("cni", 0, 10**12)
    assert not [r for r in caplog.records if "slow" in r.getMessage()]


def test_json_round_trip_and_records_without_trace() -> None:
    tr = trace.Trace("container", "cid", "ns/p/c")
    with tr.step("a"):
        tr.add("runtime.namespaces", 10, 20, "")
    back = trace.Trace.from_json(json.loads(json.dumps(tr.to_json())))
    assert [(s.name, s.start, s.duration, s.error, s.parent) for s in back.steps] == \
           [(s.name, s.start, s.duration, s.error, s.parent) for s in tr.steps]
    assert back.pod == "ns/p/c" and back.kind == "container"
    assert trace.of_record({}) is None
    assert trace.of_record({"trace": {"steps": [{"nostart": 1}]}}) is None


def test_resume_continues_a_kept_trace() -> None:
    tr = trace.Trace("container", "cid")
    with tr.step("runtime_create"):
        pass
    extra = trace.with_trace({"bundle": "/b"}, tr)
    later = trace.resume(extra, "container", "cid", "ns/p/c", 2.0)
    with later.step("runtime_start"):
        pass
    assert [s.name for s in later.steps] == ["runtime_create", "runtime_start"]
    assert trace.resume({}, "container", "x", "", 2.0).steps == []


def test_waterfall_scales_indents_and_shows_errors() -> None:
    tr = trace.Trace("sandbox", "sid")
    tr.steps = [trace.Step("cni", 1_000_000_000, 600_000_000),
                trace.Step("cni.add.bridge", 1_000_000_000, 500_000_000, parent=0),
                trace.Step("runtime_create", 1_600_000_000, 400_000_000, error="Internal: exec failed")]
    out = trace.waterfall(tr, width=80)
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines if "error:" not in line)
    assert lines[2].startswith("  cni.add.bridge")
    bar = {line.split()[0]: line.split("|", 1)[1] for line in lines[1:] if "|" in line}
    assert bar["cni"].startswith("#") and len(bar["cni"].strip()) > len(bar["cni.add.bridge"].strip()) - 1
    assert "X" in bar["runtime_create"] and bar["runtime_create"].startswith(" ")   # starts later, failed
    assert "+600.0ms" in out and "error: Internal: exec failed" in out
    assert trace.waterfall(trace.Trace("sandbox", "x"), 80) == "(no steps recorded)\n"


def _sandbox(sid: str, **extra) -> SandboxRecord:
    return SandboxRecord(id=sid, name=sandbox_name("p", "ns", sid, 0), pod_name="p", pod_uid=sid, pod_namespace="ns",
                         attempt=0, state=SandboxState.READY, created_at=1, extra=extra)


def test_trace_survives_reopen_and_is_read_read_only(tmp_path) -> None:
    db = str(tmp_path / "metadata.db")
    tr = trace.Trace("sandbox", "a" * 64, "ns/p")
    with tr.step("image"):
        pass
    s = Store(db)
    s.put_sandbox(_sandbox("a" * 64, runtime="husk", trace=tr.to_json()))
    s.put_sandbox(_sandbox("b" * 64, runtime="husk"))   # as written before traces existed
    s.close()
    s = Store(db)
    assert trace.of_record(s.get_sandbox("a" * 64).extra).steps[0].name == "image"
    s.close()
    assert trace.find(db, "aaaa").steps[0].name == "image"
    with pytest.raises(offline.OfflineError, match="no start-up trace"):
        trace.find(db, "bbbb")
    out = io.StringIO()
    trace.cmd_trace(SimpleNamespace(db_path=db), out, "aaa", width=60)
    assert out.getvalue().startswith("sandbox " + "a" * 64 + " ns/p\n") and "image" in out.getvalue()


def test_failed_traces_are_kept_bounded_and_found_by_prefix(tmp_path, monkeypatch) -> None:
    db = str(tmp_path / "metadata.db")
    monkeypatch.setattr(trace, "KEEP_FAILED", 3)
    s = Store(db)
    for i in range(5):
        tr = trace.Trace("sandbox", f"{i}" * 64, "ns/p")
        try:
            with tr.step("cni"):
                raise RuntimeError(f"plugin {i} failed")
        except RuntimeError:
            pass
        trace.save_failed(s, tr)
    s.close()
    kept = trace.read_failed(db)
    assert [t.object_id[0] for _, t in kept] == ["2", "3", "4"]
    assert trace.find(db, "33").steps[0].error == "RuntimeError: plugin 3 failed"
    with pytest.raises(offline.OfflineError):
        trace.find(db, "00")     # pruned
    out = io.StringIO()
    trace.cmd_trace(SimpleNamespace(db_path=db), out, "", failed=True)
    assert len(out.getvalue().splitlines()) == 3 and "cni: RuntimeError: plugin 4 failed" in out.getvalue()


def test_runtime_stage_file_only_when_requested(tmp_path) -> None:
    got = [("namespaces", 100, 5), ("rootfs", 105, 7)]
    assert stages.decode(stages.encode(got)) == got
    assert stages.decode("") == [] and stages.decode("x:1") == []
    stages.write(str(tmp_path), got)                   # nobody asked: nothing written
    assert not (tmp_path / stages.FILE).exists()
    stages.request(str(tmp_path))
    stages.write(str(tmp_path), got)
    assert stages.read(str(tmp_path)) == got
    stages.request(str(tmp_path))                      # a new request empties it
    assert stages.read(str(tmp_path)) == []
    tr = trace.Trace("sandbox", "sid")
    stages.request(str(tmp_path))
    stages.write(str(tmp_path), got)
    with tr.step("runtime_create"):
        trace.add_runtime_stages(tr, str(tmp_path))
    assert [(s.name, s.parent) for s in tr.steps] == [("runtime_create", -1), ("runtime.namespaces", 0),
                                                      ("runtime.rootfs", 0)]
