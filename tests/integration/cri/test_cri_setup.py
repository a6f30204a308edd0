"""`husk-cri setup` (what scripts/start runs before serving) on directories of the test's own: the sandbox image
built from catatonit and imported (pinned) when absent, a default CNI config written only when the conf dir has
none, and a second run that changes nothing. No registry is contacted and no network device is made."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cri_server.network import defaults

pytestmark = pytest.mark.root

SANDBOX = "registry.k8s.io/pause:setup-test"


def _config(tmp_path, conf_dir: str) -> str:
    path = tmp_path / f"cri-{os.path.basename(conf_dir)}.toml"
    path.write_text("\n".join([
        "[server]", f'listen = "{tmp_path}/run/cri.sock"',
        "[paths]", f'root = "{tmp_path}/root"', f'state = "{tmp_path}/run"',
        "[runtime]", f'sandbox_image = "{SANDBOX}"', f'runtime_root = "{tmp_path}/run/runtime"',
        "[cni]", f'conf_dir = "{conf_dir}"', 'bin_dirs = ["/usr/lib/cni"]',
        "[registry]", f'config_dir = "{tmp_path}/no-certs.d"', ""]))
    return str(path)


def _husk_cri(config: str, *args: str) -> list[str]:
    p = subprocess.run([sys.executable, "-m", "cri_server", "--config", config, *args], capture_output=True,
                       text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"husk-cri {' '.join(args)}: {p.stdout}{p.stderr}"
    return p.stdout.splitlines()


def _snapshot(d: str) -> dict[str, bytes]:
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


def test_setup_imports_the_sandbox_image_and_writes_a_default_network(tmp_path):
    conf_dir = str(tmp_path / "net.d")
    config = _config(tmp_path, conf_dir)
    first = _husk_cri(config, "setup")
    assert first[0].startswith(f"husk-cri setup: sandbox image {SANDBOX} built from /usr/bin/catatonit and imported")
    assert first[1].startswith("husk-cri setup: default CNI network written: ")
    assert sorted(os.listdir(conf_dir)) == sorted([defaults.CONFLIST_NAME, defaults.LOOPBACK_NAME])
    with open(os.path.join(conf_dir, defaults.CONFLIST_NAME)) as f:
        net = json.load(f)
    assert net["name"] == defaults.DEFAULT_NETWORK
    assert net["plugins"][0]["bridge"] == defaults.DEFAULT_BRIDGE
    for d in ("root/sandboxes", "root/containers", "run/netns"):
        assert os.path.isdir(tmp_path / d), d

    (img,) = [json.loads(x) for x in _husk_cri(config, "images", "ls", "--json")]
    assert img["repoTags"] == [SANDBOX] and img["pinned"] is True and img["uid"] == 65535

    # Again: everything is there; nothing is rebuilt or rewritten.
    before = _snapshot(conf_dir)
    second = _husk_cri(config, "setup")
    assert second[0].startswith(f"husk-cri setup: sandbox image {SANDBOX} present ({img['id'][:19]})")
    assert second[1] == (f"husk-cri setup: CNI network {defaults.DEFAULT_NETWORK} from "
                         f"{os.path.join(conf_dir, defaults.CONFLIST_NAME)}")
    assert _snapshot(conf_dir) == before
    assert [json.loads(x)["id"] for x in _husk_cri(config, "images", "ls", "--json")] == [img["id"]]


def test_setup_keeps_an_existing_network_config(tmp_path):
    """A config of the operator's, even one whose plugin is not installed, is never replaced by the default."""
    conf_dir = tmp_path / "own.d"
    conf_dir.mkdir()
    own = {"cniVersion": "1.0.0", "name": "operators", "plugins": [{"type": "no-such-plugin"}]}
    (conf_dir / "50-own.conflist").write_text(json.dumps(own))
    lines = _husk_cri(_config(tmp_path, str(conf_dir)), "setup")
    assert lines[1].startswith(f"husk-cri setup: CNI config in {conf_dir} is not usable: ") and \
        "no-such-plugin" in lines[1]
    assert os.listdir(conf_dir) == ["50-own.conflist"]
    assert json.loads((conf_dir / "50-own.conflist").read_text()) == own
