"""husk-cri pulls in a worker process (cri_server/images/pullworker.py): after PullImage, successful and failing,
the daemon has never imported aiohttp (an audit hook loaded through sitecustomize reports imports; its import of
the worker module is the positive control), the image is listed at once, the error keeps its gRPC code, and the
worker's log lines are in husk-cri's log with the pull's id. Root: a real husk-cri."""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.integration.cri.conftest import BUSYBOX, SANDBOX_IMAGE
from tests.support.cri import CriDaemon, PodNetwork

pytestmark = pytest.mark.root

AUDIT = """import os, sys
def _hook(event, args):
    if event == "import" and (str(args[0]).split(".")[0] in ("aiohttp", "yarl", "multidict")
                              or args[0] in ("cri_server.images.registry", "cri_server.images.pullworker")):
        os.write(2, f"AUDIT {os.getpid()} import {args[0]}\\n".encode())
sys.addaudithook(_hook)
"""


@pytest.fixture
def audited_cri(tmp_path, pod_network: PodNetwork, registry_config_dir: str, monkeypatch: Any) -> Iterator[CriDaemon]:
    site = os.path.join(str(tmp_path), "site")
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(AUDIT)
    monkeypatch.setenv("PYTHONPATH", site)
    d = CriDaemon(os.path.join(str(tmp_path), "cri"), pod_network, registry_config_dir, SANDBOX_IMAGE,
                  log_level="info")
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


def test_pull_image_never_imports_aiohttp_in_the_daemon(audited_cri: CriDaemon) -> None:
    cri = audited_cri
    im = cri.image_stub()
    ref = im.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX)), timeout=120).image_ref
    st = im.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=BUSYBOX))).image
    assert st.id == ref and [i.id for i in im.ListImages(pb.ListImagesRequest()).images] == [ref]
    with pytest.raises(grpc.RpcError) as err:
        im.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=BUSYBOX.rsplit(":", 1)[0] + ":no-such-tag")),
                     timeout=120)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert cri.proc is not None
    pid = cri.proc.pid
    log = cri.log()
    assert f"AUDIT {pid} import cri_server.images.pullworker" in log      # the hook works in the daemon
    assert not re.search(rf"AUDIT {pid} import (aiohttp|yarl|multidict|cri_server\.images\.registry)\b", log)
    # the worker's own log lines, relayed with the pull's id
    assert re.search(r"pull worker: cri_server\.images\.service: pulled .*pull=pull-\d+-\d+", log), log[-3000:]
    cri.stop()
    assert cri.proc.returncode == 0
