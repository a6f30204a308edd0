"""runtime/idmap.py is loaded only by a container with idmapped mounts: every create imported it (~0.4 ms) to ask
whether it was wanted; the question is runtime.config's now."""
import json
import subprocess
import sys

CODE = r"""
import json, sys
from runtime import init
init.preload(json.loads(sys.argv[1]), [])
from runtime.config import idmap_wanted
print(json.dumps({"wanted": idmap_wanted(json.loads(sys.argv[1])), "loaded": "runtime.idmap" in sys.modules}))
"""


def _run(cfg: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CODE, json.dumps(cfg)], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return json.loads(out)


def test_a_plain_container_does_not_load_idmap() -> None:
    assert _run({"mounts": [{"destination": "/v", "type": "bind", "source": "/tmp", "options": ["rbind"]}]}) == \
        {"wanted": False, "loaded": False}


def test_idmapped_mounts_or_rootfs_load_it() -> None:
    assert _run({"mounts": [{"destination": "/v", "type": "bind", "source": "/tmp", "options": ["rbind", "idmap"]}]}) \
        == {"wanted": True, "loaded": True}
    assert _run({"annotations": {"org.husk.rootfs.idmap": "true"}}) == {"wanted": True, "loaded": True}
