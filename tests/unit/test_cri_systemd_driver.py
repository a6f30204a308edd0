"""husk-cri with the systemd cgroup driver: slice parents in specs, RuntimeConfig, the driver passed to the shim and
the runtime; and hugepage limits on a node without the hugetlb controller."""
from __future__ import annotations

import asyncio
import dataclasses
import os
from types import SimpleNamespace

import pytest

from cri_server import config as cfg
from cri_server.api.v1 import api_pb2 as pb
from cri_server.errors import InvalidArgument
from cri_server.oom import OomScorePolicy
from cri_server.rpc import runtime_info
from cri_server.spec import builder, context, resources
from tests.unit.test_cri_spec import apply, cctx, host, rootfs, sctx  # noqa: F401 (rootfs: a fixture)

POD_SLICE = "kubepods-burstable-pod0c4e7a8b_1d2f.slice"
# What kubelet's systemd cgroup manager sends: the slice's whole path (its ToSystemd), whose leaf names the slice.
POD_SLICE_PATH = "/kubepods.slice/kubepods-burstable.slice/" + POD_SLICE


def pod(parent: str) -> pb.PodSandboxConfig:
    return pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", namespace="ns", uid="u"),
                               linux=pb.LinuxPodSandboxConfig(cgroup_parent=parent))


def systemd_host(**kw):
    return host(systemd_cgroup=True, **kw)


# --- cgroupsPath under each driver ---------------------------------------------------------------------------

@pytest.mark.parametrize("parent", [POD_SLICE, POD_SLICE_PATH, POD_SLICE_PATH + "/"])
def test_systemd_slice_parent_gives_slice_prefix_name(tmp_path, parent):
    sb = apply(resources.with_sandbox_resources, sctx(tmp_path, "/nonexistent", config=pod(parent),
                                                      host=systemd_host()))
    assert sb["linux"]["cgroupsPath"] == f"{POD_SLICE}:husk:sid"
    c = apply(resources.with_cgroups_path, cctx(tmp_path, sandbox_config=pod(parent), host=systemd_host()))
    assert c["linux"]["cgroupsPath"] == f"{POD_SLICE}:husk:cid"


def test_systemd_container_takes_the_recorded_pod_parent(tmp_path):
    ctx = cctx(tmp_path, sandbox_config=pod(""), host=systemd_host())
    ctx = dataclasses.replace(ctx, sandbox=dataclasses.replace(ctx.sandbox, cgroup_parent=POD_SLICE_PATH))
    assert apply(resources.with_cgroups_path, ctx)["linux"]["cgroupsPath"] == f"{POD_SLICE}:husk:cid"


def test_systemd_without_parent_uses_system_slice(tmp_path):
    # runc's systemd driver puts a container without cgroupsPath in system.slice; containerd would send
    # /k8s.io/<id> there, which runc refuses.
    sb = apply(resources.with_sandbox_resources, sctx(tmp_path, "/nonexistent", config=pod(""),
                                                      host=systemd_host()))
    assert sb["linux"]["cgroupsPath"] == "system.slice:husk:sid"
    assert sb["linux"]["resources"]["cpu"]["shares"] == resources.SANDBOX_CPU_SHARES
    c = apply(resources.with_cgroups_path, cctx(tmp_path, sandbox_config=pod(""), host=systemd_host()))
    assert c["linux"]["cgroupsPath"] == "system.slice:husk:cid"


def test_root_slice(tmp_path):
    c = apply(resources.with_cgroups_path, cctx(tmp_path, sandbox_config=pod("-.slice"), host=systemd_host()))
    assert c["linux"]["cgroupsPath"] == "-.slice:husk:cid"


@pytest.mark.parametrize("parent", ["/kubepods/burstable/podu", "kubepods", "/kubepods.slice/podu"])
def test_systemd_refuses_cgroupfs_parents(tmp_path, parent):
    with pytest.raises(InvalidArgument) as e:
        apply(resources.with_sandbox_resources, sctx(tmp_path, "/nonexistent", config=pod(parent),
                                                     host=systemd_host()))
    msg = str(e.value)
    assert msg.startswith("config.linux.cgroup_parent: ")
    assert f"{parent!r} is not a systemd slice" in msg and "systemd_cgroup = false" in msg
    with pytest.raises(InvalidArgument, match="is not a systemd slice"):
        apply(resources.with_cgroups_path, cctx(tmp_path, sandbox_config=pod(parent), host=systemd_host()))


@pytest.mark.parametrize("parent,reason", [
    ("kube pods.slice", "is not a valid slice name"),
    ("kube:pods.slice", "is not a valid slice name"),          # ':' would split slice:prefix:name
    ("kubepods@1.slice", "is not a valid slice name"),
    ("a--b.slice", "invalid slice name 'a--b.slice': empty component between dashes"),
    ("-a.slice", "empty component between dashes"),
    ("a-.slice", "empty component between dashes"),
    (".slice", "is not a valid slice name"),
    ("x" * 250 + "-y.slice", "is not a valid slice name"),     # longer than systemd's 255
    ("/kubepods.slice/system-getty.slice", "is not where systemd puts system-getty.slice "
                                           "(/system.slice/system-getty.slice)"),
])
def test_systemd_refuses_bad_slice_names(tmp_path, parent, reason):
    with pytest.raises(InvalidArgument) as e:
        apply(resources.with_sandbox_resources, sctx(tmp_path, "/nonexistent", config=pod(parent),
                                                     host=systemd_host()))
    assert str(e.value).startswith("config.linux.cgroup_parent: ")
    assert reason in str(e.value)


@pytest.mark.parametrize("parent", [POD_SLICE, POD_SLICE_PATH])
def test_cgroupfs_refuses_slice_parents(tmp_path, parent):
    with pytest.raises(InvalidArgument) as e:
        apply(resources.with_sandbox_resources, sctx(tmp_path, "/nonexistent", config=pod(parent)))
    assert "is a systemd slice, but husk-cri uses the cgroupfs driver" in str(e.value)
    assert "runtime.systemd_cgroup = true" in str(e.value)
    with pytest.raises(InvalidArgument, match="is a systemd slice"):
        apply(resources.with_cgroups_path, cctx(tmp_path, sandbox_config=pod(parent)))


def test_cgroupfs_paths_unchanged(tmp_path):
    assert apply(resources.with_cgroups_path, cctx(tmp_path))["linux"]["cgroupsPath"] == "/kubepods/podu/cid"
    assert apply(resources.with_cgroups_path, cctx(tmp_path, sandbox_config=pod("")))["linux"]["cgroupsPath"] \
        == "/husk/cid"
    with pytest.raises(InvalidArgument, match="must not contain '..'"):
        apply(resources.with_cgroups_path, cctx(tmp_path, sandbox_config=pod("/kubepods/../x")))


@pytest.mark.parametrize("name,expanded", [
    ("a.slice", "/a.slice"), ("-.slice", "/"),
    (POD_SLICE, "/kubepods.slice/kubepods-burstable.slice/" + POD_SLICE),
])
def test_expand_slice(name, expanded):
    assert resources.expand_slice(name) == expanded


def test_composed_sandbox_and_container_specs_under_systemd(tmp_path, rootfs):
    sb = builder.sandbox_spec(sctx(tmp_path, rootfs, config=pod(POD_SLICE_PATH), host=systemd_host()))
    assert sb["linux"]["cgroupsPath"] == f"{POD_SLICE}:husk:sid"
    c = builder.container_spec(cctx(tmp_path, rootfs, sandbox_config=pod(POD_SLICE_PATH), host=systemd_host()))
    assert c["linux"]["cgroupsPath"] == f"{POD_SLICE}:husk:cid"


# --- RuntimeConfig ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("systemd,driver", [(True, pb.SYSTEMD), (False, pb.CGROUPFS)])
def test_runtime_config_reports_the_driver(systemd, driver):
    c = cfg.with_overrides(cfg.Config(), {"systemd_cgroup": systemd})
    resp = asyncio.run(runtime_info.runtime_config(SimpleNamespace(config=c), pb.RuntimeConfigRequest()))
    assert resp.linux.cgroup_driver == driver


# --- the driver reaches the shim and the runtime ------------------------------------------------------------

@pytest.mark.parametrize("systemd", [True, False])
def test_create_options_carry_the_driver_to_the_runtime(tmp_path, systemd):
    from cri_server.shims import ShimManager
    from shim.pb import husk as huskpb
    from shim.runtime_driver import BinaryRuntime, RuntimeOptions
    from shim.service import ShimConfig, TaskService
    m = ShimManager(str(tmp_path), "/run/husk/runtime", systemd_cgroup=systemd)
    opts = m.create_options(log_path="/var/log/pods/x/c.log", stdin_once=True)
    assert opts.type_url == huskpb.CreateOptions.FULL_NAME
    decoded = huskpb.CreateOptions.decode(opts.value)
    assert (decoded.systemd_cgroup, decoded.log_path, decoded.stdin_once) == \
        (systemd, "/var/log/pods/x/c.log", True)
    # The shim's side: the options become the driver's flags, for the in-process runtime and binaries alike.
    svc = TaskService(None, ShimConfig(id="c", address=str(tmp_path / "s"), state_dir=str(tmp_path)), None,
                      lambda: None)
    runtime, root, flags, log_path, stdin_once = svc._options(opts)
    assert flags["systemd_cgroup"] is systemd and log_path == "/var/log/pods/x/c.log" and stdin_once
    binary = BinaryRuntime("/bin/true", RuntimeOptions(root=root, **flags), str(tmp_path / "log.json"))
    assert ("--systemd-cgroup" in binary._global()) is systemd


@pytest.mark.parametrize("systemd", [True, False])
def test_force_delete_runs_the_runtime_with_the_driver(tmp_path, systemd):
    from cri_server.shims import ShimManager
    from cri_server.tasks import force_delete
    argv_file = tmp_path / "argv"
    fake = tmp_path / "fake-runc"
    fake.write_text(f'#!/bin/sh\necho "$@" > {argv_file}\n')
    fake.chmod(0o755)
    m = ShimManager(str(tmp_path), "/run/husk/runtime", default_runtime=str(fake), systemd_cgroup=systemd)
    asyncio.run(force_delete(SimpleNamespace(need_shims=lambda: m), "cid", str(fake)))
    expected = "--root /run/husk/runtime" + (" --systemd-cgroup" if systemd else "") + " delete --force cid"
    assert argv_file.read_text().strip() == expected


# --- hugepage limits without a hugetlb controller -----------------------------------------------------------

KUBELET_PAGES = [pb.HugepageLimit(page_size="2MB", limit=0), pb.HugepageLimit(page_size="1GB", limit=0)]


def hp_config(limits):
    return pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c"), image=pb.ImageSpec(image="img"),
                              linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                                  memory_limit_in_bytes=64 << 20, hugepage_limits=limits)))


def test_zero_limits_dropped_without_controller_when_tolerated(tmp_path):
    h = host(hugetlb_controller=False, tolerate_missing_hugetlb=True)
    spec = apply(resources.with_resources, cctx(tmp_path, config=hp_config(KUBELET_PAGES), host=h))
    assert "hugepageLimits" not in spec["linux"]["resources"]
    assert spec["linux"]["resources"]["memory"]["limit"] == 64 << 20   # the rest is untouched


def test_nonzero_limit_without_controller_is_invalid(tmp_path):
    h = host(hugetlb_controller=False, tolerate_missing_hugetlb=True)
    limits = [pb.HugepageLimit(page_size="2MB", limit=0), pb.HugepageLimit(page_size="2MB", limit=2 << 20)]
    with pytest.raises(InvalidArgument) as e:
        apply(resources.with_resources, cctx(tmp_path, config=hp_config(limits), host=h))
    msg = str(e.value)
    assert msg.startswith("config.linux.resources.hugepage_limits[1].limit: ")
    assert "2097152 bytes of 2MB pages cannot be enforced" in msg and "no hugetlb cgroup controller" in msg


def test_limits_pass_through_when_not_tolerated(tmp_path):
    h = host(hugetlb_controller=False, tolerate_missing_hugetlb=False)
    limits = [pb.HugepageLimit(page_size="2MB", limit=0), pb.HugepageLimit(page_size="1GB", limit=1 << 30)]
    spec = apply(resources.with_resources, cctx(tmp_path, config=hp_config(limits), host=h))
    assert spec["linux"]["resources"]["hugepageLimits"] == [{"pageSize": "2MB", "limit": 0},
                                                            {"pageSize": "1GB", "limit": 1 << 30}]


@pytest.mark.parametrize("tolerate", [True, False])
def test_limits_pass_through_with_controller(tmp_path, tolerate):
    h = host(hugetlb_controller=True, tolerate_missing_hugetlb=tolerate)
    limits = [pb.HugepageLimit(page_size="2MB", limit=0), pb.HugepageLimit(page_size="1GB", limit=1 << 30)]
    spec = apply(resources.with_resources, cctx(tmp_path, config=hp_config(limits), host=h))
    assert [p["limit"] for p in spec["linux"]["resources"]["hugepageLimits"]] == [0, 1 << 30]


def test_update_resources_follow_the_same_policy():
    r = pb.LinuxContainerResources(cpu_shares=512, hugepage_limits=KUBELET_PAGES)
    h = host(hugetlb_controller=False, tolerate_missing_hugetlb=True)
    assert resources.linux_resources(r, "linux", False, resources.hugepage_policy(h)) == {"cpu": {"shares": 512}}
    r.hugepage_limits[0].limit = 4 << 20
    with pytest.raises(InvalidArgument, match=r"^linux.hugepage_limits\[0\].limit: "):
        resources.linux_resources(r, "linux", False, resources.hugepage_policy(h))
    # The page size is still checked first.
    r.hugepage_limits[0].page_size = "2M"
    with pytest.raises(InvalidArgument, match=r"hugepage_limits\[0\].page_size"):
        resources.linux_resources(r, "linux", False, resources.hugepage_policy(h))


def test_hugetlb_controller_on_cgroup_v2(tmp_path, monkeypatch):
    import runtime.cgroups as cg
    monkeypatch.setattr(cg, "is_unified", lambda root=cg.CGROUP_ROOT: True)
    monkeypatch.setattr(cg, "CGROUP_ROOT", str(tmp_path))
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    assert context.hugetlb_controller()
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert not context.hugetlb_controller()
    os.unlink(tmp_path / "cgroup.controllers")
    assert not context.hugetlb_controller()


def test_hugetlb_controller_on_v1_and_hybrid(monkeypatch):
    import runtime.cgroups as cg
    import runtime.cgroups.v1 as v1
    monkeypatch.setattr(cg, "is_unified", lambda root=cg.CGROUP_ROOT: False)
    # A hybrid host whose cgroup2 mount has hugetlb but no v1 hugetlb hierarchy (this development machine):
    # containers get v1 limits only, so the controller is missing, as containerd decides.
    monkeypatch.setattr(v1, "hierarchies", lambda: {"memory": "/sys/fs/cgroup/memory",
                                                    "unified": "/sys/fs/cgroup/unified"})
    assert not context.hugetlb_controller()
    monkeypatch.setattr(v1, "hierarchies", lambda: {"memory": "/sys/fs/cgroup/memory",
                                                    "hugetlb": "/sys/fs/cgroup/hugetlb"})
    assert context.hugetlb_controller()


def test_host_detect_takes_the_config():
    h = context.HostInfo.detect(OomScorePolicy(0), systemd_cgroup=True, tolerate_missing_hugetlb=False)
    assert h.systemd_cgroup and not h.tolerate_missing_hugetlb
    assert h.hugetlb_controller == context.hugetlb_controller()
