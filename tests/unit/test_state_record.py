"""The state record's cgroup hierarchies: recorded by create on v1, read back by the other verbs (so they need
not parse /proc/self/mountinfo), and absent from records written before they existed."""
from __future__ import annotations

from runtime import state as st
from runtime.cgroups.v1 import V1Manager

HIER = {"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids", "unified": "/sys/fs/cgroup/unified"}


def _record(**kw) -> st.Record:
    return st.Record(id="c1", pid=1, pid_start=2, bundle="/b", rootfs="/b/rootfs", created="now",
                     cgroup_path="/husk/c1", config={}, **kw)


def test_cgroup_hierarchies_survive_save_and_load(tmp_path) -> None:
    d = tmp_path / "c1"
    d.mkdir()
    st.save(str(d), _record(cgroup_hier=HIER))
    rec = st.load(str(tmp_path), "c1")
    assert rec.cgroup_hier == HIER
    mgr = st.cgroup_manager(rec)
    assert isinstance(mgr, V1Manager) and mgr.hier == HIER   # no mount table read
    assert mgr.dir("memory") == "/sys/fs/cgroup/memory/husk/c1"


def test_a_record_without_them_loads_and_finds_its_manager_as_before(tmp_path) -> None:
    d = _record().to_dict()
    del d["cgroup_hier"]   # what an older husk wrote
    rec = st.Record.from_dict(d)
    assert rec.cgroup_hier == {}
    mgr = st.cgroup_manager(rec)
    assert mgr.path == "/husk/c1"


def test_the_cgroup2_mount_survives_and_spares_the_detection(tmp_path, monkeypatch) -> None:
    import runtime.cgroups as cgroups
    import runtime.mountinfo as mountinfo
    from runtime.cgroups.v2 import V2Manager

    def forbidden(*a, **kw):
        raise AssertionError("the hierarchy was detected again instead of read from the record")
    d = tmp_path / "c1"
    d.mkdir()
    st.save(str(d), _record(cgroup2_mount="/run/cg2"))
    rec = st.load(str(tmp_path), "c1")
    assert rec.cgroup2_mount == "/run/cg2"
    monkeypatch.setattr(cgroups, "is_unified", forbidden)
    monkeypatch.setattr(cgroups, "manager_for", forbidden)
    monkeypatch.setattr(mountinfo, "mount_at", forbidden)
    mgr = st.cgroup_manager(rec)
    assert isinstance(mgr, V2Manager) and mgr.dir == "/run/cg2/husk/c1"


def test_an_older_record_has_no_cgroup2_mount() -> None:
    d = _record().to_dict()
    del d["cgroup2_mount"]
    assert st.Record.from_dict(d).cgroup2_mount == ""
