"""PullImage with credentials over gRPC, against the distro's docker-registry with htpasswd (Basic) auth on
127.0.0.1: AuthConfig username/password and its `auth` (base64) form pull; no or wrong credentials are
UNAUTHENTICATED, a malformed `auth` is INVALID_ARGUMENT; nothing is stored by a refused pull."""
from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterator

import grpc
import pytest

from cri_server.api.v1 import api_pb2 as pb
from tests.support.registry import PASSWORD, USER, LocalRegistry, write_hosts_toml

pytestmark = [pytest.mark.root, pytest.mark.e2e]


@pytest.fixture(scope="module")
def private_image(tmp_path_factory: pytest.TempPathFactory, cri_layouts: dict[str, str],
                  registry_config_dir: str) -> Iterator[str]:
    """busybox on an htpasswd registry, reachable over plain HTTP through a hosts.toml of its own."""
    reg = LocalRegistry(str(tmp_path_factory.mktemp("hct-htpasswd")), auth="htpasswd")
    reg.start()
    hosts = os.path.join(registry_config_dir, reg.addr)
    try:
        reg.push(cri_layouts["busybox"], "private/busybox:v1")
        write_hosts_toml(registry_config_dir, reg.addr, f"http://{reg.addr}")
        yield f"{reg.addr}/private/busybox:v1"
    finally:
        shutil.rmtree(hosts, ignore_errors=True)
        reg.stop()


def _pull(cri, ref: str, auth: pb.AuthConfig | None = None) -> str:
    req = pb.PullImageRequest(image=pb.ImageSpec(image=ref))
    if auth is not None:
        req.auth.CopyFrom(auth)
    return cri.image_stub().PullImage(req, timeout=120).image_ref


def _refused(cri, ref: str, auth: pb.AuthConfig | None) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        _pull(cri, ref, auth)
    return e.value.code(), e.value.details()


def test_pull_with_auth_config(cri, private_image):
    im = cri.image_stub()
    code, msg = _refused(cri, private_image, None)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "credentials" in msg
    code, msg = _refused(cri, private_image, pb.AuthConfig(username=USER, password="wrong-" + PASSWORD))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "refused" in msg
    code, msg = _refused(cri, private_image, pb.AuthConfig(auth="not base64!"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "auth" in msg
    assert not im.ListImages(pb.ListImagesRequest()).images

    image_id = _pull(cri, private_image, pb.AuthConfig(username=USER, password=PASSWORD))
    st = im.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=private_image))).image
    assert st.id == image_id and private_image in st.repo_tags
    im.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=image_id)))
    assert not im.ListImages(pb.ListImagesRequest()).images

    # The `auth` form (what kubelet sends from a docker config.json), with the server it belongs to.
    encoded = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    host = private_image.split("/", 1)[0]
    assert _pull(cri, private_image, pb.AuthConfig(auth=encoded, server_address=host)) == image_id
    # Wrong credentials in the same form are refused too.
    wrong = base64.b64encode(f"{USER}:nope".encode()).decode()
    assert _refused(cri, private_image, pb.AuthConfig(auth=wrong))[0] == grpc.StatusCode.UNAUTHENTICATED
