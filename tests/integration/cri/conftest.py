"""Fixtures for husk-cri's integration tests: test images built once and pushed to a local registry, hosts.toml
files mapping docker.io and registry.k8s.io to it, a pod network of unique names, and a running husk-cri that is
cleaned up completely after each test."""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from cri_server.images import testimages
from tests.support.cri import CriDaemon, PodNetwork
from tests.support.registry import LocalRegistry, write_hosts_toml

SANDBOX_IMAGE = "registry.k8s.io/pause:3.9-husk"
BUSYBOX = "docker.io/library/busybox:latest"
# (catalog image, registry path)
PUSHED = [("busybox", "library/busybox:latest"), ("busybox", "e2e-test-images/busybox:1.29-2"),
          ("pause-sandbox", "pause:3.9-husk"),
          ("test-image-user-uid", "k8s-staging-cri-tools/test-image-user-uid:latest"),
          ("busybox-stopsignal", "husk-test/stopsignal:v1")]


@pytest.fixture(scope="module", autouse=True)
def no_threads_left_behind() -> Iterator[None]:
    """Other suites fork in-process (the shim's spawner refuses to once a thread exists)."""
    before = {t.ident for t in threading.enumerate()}
    yield
    extra = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    for t in extra:
        t.join(5)
    assert not [t.name for t in extra if t.is_alive()]


@pytest.fixture(scope="session")
def cri_layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Catalog name -> OCI layout directory of every image in PUSHED."""
    out = str(tmp_path_factory.mktemp("hct-layouts"))
    index = testimages.build(out, only=sorted({name for name, _ in PUSHED}), big=False, log=lambda *_: None)
    return {name: os.path.join(out, v["layout"]) for name, v in index.items()}


@pytest.fixture(scope="session")
def cri_registry(tmp_path_factory: pytest.TempPathFactory, cri_layouts: dict[str, str]) -> Iterator[LocalRegistry]:
    reg = LocalRegistry(str(tmp_path_factory.mktemp("hct-registry")))
    reg.start()
    try:
        for name, path in PUSHED:
            reg.push(cri_layouts[name], path)
        yield reg
    finally:
        reg.stop()


@pytest.fixture(scope="session")
def registry_config_dir(tmp_path_factory: pytest.TempPathFactory, cri_registry: LocalRegistry) -> str:
    d = str(tmp_path_factory.mktemp("hct-certs.d"))
    for host in ("docker.io", "registry.k8s.io", "gcr.io", cri_registry.addr):
        write_hosts_toml(d, host, f"http://{cri_registry.addr}")
    return d


@pytest.fixture
def pod_network(tmp_path) -> Iterator[PodNetwork]:
    net = PodNetwork(str(tmp_path))
    yield net
    net.cleanup()


@pytest.fixture
def cri(tmp_path, pod_network: PodNetwork, registry_config_dir: str) -> Iterator[CriDaemon]:
    d = CriDaemon(str(tmp_path), pod_network, registry_config_dir, SANDBOX_IMAGE)
    try:
        d.start()
        yield d
    finally:
        d.cleanup()
