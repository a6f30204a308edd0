"""`husk-cri pods|ps|inspect|logs` (cri_server/offline.py): the read-only store, shim probes, crictl's tables,
CRI log parsing and following, and the commands through the click CLI."""
from __future__ import annotations

import json
import os
import socket
import sqlite3

import pytest
from click.testing import CliRunner

from cri_server import offline
from cri_server.api.v1 import api_pb2 as pb
from cri_server.cli import main
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState
from cri_server.store.store import Store, sandbox_name
from shim import exitfile

NOW = 1_700_000_000 * 10**9


def sandbox(i: str, **kw) -> SandboxRecord:
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name=f"pod{i}", namespace="ns", uid=f"uid{i}"))
    base = dict(id=i * 64, name=sandbox_name(f"pod{i}", "ns", f"uid{i}", 0), pod_name=f"pod{i}", pod_uid=f"uid{i}",
                pod_namespace="ns", attempt=0, state=SandboxState.READY, created_at=NOW - 5 * 10**9,
                config=cfg.SerializeToString())
    base.update(kw)
    return SandboxRecord(**base)


def container(i: str, sb: str, **kw) -> ContainerRecord:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=f"c{i}"), command=["sleep", "1"])
    base = dict(id=i * 64, sandbox_id=sb, name=f"c{i}_{sb}", container_name=f"c{i}", attempt=1,
                state=ContainerState.RUNNING, created_at=NOW - 120 * 10**9, image="docker.io/library/busybox:latest",
                labels={offline.POD_NAME_LABEL: "poda"}, config=cfg.SerializeToString())
    base.update(kw)
    return ContainerRecord(**base)


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "root" / "metadata.db")
    s = Store(path)
    s.put_sandbox(sandbox("a"))
    s.put_container(container("b", "a" * 64))
    s.put_container(container("c", "a" * 64, state=ContainerState.EXITED, exit_code=3, created_at=NOW - 10**9))
    s.close()
    return path


# --- the store ------------------------------------------------------------------------------------------------
def test_missing_database_is_an_error_and_nothing_is_created(tmp_path):
    with pytest.raises(offline.OfflineError, match="no metadata database"):
        offline.open_store_readonly(str(tmp_path / "metadata.db"))
    assert os.listdir(tmp_path) == []


def test_reading_a_closed_store_creates_no_file(db):
    before = sorted(os.listdir(os.path.dirname(db)))
    assert before == ["metadata.db"]            # husk-cri stopped cleanly: no -wal, no -shm
    snap = offline.read_records(db)
    assert [s.id for s in snap.sandboxes] == ["a" * 64]
    assert sorted(c.id for c in snap.containers) == ["b" * 64, "c" * 64]
    assert sorted(os.listdir(os.path.dirname(db))) == before     # mode=ro alone would make -wal and -shm


def test_a_husk_cri_starting_during_an_immutable_read_makes_it_read_again(db, monkeypatch):
    """Opened `immutable` (no writer), then husk-cri opens the file mid-read: the first read failed
    (an immutable reader takes no lock and may see a torn write); the read is redone as a WAL reader."""
    real = offline.records_from_connection
    calls = []

    def racing(conn):
        calls.append(1)
        if len(calls) == 1:
            writer = Store(db)          # husk-cri starting: its -wal and -shm appear
            racing.writer = writer
            raise sqlite3.DatabaseError("database disk image is malformed")
        return real(conn)

    monkeypatch.setattr(offline, "records_from_connection", racing)
    try:
        snap = offline.read_records(db)
    finally:
        racing.writer.close()
    assert len(calls) == 2 and [s.id for s in snap.sandboxes] == ["a" * 64]


def test_records_read_equal_what_the_store_holds(db):
    snap = offline.read_records(db)
    assert sorted(os.listdir(os.path.dirname(db))) == ["metadata.db"]
    s = Store(db)
    try:
        assert {c.id: c for c in snap.containers} == {c.id: c for c in s.list_containers()}
        assert snap.sandboxes == s.list_sandboxes()
    finally:
        s.close()


def test_the_reader_never_writes(db):
    conn = offline.open_store_readonly(db)
    try:
        with pytest.raises(sqlite3.Error):
            conn.execute("DELETE FROM containers")
    finally:
        conn.close()
    assert len(offline.read_records(db).containers) == 2


def test_a_writer_holding_the_store_neither_blocks_nor_is_blocked(db):
    """husk-cri in the middle of a transaction (or stopped there): the reader sees the last commit at once, and
    an open reader does not keep the writer from committing."""
    writer = Store(db)
    try:
        cur = writer._db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        cur.execute("DELETE FROM containers")
        snap = offline.read_records(db, timeout=0.5)      # a busy wait would fail with "database is locked"
        assert len(snap.containers) == 2
        cur.execute("ROLLBACK")
        reader = offline.open_store_readonly(db)
        try:
            reader.execute("BEGIN")
            assert reader.execute("SELECT count(*) FROM sandboxes").fetchone()[0] == 1
            writer._db.execute("PRAGMA busy_timeout=100")
            writer.put_sandbox(sandbox("d"))                 # would raise "database is locked" if blocked
            assert reader.execute("SELECT count(*) FROM sandboxes").fetchone()[0] == 1   # its snapshot
            reader.execute("COMMIT")
        finally:
            reader.close()
        assert len(offline.read_records(db).sandboxes) == 2
    finally:
        writer.close()


def test_columns_unknown_to_this_version_keep_their_defaults(tmp_path):
    path = str(tmp_path / "metadata.db")
    s = Store(path)
    s.put_sandbox(sandbox("a"))
    s.close()
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE sandboxes DROP COLUMN pod_dir")    # an older store without a column
    conn.execute("ALTER TABLE sandboxes ADD COLUMN future TEXT")  # a newer one with an extra column
    conn.commit()
    conn.close()
    (r,) = offline.read_records(path).sandboxes
    assert r.pod_dir == "" and r.pod_name == "poda"


def test_resolve_by_id_and_unique_prefix():
    snap = offline.Snapshot("x", [sandbox("a")], [container("ab", "a" * 64, id="ab" + "0" * 62)])
    assert offline.resolve(snap, "a" * 64).id == "a" * 64
    assert offline.resolve(snap, "ab").id.startswith("ab0")
    assert offline.resolve(snap, "aa").id == "a" * 64
    with pytest.raises(offline.OfflineError, match="ambiguous"):
        offline.resolve(snap, "a")
    with pytest.raises(offline.OfflineError, match="no container or pod sandbox"):
        offline.resolve(snap, "f")
    with pytest.raises(offline.OfflineError, match="empty"):
        offline.resolve(snap, "")


# --- shims ----------------------------------------------------------------------------------------------------
def test_a_gone_shim_is_read_from_its_exit_file(tmp_path):
    d = offline.shim_dir(str(tmp_path), "x" * 64)
    os.makedirs(d)
    addr = "unix://" + os.path.join(d, "shim.sock")
    assert offline.probe(str(tmp_path), "x" * 64, addr, 0.5).source == "unreachable"
    exitfile.write(d, "", exitfile.ExitRecord(42, 3, NOW, False))
    live = offline.probe(str(tmp_path), "x" * 64, addr, 0.5)
    assert (live.source, live.status, live.exit_code, live.exited_at) == ("exit-file", "STOPPED", 3, NOW)
    r = offline.live_container(container("x", "a" * 64), live)
    assert (r.state, r.exit_code, r.finished_at, r.reason) == (ContainerState.EXITED, 3, NOW, "Error")


def test_a_hung_shim_costs_one_timeout(tmp_path):
    path = str(tmp_path / "hung.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(8)                   # accepts connections (backlog) and never answers: a SIGSTOPped shim
    try:
        lives = offline.probe_all(str(tmp_path), [container(i, "a" * 64, shim_address=f"unix://{path}")
                                                  for i in "xyz"], timeout=0.2)
    finally:
        srv.close()
    assert {v.source for v in lives.values()} == {"unreachable"}
    assert all(v.hung and "no answer" in v.error for v in lives.values())
    r = offline.live_container(container("x", "a" * 64), lives["x" * 64])
    assert r.state == ContainerState.UNKNOWN
    assert offline.live_sandbox(sandbox("a"), lives["x" * 64]).state == SandboxState.NOTREADY


def test_live_state_from_the_shim_overrides_the_record():
    c = container("x", "a" * 64, state=ContainerState.CREATED)
    assert offline.live_container(c, offline.Live("shim", "RUNNING", pid=7)).state == ContainerState.RUNNING
    assert offline.live_container(c, offline.Live("shim", "RUNNING", pid=7)).pid == 7
    done = offline.live_container(c, offline.Live("shim", "STOPPED", exit_code=0, exited_at=5))
    assert (done.state, done.reason, done.finished_at) == (ContainerState.EXITED, "Completed", 5)
    assert offline.live_container(c, offline.Live("store")) is c
    assert offline.live_sandbox(sandbox("a"), offline.Live("shim", "RUNNING")).state == SandboxState.READY
    assert offline.live_sandbox(sandbox("a"), offline.Live("shim", "STOPPED")).state == SandboxState.NOTREADY


def test_an_exit_husk_cri_read_but_did_not_record_is_shown():
    # husk-cri was killed after the task's Delete (the shim dropped it and its exit file), before recording it.
    from cri_server.tasks import PENDING_EXIT
    c = container("x", "a" * 64, extra={PENDING_EXIT: {"code": 137, "at": NOW, "oom": False, "message": ""}})
    for live in (offline.Live("unreachable", error="task not found"), offline.Live("exit-file", "STOPPED")):
        r = offline.live_container(c, live)
        assert (r.state, r.exit_code, r.finished_at, r.reason) == (ContainerState.EXITED, 137, NOW, "Error")
    assert offline.live_container(c, offline.Live("shim", "RUNNING", pid=7)).state == ContainerState.RUNNING


# --- tables ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seconds,text", [(0.5, "Less than a second"), (1, "1 second"), (59, "59 seconds"),
                                          (61, "About a minute"), (3599, "59 minutes"), (3600, "About an hour"),
                                          (5 * 3600, "5 hours"), (3 * 86400, "3 days"), (20 * 86400, "2 weeks"),
                                          (90 * 86400, "3 months"), (800 * 86400, "2 years")])
def test_human_duration_as_go_units(seconds, text):
    assert offline.human_duration(seconds) == text


def test_pods_table_as_crictl_prints_it():
    out = offline.pods_table([sandbox("a"), sandbox("b", created_at=NOW - 10**9, runtime_handler="runc",
                                                    state=SandboxState.NOTREADY),
                              sandbox("c", state=SandboxState.CREATING)], NOW)
    cols = [20] * 6     # every cell is shorter than tabwriter's minwidth
    assert out.splitlines() == [_row(cols, "POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT", "RUNTIME"),
                                _row(cols, "b" * 13, "1 second ago", "NotReady", "podb", "ns", "0", "runc"),
                                _row(cols, "a" * 13, "5 seconds ago", "Ready", "poda", "ns", "0", "(default)")]


def _row(widths: list[int], *cells: str) -> str:
    return "".join(c + " " * (w - len(c)) for c, w in zip(cells, widths)) + cells[-1]


def test_ps_table_shows_running_containers_unless_all():
    cs = [container("b", "a" * 64), container("c", "a" * 64, state=ContainerState.EXITED, created_at=NOW - 10**9,
                                               image="sha256:" + "e" * 64, labels={}),
          container("d", "a" * 64, extra={"creating": True})]
    cols = [20, len("docker.io/library/busybox:latest") + 3, 20, 20, 20, 20, 20, 20]   # widest cell + padding 3
    assert offline.ps_table(cs, NOW).splitlines() == [
        _row(cols, "CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID", "POD", "NAMESPACE"),
        _row(cols, "b" * 13, "docker.io/library/busybox:latest", "2 minutes ago", "Running", "cb", "1", "a" * 13,
             "poda", "unknown")]
    rows = offline.ps_table(cs, NOW, all_states=True).splitlines()
    assert rows[1].split()[:4] == ["ccccccccccccc", "eeeeeeeeeeeee", "1", "second"]
    assert rows[1].split()[-2:] == ["unknown", "unknown"] and "Exited" in rows[1]
    assert len(rows) == 3


def test_inspect_has_crictl_status_and_info():
    snap = offline.Snapshot("/x/metadata.db", [sandbox("a")], [])
    c = container("b", "a" * 64, pid=9, log_path="/l/b.log", extra={"bundle": "/nonexistent/b", "trace": {"t": 1}})
    doc = offline.inspect_doc(snap, c, offline.Live("shim", "STOPPED", exit_code=2, exited_at=NOW))
    assert doc["status"]["state"] == "CONTAINER_EXITED" and doc["status"]["exitCode"] == 2
    assert doc["status"]["finishedAt"] == offline.rfc3339(NOW) == "2023-11-14T22:13:20Z"
    assert doc["status"]["startedAt"] == "0001-01-01T00:00:00Z" and doc["status"]["user"] is None
    assert doc["status"]["logPath"] == "/l/b.log" and doc["status"]["metadata"] == {"name": "cb", "attempt": 1}
    assert doc["info"]["config"]["command"] == ["sleep", "1"]
    assert doc["info"]["runtimeSpecPath"] == "/nonexistent/b/config.json" and doc["info"]["runtimeSpec"] is None
    assert doc["trace"] == {"t": 1} and "trace" not in doc["info"] and doc["info"]["live"]["source"] == "shim"
    assert doc["readDirectly"] == "/x/metadata.db"
    sdoc = offline.inspect_doc(snap, sandbox("a"), offline.Live("store"))
    assert sdoc["status"]["state"] == "SANDBOX_READY" and sdoc["info"]["config"]["metadata"]["name"] == "poda"


# --- logs -----------------------------------------------------------------------------------------------------
def test_cri_log_lines_parse_and_partials_join():
    ll = offline.LogLines()
    out = list(ll.feed(b"2024-01-01T00:00:00.000000000Z stdout F hello world\n"
                       b"2024-01-01T00:00:00.1Z stderr P part1 \n2024-01-01T00:00:00.2Z stdout P x"))
    assert out == [("stdout", b"hello world\n")]
    out = list(ll.feed(b"y\nnot a log line\n2024-01-01T00:00:00.3Z stderr F part2\n"
                       b"2024-01-01T00:00:00.4Z stdout F \n"))
    assert out == [("stderr", b"part1 part2\n"), ("stdout", b"xy\n")]
    assert offline.parse_cri_line(b"t stdout F") == offline.LogRecord("stdout", False, b"")
    assert offline.parse_cri_line(b"t stdout P:x a") == offline.LogRecord("stdout", True, b"a")
    assert offline.parse_cri_line(b"t stdin F a") is None
    ll.feed(b"")
    list(ll.feed(b"t stdout P end\n"))
    assert list(ll.flush()) == [("stdout", b"end")]


def test_rfc3339_as_go_prints_it():
    assert offline.rfc3339(1_700_000_000_120_000_000) == "2023-11-14T22:13:20.12Z"
    assert offline.rfc3339(1_700_000_000_000_000_001) == "2023-11-14T22:13:20.000000001Z"


def test_tail():
    lines = [("stdout", b"%d\n" % i) for i in range(5)]
    assert offline.tail(lines, 2) == lines[3:]
    assert offline.tail(lines, -1) == lines
    assert offline.tail(lines, 0) == []


def test_follow_reads_across_rotation(tmp_path):
    path = str(tmp_path / "c.log")
    with open(path, "wb") as f:
        f.write(b"t stdout F a\n")
    fl = offline.LogFollower(path)
    assert list(fl.existing()) == [("stdout", b"a\n")]
    with open(path, "ab") as f:
        f.write(b"t stdout F b\nt stdout P half-\nt stdout F cut")   # written just before kubelet renames it
    os.rename(path, path + ".20240101-000000")
    with open(path, "wb") as f:                        # the shim's reopened file
        f.write(b"t stdout F c\nt stderr P tail")
    calls = []
    got = list(fl.follow(lambda: calls.append(1) and False, poll=0.01, check_every=0.02))
    fl.close()
    assert got == [("stdout", b"b\n"), ("stdout", b"half-cut\n"), ("stdout", b"c\n"), ("stderr", b"tail")]
    assert calls == [1]


def test_logs_of_a_missing_file_says_which(tmp_path):
    fl = offline.LogFollower(str(tmp_path / "none.log"))
    with pytest.raises(offline.OfflineError, match="none.log: the container's log file does not exist"):
        list(fl.existing())


# --- the commands ---------------------------------------------------------------------------------------------
def _run(db: str, tmp_path, *args: str):
    root = os.path.dirname(db)
    return CliRunner().invoke(main, ["--root", root, "--state", str(tmp_path / "state"), *args])


def test_commands_say_they_read_directly(db, tmp_path):
    res = _run(db, tmp_path, "ps", "-a")
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith(f"# read directly from {db} ")
    assert "(husk-cri not asked)" in res.stderr.splitlines()[0]
    assert res.stdout.splitlines()[0].startswith("CONTAINER ")
    assert {line.split()[0] for line in res.stdout.splitlines()[1:]} == {"b" * 13, "c" * 13}
    res = _run(db, tmp_path, "pods")
    assert res.exit_code == 0 and res.stdout.splitlines()[1].startswith("a" * 13)
    res = _run(db, tmp_path, "inspect", "bbb")
    assert res.exit_code == 0 and json.loads(res.stdout)["status"]["id"] == "b" * 64
    res = _run(db, tmp_path, "inspect", "nope")
    assert res.exit_code == 1 and "no container or pod sandbox" in res.stderr
    assert sorted(os.listdir(os.path.dirname(db))) == ["metadata.db"]


def test_logs_command_prints_the_streams_and_tail(db, tmp_path):
    log_path = tmp_path / "b.log"
    log_path.write_bytes(b"t stdout F one\nt stderr F err\nt stdout F two\nt stdout F three\n")
    s = Store(db)
    s.put_container(container("e", "a" * 64, log_path=str(log_path), state=ContainerState.EXITED))
    s.close()
    res = _run(db, tmp_path, "logs", "eee")
    assert res.exit_code == 0, res.output
    assert res.stdout == "one\ntwo\nthree\n" and res.stderr.endswith("err\n")
    res = _run(db, tmp_path, "logs", "--tail", "2", "-f", "eee")     # exited: -f ends at once
    assert res.exit_code == 0 and res.stdout == "two\nthree\n"
    res = _run(db, tmp_path, "logs", "aaa")
    assert res.exit_code == 1 and "is a pod sandbox" in res.stderr
