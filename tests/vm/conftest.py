"""Fixtures for the cgroup tests that need a real kernel: they run where /sys/fs/cgroup is cgroup v2 with
controllers (the scripts/vm-test guest, or a v2 host as root); tests also marked `cgroup_v1_too` run on a
v1/hybrid host too, through the project's manager factory, when the host has the v1 manager."""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from runtime.cgroups.manager import Manager
from runtime.cgroups.v2 import V2Manager
from tests.vm.workload import ForkedWorkload, Workload

MOUNT = "/sys/fs/cgroup"
PREFIX = "husk-cgtest"


def unified_with_controllers() -> bool:
    try:
        with open(f"{MOUNT}/cgroup.controllers") as f:
            controllers = f.read().split()
    except OSError:
        return False
    return {"memory", "pids"} <= set(controllers)


def v1_manager_factory() -> Callable[[str], Manager] | None:
    if not os.path.isdir(f"{MOUNT}/memory"):
        return None
    try:
        from runtime.cgroups import manager_for  # the runtime's factory (v1 on this kind of host)
    except ImportError:
        return None
    return manager_for


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cgroup_v1_too: a vm test that also runs on a cgroup v1 host")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    v2 = unified_with_controllers()
    v1 = v1_manager_factory() is not None
    for item in items:
        # markers, not keywords: "vm" is also the name of this package, which every item here has as a keyword
        if item.get_closest_marker("vm") is None or v2:
            continue
        if v1 and item.get_closest_marker("cgroup_v1_too") is not None:
            continue
        item.add_marker(pytest.mark.skip(reason="needs cgroup v2 with controllers: run scripts/vm-test"))


@pytest.fixture
def cgroup_version() -> int:
    return 2 if unified_with_controllers() else 1


@pytest.fixture
def make_manager(cgroup_version: int) -> Iterator[Callable[[str], Manager]]:
    """Makes managers for unique paths under /husk-cgtest-<id>/ and removes everything they created."""
    base = f"/{PREFIX}-{uuid.uuid4().hex[:8]}"
    made: list[Manager] = []

    def make(name: str = "c") -> Manager:
        path = f"{base}/{name}"
        if cgroup_version == 2:
            m: Manager = V2Manager(path)
        else:
            factory = v1_manager_factory()
            assert factory is not None
            m = factory(path)
        made.append(m)
        return m

    yield make
    for m in reversed(made):
        m.destroy()
    if cgroup_version == 2:
        V2Manager(base).destroy()
    else:
        factory = v1_manager_factory()
        if factory is not None:
            factory(base).destroy()


@pytest.fixture
def workload(make_manager: Callable[[str], Manager]) -> Iterator[Callable[..., Workload]]:
    """start(resources, name="c") -> a Workload in a new cgroup configured from a linux.resources dict."""
    started: list[ForkedWorkload] = []

    def start(resources: dict[str, Any] | None, name: str = "c") -> Workload:
        w = ForkedWorkload(make_manager(name), resources)
        started.append(w)
        return w

    yield start
    for w in reversed(started):
        w.close()


@pytest.fixture(scope="session")
def bundle_template() -> Iterator[Any]:
    """A busybox rootfs with the agent and `husk spec`'s config.json, shared by every container test. Not under
    pytest's tmp dirs (mode 0700): a user namespace's root, an unprivileged host uid, must reach the rootfs."""
    from tests.vm.container import PREFIX, build_template
    d = tempfile.mkdtemp(prefix=f"{PREFIX}-bundle-")
    try:
        os.chmod(d, 0o755)
        yield build_template(Path(d))
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def container(bundle_template, tmp_path) -> Iterator[Callable[..., Any]]:
    """start(resources, cgroupns=True, edit=None, name="c") -> a running ContainerWorkload whose cgroup is
    /husk-vmct-<id>/<name>; every container is force-deleted and every cgroup removed afterwards."""
    from runtime.cgroups import manager_for
    from tests.vm.container import PREFIX, ContainerWorkload
    base = f"/{PREFIX}-{uuid.uuid4().hex[:8]}"
    started: list[ContainerWorkload] = []

    def start(resources: dict[str, Any] | None, *, cgroupns: bool = True, edit: Any = None,
              name: str = "c") -> ContainerWorkload:
        c = ContainerWorkload(bundle_template, tmp_path, resources, f"{base}/{name}", cgroupns=cgroupns, edit=edit)
        started.append(c)
        return c.start()

    yield start
    for c in reversed(started):
        c.close()
    manager_for(base).destroy()
