"""`husk-cri images import` for real, as an operator runs it on an air-gapped node: an OCI archive (skopeo's
oci-archive) imported into a state directory, then `images ls` (table and JSON) shows it; `--name` and `--pin`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.root


def _husk_cri(*args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "cri_server", *args], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"husk-cri {' '.join(args)}: {p.stderr}"
    return p.stdout


def test_import_an_oci_archive_then_list_it(tmp_path, test_images):
    archive = str(tmp_path / "busybox-oci.tar")
    p = subprocess.run(["skopeo", "copy", "--quiet", f"oci:{test_images['busybox']}:latest",
                        f"oci-archive:{archive}:docker.io/library/busybox:offline"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    root = str(tmp_path / "root")
    none = str(tmp_path / "no-certs.d")

    out = _husk_cri("images", "import", archive, "--root", root, "--registry-config-dir", none)
    image_id, tags = out.strip().split(" ", 1)
    assert image_id.startswith("sha256:") and tags == "docker.io/library/busybox:offline"

    table = _husk_cri("images", "ls", "--root", root, "--registry-config-dir", none).splitlines()
    assert table[0].split() == ["IMAGE", "TAG", "IMAGE", "ID", "SIZE"]
    assert [row.split()[:3] for row in table[1:]] == [["docker.io/library/busybox", "offline", image_id[7:20]]]

    # Again under another name, pinned: the same image, one more tag.
    _husk_cri("images", "import", archive, "--root", root, "--registry-config-dir", none,
              "--name", "registry.example.test/tools/busybox:v1", "--pin")
    (doc,) = [json.loads(line) for line in
              _husk_cri("images", "ls", "--json", "--root", root, "--registry-config-dir", none).splitlines()]
    assert doc["id"] == image_id and doc["pinned"] is True and doc["size"] > 0
    assert set(doc["repoTags"]) == {"docker.io/library/busybox:offline", "registry.example.test/tools/busybox:v1"}
    assert _husk_cri("images", "ls", "-q", "--root", root, "--registry-config-dir", none).split() == [image_id]
