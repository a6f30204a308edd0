"""Fixtures for the image integration tests: test images built once, local registries (open, htpasswd, token)
with those images pushed, hosts.toml directories mapping upstream names to them, a network guard."""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from cri_server.images import testimages
from tests.support.imagetest import certs_for
from tests.support.netguard import NetGuard
from tests.support.registry import LocalRegistry

# What the tests push, as (image name in the catalog, registry path).
PUSHED = [("busybox", "library/busybox:latest"), ("busybox", "e2e-test-images/busybox:1.29-2"),
          ("pause", "pause:3.9"), ("layered", "husk-test/layered:v1"),
          ("test-image-user-uid", "k8s-staging-cri-tools/test-image-user-uid:latest"),
          ("test-image-user-username", "k8s-staging-cri-tools/test-image-user-username:latest"),
          ("test-image-tags", "k8s-staging-cri-tools/test-image-tags:1"),
          ("test-image-tags", "k8s-staging-cri-tools/test-image-tags:2")]


@pytest.fixture(scope="module", autouse=True)
def no_threads_left_behind() -> Iterator[None]:
    """Other suites fork (the shim's spawner refuses to once a thread exists): leave no thread running."""
    before = {t.ident for t in threading.enumerate()}
    yield
    extra = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    for t in extra:
        t.join(5)
    assert not [t.name for t in extra if t.is_alive()]


@pytest.fixture(autouse=True)
def netguard(monkeypatch: pytest.MonkeyPatch) -> NetGuard:
    g = NetGuard()
    g.install(monkeypatch)
    return g


@pytest.fixture(scope="session")
def test_images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """name -> OCI layout directory, for every catalog image but the big one."""
    out = str(tmp_path_factory.mktemp("husk-img-layouts"))
    index = testimages.build(out, big=False, log=lambda *_: None)
    return {name: os.path.join(out, v["layout"]) for name, v in index.items()}


def _start(tmp_path_factory: pytest.TempPathFactory, auth: str | None, layouts: dict[str, str],
           pushed: list[tuple[str, str]]) -> LocalRegistry:
    reg = LocalRegistry(str(tmp_path_factory.mktemp(f"husk-img-reg-{auth or 'open'}")), auth,
                        anonymous_pull=auth == "token")
    reg.start()
    try:
        for name, path in pushed:
            reg.push(layouts[name], path)
    except BaseException:
        reg.stop()
        raise
    return reg


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory, test_images: dict[str, str]) -> Iterator[LocalRegistry]:
    reg = _start(tmp_path_factory, None, test_images, PUSHED)
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def htpasswd_registry(tmp_path_factory: pytest.TempPathFactory,
                      test_images: dict[str, str]) -> Iterator[LocalRegistry]:
    reg = _start(tmp_path_factory, "htpasswd", test_images, [("layered", "private/layered:v1")])
    yield reg
    reg.stop()


@pytest.fixture(scope="module")  # its token server is a thread: gone before other modules run
def token_registry(tmp_path_factory: pytest.TempPathFactory, test_images: dict[str, str]) -> Iterator[LocalRegistry]:
    reg = _start(tmp_path_factory, "token", test_images, [("layered", "private/layered:v1"),
                                                          ("busybox", "public/busybox:latest")])
    yield reg
    reg.stop()


@pytest.fixture
def certs_dir(tmp_path: os.PathLike[str], registry: LocalRegistry) -> str:
    return certs_for(str(tmp_path), registry)
