"""runc's exec flag rules (execflags.py): the container's process as the template, what each flag changes."""
from __future__ import annotations

import json

import pytest

from runtime import execflags
from runtime.errors import HuskError

TEMPLATE = {
    "terminal": True, "user": {"uid": 5, "gid": 6, "additionalGids": [7]}, "args": ["sleep", "1"],
    "env": ["PATH=/bin", "A=1"], "cwd": "/home", "capabilities": {"bounding": ["CAP_KILL"], "effective": ["CAP_KILL"],
                                                                 "permitted": ["CAP_KILL"]},
    "rlimits": [{"type": "RLIMIT_NOFILE", "soft": 10, "hard": 20}], "noNewPrivileges": False,
    "apparmorProfile": "base", "oomScoreAdj": 3,
}


def test_template_is_kept_and_not_modified() -> None:
    before = json.dumps(TEMPLATE, sort_keys=True)
    p = execflags.from_flags(TEMPLATE, ["id"])
    assert json.dumps(TEMPLATE, sort_keys=True) == before
    assert p["args"] == ["id"]
    assert p["terminal"] is False  # an exec never inherits the container's terminal
    assert p["user"] == {"uid": 5, "gid": 6, "additionalGids": [7]}
    assert p["cwd"] == "/home" and p["env"] == ["PATH=/bin", "A=1"]
    assert p["rlimits"] == TEMPLATE["rlimits"] and p["apparmorProfile"] == "base" and p["oomScoreAdj"] == 3


def test_user_keeps_the_template_gid_unless_given() -> None:
    assert execflags.from_flags(TEMPLATE, ["id"], user="1000")["user"]["gid"] == 6
    u = execflags.from_flags(TEMPLATE, ["id"], user="1000:0")["user"]
    assert (u["uid"], u["gid"]) == (1000, 0)


@pytest.mark.parametrize("bad", ["x", "1:y", "-1", "1:2:3", ""])
def test_bad_user(bad: str) -> None:
    if bad == "":
        assert execflags.from_flags(TEMPLATE, ["id"], user=bad)["user"]["uid"] == 5  # empty: unchanged, as runc
        return
    with pytest.raises(HuskError, match="--user"):
        execflags.from_flags(TEMPLATE, ["id"], user=bad)


def test_additional_gids_append_and_must_be_positive() -> None:
    assert execflags.from_flags(TEMPLATE, ["id"], additional_gids=(8, 9))["user"]["additionalGids"] == [7, 8, 9]
    with pytest.raises(HuskError, match="positive"):
        execflags.from_flags(TEMPLATE, ["id"], additional_gids=(-1,))


def test_cap_goes_to_four_sets_never_inheritable() -> None:
    caps = execflags.from_flags(TEMPLATE, ["id"], caps=("CAP_SYS_ADMIN",))["capabilities"]
    for kind in ("bounding", "effective", "permitted", "ambient"):
        assert "CAP_SYS_ADMIN" in caps[kind]
    assert "CAP_SYS_ADMIN" not in caps.get("inheritable", [])  # CVE-2022-29162


def test_env_cwd_tty_nnp_apparmor() -> None:
    p = execflags.from_flags(TEMPLATE, ["id"], env=("A=2", "B=3"), cwd="/tmp", tty=True, no_new_privs=True,
                             apparmor="other")
    assert p["env"] == ["PATH=/bin", "A=1", "A=2", "B=3"]
    assert p["cwd"] == "/tmp" and p["terminal"] is True and p["noNewPrivileges"] is True
    assert p["apparmorProfile"] == "other"


def test_validation() -> None:
    with pytest.raises(HuskError, match="give a command"):
        execflags.from_flags(TEMPLATE, [])
    with pytest.raises(HuskError, match="absolute"):
        execflags.from_flags(TEMPLATE, ["id"], cwd="tmp")
    with pytest.raises(HuskError, match="SELinux"):
        execflags.from_flags(TEMPLATE, ["id"], process_label="system_u:system_r:container_t:s0")


def test_process_file(tmp_path) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"args": ["true"], "cwd": "/"}))
    assert execflags.load_process_file(str(f))["args"] == ["true"]
    f.write_text("[1]")
    with pytest.raises(HuskError, match="JSON object"):
        execflags.load_process_file(str(f))
    f.write_text("{")
    with pytest.raises(HuskError, match="invalid JSON"):
        execflags.load_process_file(str(f))
    with pytest.raises(HuskError, match="No such file"):
        execflags.load_process_file(str(tmp_path / "missing"))


def test_sub_cgroups() -> None:
    assert execflags.sub_cgroups(()) == {}
    assert execflags.sub_cgroups(("sub",)) == {"": "sub"}
    assert execflags.sub_cgroups(("cpu,cpuacct:a", "memory:b")) == {"cpu": "a", "cpuacct": "a", "memory": "b"}
    for bad in (("a", "b"), ("a:b:c",), (":x",), ("memory:a", "memory:b")):
        with pytest.raises(HuskError, match="--cgroup"):
            execflags.sub_cgroups(bad)


def test_join_sub_stays_below_the_container() -> None:
    assert execflags.join_sub("/k/c1", "x/y") == "/k/c1/x/y"
    assert execflags.join_sub("/k/c1", "/x") == "/k/c1/x"
    for bad in ("..", "../c10", "x/../../c1x"):
        with pytest.raises(HuskError, match="not a sub-cgroup"):
            execflags.join_sub("/k/c1", bad)
