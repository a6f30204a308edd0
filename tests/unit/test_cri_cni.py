"""The CNI invoker with fake plugins: chaining, prevResult, capabilities, env, errors, teardown, cache."""
from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from cri_server.network.cni import (Attachment, CniConfigError, CniError, CniManager, NetworkConfigList,
                                    PortMapping, Result, find_config, pod_cni_args)
from cri_server.network.defaults import default_conflist, write_default

FAKE_PLUGIN = r'''#!{python}
# A fake CNI plugin: logs its env and stdin, answers from a behaviour file.
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
name = os.path.basename(__file__)
stdin = json.load(sys.stdin)
with open(os.path.join(here, "calls.jsonl"), "a") as f:
    f.write(json.dumps({{"plugin": name, "cmd": os.environ["CNI_COMMAND"],
                        "env": {{k: v for k, v in os.environ.items() if k.startswith("CNI_")}},
                        "stdin": stdin}}) + "\n")
behaviour = json.load(open(os.path.join(here, name + ".json")))
cmd = os.environ["CNI_COMMAND"]
if cmd in behaviour.get("fail", []):
    print(json.dumps({{"cniVersion": stdin["cniVersion"], "code": 11, "msg": "boom", "details": "in " + name}}))
    sys.exit(1)
if cmd == "ADD":
    out = behaviour.get("result")
    if out is None:
        out = stdin.get("prevResult")
    print(json.dumps(out))
'''


@pytest.fixture
def plugins(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()

    def make(name: str, **behaviour) -> None:
        p = bindir / name
        p.write_text(FAKE_PLUGIN.format(python=sys.executable))
        p.chmod(0o755)
        (bindir / f"{name}.json").write_text(json.dumps(behaviour))

    def calls() -> list[dict]:
        path = bindir / "calls.jsonl"
        return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []

    return bindir, make, calls


RESULT_A = {"cniVersion": "1.0.0", "interfaces": [{"name": "br"}, {"name": "eth0", "sandbox": "/ns"}],
            "ips": [{"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 1},
                    {"address": "fd00::5/64", "interface": 1}, {"address": "10.9.9.9/32", "interface": 0}]}


def conflist(*plugins: dict, version: str = "1.0.0") -> NetworkConfigList:
    doc = {"cniVersion": version, "name": "testnet", "plugins": list(plugins)}
    return NetworkConfigList.parse(json.dumps(doc).encode(), "test.conflist")


def att(**kw) -> Attachment:
    base = dict(container_id="sb1", netns_path="/run/netns/x", args=pod_cni_args("p", "ns", "uid", "sb1"))
    base.update(kw)
    return Attachment(**base)


def test_add_chains_results_and_passes_capabilities(tmp_path, plugins):
    bindir, make, calls = plugins
    make("first", result=RESULT_A)
    make("second")                         # passes prevResult through
    mgr = CniManager(str(tmp_path), [str(tmp_path / "other"), str(bindir)], str(tmp_path / "cache"))
    conf = conflist({"type": "first", "x": 1}, {"type": "second", "capabilities": {"portMappings": True}})
    ports = (PortMapping(8080, 80, "tcp", "127.0.0.1"),)
    result = asyncio.run(mgr.add(att(port_mappings=ports), conf))
    assert result.pod_ips() == ["10.1.0.5", "fd00::5"]          # only eth0's, IPv4 first
    c = calls()
    assert [(x["plugin"], x["cmd"]) for x in c] == [("first", "ADD"), ("second", "ADD")]
    first, second = c[0]["stdin"], c[1]["stdin"]
    assert first["name"] == "testnet" and first["cniVersion"] == "1.0.0" and first["x"] == 1
    assert "prevResult" not in first and "runtimeConfig" not in first   # first declares no capability
    assert second["prevResult"] == RESULT_A
    assert second["runtimeConfig"] == {"portMappings": [
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "127.0.0.1"}]}
    env = c[0]["env"]
    assert env["CNI_COMMAND"] == "ADD" and env["CNI_CONTAINERID"] == "sb1"
    assert env["CNI_NETNS"] == "/run/netns/x" and env["CNI_IFNAME"] == "eth0"
    assert env["CNI_PATH"] == f"{tmp_path / 'other'}:{bindir}"
    assert "K8S_POD_NAME=p" in env["CNI_ARGS"].split(";") and env["CNI_ARGS"].startswith("IgnoreUnknown=1")


def test_failed_add_tears_down_and_reports_the_plugin_error(tmp_path, plugins):
    bindir, make, calls = plugins
    make("first", result=RESULT_A)
    make("second", fail=["ADD"])
    mgr = CniManager(str(tmp_path), [str(bindir)], str(tmp_path / "cache"))
    with pytest.raises(CniError) as e:
        asyncio.run(mgr.add(att(), conflist({"type": "first"}, {"type": "second"})))
    assert e.value.plugin == "second" and e.value.code == 11
    assert "boom" in str(e.value) and "in second" in str(e.value)
    assert [(x["plugin"], x["cmd"]) for x in calls()] == [
        ("first", "ADD"), ("second", "ADD"), ("second", "DEL"), ("first", "DEL")]
    assert not (tmp_path / "cache" / "results").exists() or not os.listdir(tmp_path / "cache" / "results")


def test_del_uses_the_cached_result_then_forgets_it(tmp_path, plugins):
    bindir, make, calls = plugins
    make("first", result=RESULT_A)
    make("second")
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    (conf_dir / "10-a.conflist").write_bytes(conflist({"type": "first"}, {"type": "second"}).raw)
    mgr = CniManager(str(conf_dir), [str(bindir)], str(tmp_path / "cache"))
    asyncio.run(mgr.add(att()))
    assert mgr.cached_result(att()).pod_ips() == ["10.1.0.5", "fd00::5"]
    # The conf dir changes after ADD: DEL still runs the network the pod was added to.
    os.unlink(conf_dir / "10-a.conflist")
    asyncio.run(mgr.delete(att()))
    dels = [x for x in calls() if x["cmd"] == "DEL"]
    assert [x["plugin"] for x in dels] == ["second", "first"]
    assert all(x["stdin"]["prevResult"] == RESULT_A for x in dels)
    assert mgr.cached_result(att()) is None
    # A second DEL (kubelet retries StopPodSandbox) finds no cache and no config: it is an error the
    # caller can ignore for an already-torn-down pod, and names the missing config.
    with pytest.raises(CniConfigError):
        asyncio.run(mgr.delete(att()))


def test_del_failure_keeps_the_cache(tmp_path, plugins):
    bindir, make, calls = plugins
    make("first", result=RESULT_A, fail=["DEL"])
    mgr = CniManager(str(tmp_path), [str(bindir)], str(tmp_path / "cache"))
    conf = conflist({"type": "first"})
    asyncio.run(mgr.add(att(), conf))
    with pytest.raises(CniError):
        asyncio.run(mgr.delete(att(), conf))
    assert mgr.cached_result(att()) is not None


def test_check(tmp_path, plugins):
    bindir, make, calls = plugins
    make("first", result=RESULT_A)
    mgr = CniManager(str(tmp_path), [str(bindir)], str(tmp_path / "cache"))
    conf = conflist({"type": "first"})
    with pytest.raises(CniError, match="no cached ADD result"):
        asyncio.run(mgr.check(att(), conf))
    asyncio.run(mgr.add(att(), conf))
    asyncio.run(mgr.check(att(), conf))
    assert calls()[-1]["cmd"] == "CHECK" and calls()[-1]["stdin"]["prevResult"] == RESULT_A
    with pytest.raises(CniError, match="0.4.0"):
        asyncio.run(mgr.check(att(), conflist({"type": "first"}, version="0.3.1")))


def test_old_versions_get_no_prev_result_on_del(tmp_path, plugins):
    bindir, make, calls = plugins
    legacy = {"cniVersion": "0.2.0", "ip4": {"ip": "10.2.0.7/16", "gateway": "10.2.0.1"}}
    make("old", result=legacy)
    mgr = CniManager(str(tmp_path), [str(bindir)], str(tmp_path / "cache"))
    conf = conflist({"type": "old"}, version="0.2.0")
    r = asyncio.run(mgr.add(att(), conf))
    assert r.pod_ips() == ["10.2.0.7"]
    asyncio.run(mgr.delete(att(), conf))
    assert "prevResult" not in calls()[-1]["stdin"]


def test_missing_plugin(tmp_path):
    mgr = CniManager(str(tmp_path), [str(tmp_path)], str(tmp_path / "cache"))
    with pytest.raises(CniError, match="'nope' not found"):
        asyncio.run(mgr.add(att(), conflist({"type": "nope"})))


def test_plugin_without_json_error(tmp_path, plugins):
    bindir, make, _ = plugins
    p = bindir / "crash"
    p.write_text("#!/bin/sh\necho 'segfault-ish' >&2\nexit 3\n")
    p.chmod(0o755)
    mgr = CniManager(str(tmp_path), [str(bindir)], str(tmp_path / "cache"))
    with pytest.raises(CniError, match="exited 3: segfault-ish"):
        asyncio.run(mgr.add(att(), conflist({"type": "crash"})))


def test_plugin_timeout(tmp_path, plugins):
    bindir, _, _ = plugins
    p = bindir / "hang"
    p.write_text("#!/bin/sh\nexec sleep 30\n")
    p.chmod(0o755)
    mgr = CniManager(str(tmp_path), [str(bindir)], str(tmp_path / "cache"), timeout=0.2)
    with pytest.raises(CniError, match="timed out"):
        asyncio.run(mgr.add(att(), conflist({"type": "hang"})))


def test_find_config_order_and_single_plugin_conf(tmp_path):
    (tmp_path / "README").write_text("not a config")
    (tmp_path / "05-broken.conflist").write_text("{")
    (tmp_path / "20-z.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": "z",
                                                        "plugins": [{"type": "bridge"}]}))
    (tmp_path / "10-single.conf").write_text(json.dumps({"cniVersion": "0.4.0", "name": "single",
                                                        "type": "bridge", "bridge": "b0"}))
    conf = find_config(str(tmp_path))
    assert conf.name == "single" and conf.plugins[0]["bridge"] == "b0" and len(conf.plugins) == 1


@pytest.mark.parametrize("doc,field", [
    ({"name": "n", "plugins": [{"type": "x"}]}, "cniVersion"),
    ({"cniVersion": "1.0.0", "plugins": [{"type": "x"}]}, "name"),
    ({"cniVersion": "1.0.0", "name": "n", "plugins": []}, "plugins"),
    ({"cniVersion": "1.0.0", "name": "n", "plugins": [{"bridge": "x"}]}, "plugins[0].type"),
    ({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "../../bin/sh"}]}, "plugins[0].type"),
    ({"cniVersion": "1.0.0", "name": "n"}, "neither"),
])
def test_invalid_configs_name_the_field(doc, field):
    with pytest.raises(CniConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        NetworkConfigList.parse(json.dumps(doc).encode(), "f.conflist")


def test_no_config_dir(tmp_path):
    with pytest.raises(CniConfigError, match="does not exist"):
        find_config(str(tmp_path / "none"))
    mgr = CniManager(str(tmp_path / "none"), [], str(tmp_path))
    st = mgr.status()
    assert not st.ready and "does not exist" in st.message


def test_result_parse_without_interfaces():
    r = Result.parse({"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.0.0.2/8"}]}, "0.4.0")
    assert r.pod_ips() == ["10.0.0.2"]


def test_default_config_writer(tmp_path):
    written = write_default(str(tmp_path), bridge="hk0", subnet="10.77.0.0/24")
    assert [os.path.basename(p) for p in written] == ["10-husk.conflist", "99-loopback.conf"]
    conf = find_config(str(tmp_path))
    bridge, portmap = conf.plugins
    assert bridge["bridge"] == "hk0" and bridge["isGateway"] and not bridge["isDefaultGateway"]
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.77.0.0/24"}]]
    assert portmap["capabilities"] == {"portMappings": True}
    assert write_default(str(tmp_path)) == []       # never overwrites an existing config
    assert default_conflist()["plugins"][0]["isDefaultGateway"] is False
