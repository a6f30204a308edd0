"""husk-cri's user namespace options (userns_options, KEP-127): validation and the specs of a POD-mode pod."""
from __future__ import annotations

import pytest

from cri_server.api.v1 import api_pb2 as pb
from cri_server.errors import InvalidArgument
from cri_server.spec import builder, namespaces
from tests.unit.test_cri_spec import cctx, rootfs, sctx  # noqa: F401 -- rootfs is a fixture

RANGE = pb.IDMapping(container_id=0, host_id=200000, length=65536)


def pod(mode: int = pb.POD, uids=(RANGE,), gids=(RANGE,), **ns) -> pb.PodSandboxConfig:
    c = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", namespace="ns", uid="u"),
                            linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods/podu"))
    opts = c.linux.security_context.namespace_options
    opts.userns_options.mode = mode
    opts.userns_options.uids.extend(uids)
    opts.userns_options.gids.extend(gids)
    for k, v in ns.items():
        setattr(opts, k, v)
    return c


def everything(kind: str) -> list[tuple[int, int]]:
    return [(0, 1 << 32)]


def check(config: pb.PodSandboxConfig) -> str:
    with pytest.raises(InvalidArgument) as info:
        namespaces.check_userns(config, own_ranges=everything)
    return str(info.value)


def test_no_options_and_node_mode_are_the_node_user_namespace() -> None:
    plain = pb.PodSandboxConfig()
    namespaces.check_userns(plain, own_ranges=everything)
    assert namespaces.pod_userns(plain) is None  # POD is enum value 0: absence must not read as POD
    node = pod(pb.NODE, uids=(), gids=())
    namespaces.check_userns(node, own_ranges=everything)
    assert namespaces.pod_userns(node) is None
    assert "uids/gids must be empty" in check(pod(pb.NODE))


@pytest.mark.parametrize("config, where", [
    (pod(pb.CONTAINER, (), ()), "userns_options.mode: CONTAINER"),
    (pod(pb.TARGET, (), ()), "userns_options.mode: TARGET"),
    (pod(uids=(RANGE, pb.IDMapping(container_id=0, host_id=400000, length=10))), "userns_options.uids: 2 mappings"),
    (pod(gids=()), "userns_options.gids: 0 mappings"),
    (pod(uids=(pb.IDMapping(container_id=1, host_id=1000, length=100000),)), "uids[0].container_id"),
    (pod(uids=(pb.IDMapping(container_id=0, host_id=0, length=65536),)), "uids[0].host_id"),
    (pod(gids=(pb.IDMapping(container_id=0, host_id=5, length=0),)), "gids[0].length"),
    (pod(network=pb.NODE), "node's network namespace"),
    (pod(pid=pb.NODE), "node's pid namespace"),
])
def test_refused_options_name_the_field(config, where: str) -> None:
    assert where in check(config)


def test_host_ids_outside_our_own_user_namespace_are_refused() -> None:
    msg = None
    with pytest.raises(InvalidArgument) as info:
        namespaces.check_userns(pod(), own_ranges=lambda kind: [(0, 100000)])
    msg = str(info.value)
    assert "200000..265535" in msg and "uid_map" in msg


@pytest.mark.parametrize("host_id, refused", [(1, True), (999, True), (1000, False), (65536, False)])
def test_host_ids_of_the_nodes_system_accounts_are_refused(host_id: int, refused: bool) -> None:
    """host id 1 was accepted: it maps the node's system users (daemon, bin, ...) into the pod. critest maps from
    1000 (0 1000 100000), kubelet from 65536."""
    rng = pb.IDMapping(container_id=0, host_id=host_id, length=100000)
    config = pod(uids=(rng,), gids=(rng,))
    if refused:
        with pytest.raises(InvalidArgument, match=r"uids\[0\].host_id: .*system uids 0..999"):
            namespaces.check_userns(config, own_ranges=everything, system_id_max=lambda kind: 999)
    else:
        namespaces.check_userns(config, own_ranges=everything, system_id_max=lambda kind: 999)


def test_system_id_max_is_read_from_login_defs(tmp_path) -> None:
    defs = tmp_path / "login.defs"
    defs.write_text("#SYS_UID_MAX 1\nSYS_UID_MAX\t\t499\nSYS_GID_MAX 599\n")
    assert namespaces._system_id_max("uid_map", str(defs)) == 499
    assert namespaces._system_id_max("gid_map", str(defs)) == 599
    assert namespaces._system_id_max("uid_map", str(tmp_path / "missing")) == namespaces.SYSTEM_ID_MAX


def test_sandbox_spec_makes_the_pod_user_namespace(tmp_path, rootfs) -> None:  # noqa: F811
    spec = builder.sandbox_spec(sctx(tmp_path, rootfs, config=pod()))
    linux = spec["linux"]
    assert {"type": "user"} in linux["namespaces"] and {"type": "cgroup"} in linux["namespaces"]
    assert linux["uidMappings"] == linux["gidMappings"] == [{"containerID": 0, "hostID": 200000, "size": 65536}]
    assert spec["annotations"][namespaces.ROOTFS_IDMAP_ANNOTATION] == "true"
    shm = next(m for m in spec["mounts"] if m["destination"] == "/dev/shm")
    assert shm["type"] == "bind" and "idmap" not in shm["options"]  # the pod's tmpfs, 1777: usable as it is


def test_container_spec_joins_the_pause_user_namespace(tmp_path, rootfs) -> None:  # noqa: F811
    config = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c"), image=pb.ImageSpec(image="img"),
                                mounts=[pb.Mount(container_path="/vol", host_path=str(tmp_path))])
    config.linux.security_context.namespace_options.CopyFrom(pod().linux.security_context.namespace_options)
    spec = builder.container_spec(cctx(tmp_path, rootfs, config=config, sandbox_config=pod()))
    linux = spec["linux"]
    assert {"type": "user", "path": "/proc/4242/ns/user"} in linux["namespaces"]
    assert "uidMappings" not in linux  # the pause's namespace has them
    assert spec["annotations"][namespaces.ROOTFS_IDMAP_ANNOTATION] == "true"
    vol = next(m for m in spec["mounts"] if m["destination"] == "/vol")
    assert "idmap" in vol["options"]
    hosts = next(m for m in spec["mounts"] if m["destination"] == "/etc/hosts")
    assert "idmap" in hosts["options"]
    assert spec["ociVersion"] == "1.2.0"   # the idmap mount option is 1.2's


def test_specs_without_newer_fields_keep_the_baseline_version(tmp_path, rootfs) -> None:  # noqa: F811
    """Only a spec that needs 1.2 says 1.2.0: crun 1.8 refuses any 1.2 spec ("unknown version specified")."""
    assert builder.container_spec(cctx(tmp_path, rootfs))["ociVersion"] == "1.0.2"
    assert builder.sandbox_spec(sctx(tmp_path, rootfs))["ociVersion"] == "1.0.2"


def test_container_userns_must_agree_with_the_pod(tmp_path, rootfs) -> None:  # noqa: F811
    config = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c"), image=pb.ImageSpec(image="img"))
    config.linux.security_context.namespace_options.userns_options.mode = pb.NODE
    with pytest.raises(InvalidArgument, match="userns_options.mode"):
        builder.container_spec(cctx(tmp_path, rootfs, config=config, sandbox_config=pod()))


def test_node_mode_specs_are_unchanged(tmp_path, rootfs) -> None:  # noqa: F811
    spec = builder.container_spec(cctx(tmp_path, rootfs))
    assert all(n["type"] != "user" for n in spec["linux"]["namespaces"])
    assert namespaces.ROOTFS_IDMAP_ANNOTATION not in spec["annotations"]
    assert not any("idmap" in m.get("options", ()) for m in spec["mounts"])


def test_a_volume_with_its_own_mappings_becomes_an_idmapped_mount(tmp_path, rootfs) -> None:  # noqa: F811
    m = pb.Mount(container_path="/v", host_path=str(tmp_path),
                 uidMappings=[pb.IDMapping(container_id=0, host_id=300000, length=10)],
                 gidMappings=[pb.IDMapping(container_id=0, host_id=300000, length=10)])
    config = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c"), image=pb.ImageSpec(image="img"), mounts=[m])
    spec = builder.container_spec(cctx(tmp_path, rootfs, config=config))
    v = next(x for x in spec["mounts"] if x["destination"] == "/v")
    assert "idmap" in v["options"] and v["uidMappings"] == [{"containerID": 0, "hostID": 300000, "size": 10}]
