"""cri_server/validation.py: a table of hostile strings per RPC field, each refused with InvalidArgument naming
the field; ordinary kubelet and critest requests pass. Also what goes with it: the List size budget and the
listing cache dropping removed records (rpc/listing.py), lexical cleaning of host paths (spec/mounts.py)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import re

import pytest

from cri_server.api.v1 import api_pb2 as pb
from cri_server.config import Config
from cri_server.context import Services
from cri_server.errors import InvalidArgument, ResourceExhausted
from cri_server.network.cni import CniManager
from cri_server.oom import OomScorePolicy
from cri_server.rpc import container_exec, container_status, images, listing, sandbox_run, sandbox_status, streaming
from cri_server.spec import mounts
from cri_server.store.records import ContainerRecord, ContainerState, SandboxRecord, SandboxState
from cri_server.store.store import Store
from cri_server.validation import check_request
from tests.unit.test_cri_spec import apply, cctx


def pod(**kw) -> pb.PodSandboxConfig:
    c = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="web-7d4b9c-x2x9z", namespace="default",
                                                           uid="0b4f5a43-6f2e-4b9a-9a57-5d1c7e1f0a11"),
                            hostname="web-7d4b9c-x2x9z", log_directory="/var/log/pods/default_web_0b4f",
                            dns_config=pb.DNSConfig(servers=["10.96.0.10"], searches=["default.svc.cluster.local"],
                                                    options=["ndots:5"]),
                            port_mappings=[pb.PortMapping(container_port=80, host_port=8080, host_ip="0.0.0.0")],
                            labels={"io.kubernetes.pod.name": "web-7d4b9c-x2x9z", "app": "web"},
                            annotations={"kubernetes.io/config.source": "api"})
    c.linux.cgroup_parent = "/kubepods/besteffort/pod0b4f"
    c.linux.sysctls["net.ipv4.ip_unprivileged_port_start"] = "0"
    return _set(c, kw)


def _set(msg, fields: dict):
    """`msg` with `fields` set: messages replaced, lists replaced, maps added to."""
    for k, v in fields.items():
        if isinstance(v, dict):
            getattr(msg, k).update(v)
        elif isinstance(v, list):
            del getattr(msg, k)[:]
            getattr(msg, k).extend(v)
        elif hasattr(v, "DESCRIPTOR"):
            getattr(msg, k).CopyFrom(v)
        else:
            setattr(msg, k, v)
    return msg


def container(**kw) -> pb.ContainerConfig:
    c = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="container-with-ReadOnlyRootfs-true-test-"
                                                              "6a0f3c1e-2b7d-4f58-9e0a-3c2d1b4a5f60"),
                           image=pb.ImageSpec(image="docker.io/library/busybox:latest"),
                           command=["sh", "-c"], args=["sleep 3600"], working_dir="/",
                           envs=[pb.KeyValue(key="PATH", value=b"/bin"), pb.KeyValue(key="X", value=b"\xff")],
                           mounts=[pb.Mount(container_path="/data", host_path="/var/lib/kubelet/pods/x/v")],
                           devices=[pb.Device(container_path="/dev/fuse", host_path="/dev/fuse", permissions="rwm")],
                           labels={"io.kubernetes.container.name": "main"}, log_path="main/0.log",
                           annotations={"io.kubernetes.container.hash": "5d1c"})
    c.linux.security_context.masked_paths.append("/proc/kcore")
    return _set(c, kw)


ID = "a" * 64


def run(config: pb.PodSandboxConfig) -> pb.RunPodSandboxRequest:
    return pb.RunPodSandboxRequest(config=config)


def create(config: pb.ContainerConfig) -> pb.CreateContainerRequest:
    return pb.CreateContainerRequest(pod_sandbox_id=ID, config=config, sandbox_config=pod())


def _md(**kw) -> pb.PodSandboxMetadata:
    base = dict(name="p", namespace="ns", uid="u")
    base.update(kw)
    return pb.PodSandboxMetadata(**base)


def _with_mount(**kw) -> pb.ContainerConfig:
    c = container()
    c.mounts.append(pb.Mount(**kw))
    return c


def _with_sc(**kw) -> pb.ContainerConfig:
    c = container()
    for k, v in kw.items():
        getattr(c.linux.security_context, k).extend(v) if isinstance(v, list) else \
            setattr(c.linux.security_context, k, v)
    return c


# (request, the field the message must start with, a piece of the reason)
HOSTILE = [
    (run(pod(metadata=_md(name="a\0b"))), "config.metadata.name", "NUL"),
    (run(pod(metadata=_md(namespace="n\0"))), "config.metadata.namespace", "NUL"),
    (run(pod(metadata=_md(uid="\0"))), "config.metadata.uid", "NUL"),
    (run(pod(metadata=_md(name="n" * 254))), "config.metadata.name", "254 characters, at most 253"),
    (run(pod(metadata=_md(namespace="n" * 64))), "config.metadata.namespace", "64 characters, at most 63"),
    (run(pod(hostname="h" * 10000)), "config.hostname", "10000 characters, at most 64"),
    (run(pod(hostname="é" * 33)), "config.hostname", "66 bytes (UTF-8), at most 64"),
    (run(pod(hostname="a\0")), "config.hostname", "NUL"),
    (run(pod(log_directory="/var/log/pods/\0")), "config.log_directory", "NUL"),
    (run(pod(log_directory="/" + "d" * 4096)), "config.log_directory", "4097 characters, at most 4096"),
    (run(pod(dns_config=pb.DNSConfig(servers=["1.1.1.1", "8.8.8.8\0"]))), "config.dns_config.servers[1]", "NUL"),
    (run(pod(dns_config=pb.DNSConfig(searches=["s" * 300]))), "config.dns_config.searches[0]", "at most 253"),
    (run(pod(port_mappings=[pb.PortMapping(container_port=1, host_ip="::1\0")])),
     "config.port_mappings[0].host_ip", "NUL"),
    (run(pod(labels={"a\0": "b"})), "config.labels: key 'a\\x00'", "NUL"),
    (run(pod(labels={"a": "b\0"})), "config.labels['a']", "NUL"),
    (run(pod(annotations={"x": "y" * (272 << 10)})), "config.annotations", "at most 278528"),
    (run(pod(annotations={f"k{i}": "v" * 1000 for i in range(300)})), "config.annotations", "at most 278528"),
    (run(pod(labels={"k" * 5000: "v"})), "config.labels: key", "5000 characters, at most 4096"),
    (run(pod(linux=pb.LinuxPodSandboxConfig(cgroup_parent="/kubepods\0"))), "config.linux.cgroup_parent", "NUL"),
    (run(pod(linux=pb.LinuxPodSandboxConfig(sysctls={"kernel.shm_rmid_forced": "1\0"}))),
     "config.linux.sysctls['kernel.shm_rmid_forced']", "NUL"),
    (run(pod(linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
        seccomp=pb.SecurityProfile(profile_type=pb.SecurityProfile.Localhost, localhost_ref="/p\0"))))),
     "config.linux.security_context.seccomp.localhost_ref", "NUL"),
    (pb.RunPodSandboxRequest(config=pod(), runtime_handler="runc\0"), "runtime_handler", "NUL"),
    (create(container(metadata=pb.ContainerMetadata(name="c\0"))), "config.metadata.name", "NUL"),
    (create(container(image=pb.ImageSpec(image="busybox\0"))), "config.image.image", "NUL"),
    (create(container(command=["sh\0"])), "config.command[0]", "NUL"),
    (create(container(args=["ok", "a" * (128 << 10 | 1)])), "config.args[1]", "131073 characters, at most 131072"),
    (create(container(args=["-c", "x\0y"])), "config.args[1]", "NUL"),
    (create(container(working_dir="/w\0")), "config.working_dir", "NUL"),
    (create(container(envs=[pb.KeyValue(key="K\0", value=b"v")])), "config.envs[0].key", "NUL"),
    (create(container(envs=[pb.KeyValue(key="K", value=b"v"), pb.KeyValue(key="L", value=b"\0")])),
     "config.envs[1].value", "NUL"),
    (create(_with_mount(container_path="/m\0", host_path="/h")), "config.mounts[1].container_path", "NUL"),
    (create(_with_mount(container_path="/m", host_path="/h\0")), "config.mounts[1].host_path", "NUL"),
    (create(container(devices=[pb.Device(container_path="/dev/x", host_path="/dev/\0x")])),
     "config.devices[0].host_path", "NUL"),
    (create(container(devices=[pb.Device(container_path="/dev/x", host_path="/dev/x", permissions="rwmrwm")])),
     "config.devices[0].permissions", "at most 3"),
    (create(container(log_path="main/0.log\0")), "config.log_path", "NUL"),
    (create(container(labels={"l": "\0"})), "config.labels['l']", "NUL"),
    (create(container(annotations={"big": "x" * (10 << 20)})), "config.annotations", "at most 278528"),
    (create(_with_sc(masked_paths=["/proc/\0"])), "config.linux.security_context.masked_paths[1]", "NUL"),
    (create(_with_sc(apparmor_profile="runtime/default\0")), "config.linux.security_context.apparmor_profile",
     "NUL"),
    (create(_with_sc(run_as_username="root\0")), "config.linux.security_context.run_as_username", "NUL"),
    (pb.CreateContainerRequest(pod_sandbox_id="a\0", config=container()), "pod_sandbox_id", "NUL"),
    (pb.ExecSyncRequest(container_id=ID, cmd=[]), "cmd", "must not be empty"),
    (pb.ExecSyncRequest(container_id=ID, cmd=[""]), "cmd[0]", "must not be empty"),
    (pb.ExecSyncRequest(container_id=ID, cmd=["ls", "a\0b"]), "cmd[1]", "NUL"),
    (pb.ExecSyncRequest(container_id="x" * 300, cmd=["ls"]), "container_id", "at most 256"),
    (pb.ExecRequest(container_id=ID, cmd=[""]), "cmd[0]", "must not be empty"),
    (pb.ExecRequest(container_id=ID, cmd=["sh\0"]), "cmd[0]", "NUL"),
    (pb.AttachRequest(container_id="\0"), "container_id", "NUL"),
    (pb.PortForwardRequest(pod_sandbox_id="\0"), "pod_sandbox_id", "NUL"),
    (pb.ReopenContainerLogRequest(container_id="c\0"), "container_id", "NUL"),
    (pb.UpdateContainerResourcesRequest(container_id=ID, linux=pb.LinuxContainerResources(cpuset_cpus="0\0")),
     "linux.cpuset_cpus", "NUL"),
    (pb.UpdateContainerResourcesRequest(container_id=ID, linux=pb.LinuxContainerResources(
        unified={"memory.high": "max\0"})), "linux.unified['memory.high']", "NUL"),
    (pb.PullImageRequest(image=pb.ImageSpec(image="busybox\0")), "image.image", "NUL"),
    (pb.PullImageRequest(image=pb.ImageSpec(image="b" * 2000)), "image.image", "2000 characters, at most 1024"),
    (pb.PullImageRequest(image=pb.ImageSpec(image="busybox"), auth=pb.AuthConfig(password="p\0")),
     "auth.password", "NUL"),
    (pb.ImageStatusRequest(image=pb.ImageSpec(image="\0")), "image.image", "NUL"),
    (pb.RemoveImageRequest(image=pb.ImageSpec(image="\0")), "image.image", "NUL"),
]


@pytest.mark.parametrize("req,field,reason", HOSTILE,
                         ids=[f"{type(r).__name__}:{f}:{re.sub(r'[^a-z0-9]+', '-', w.lower())}"
                              for r, f, w in HOSTILE])
def test_hostile_strings_are_refused_naming_the_field(req, field, reason):
    with pytest.raises(InvalidArgument) as e:
        check_request(req)
    assert e.value.message.startswith(f"{field}") and reason in e.value.message, e.value.message
    assert len(e.value.message) < 300                  # the value itself is never echoed whole


@pytest.mark.parametrize("req", [
    run(pod()), create(container()), pb.ExecSyncRequest(container_id=ID, cmd=["ls", "-l"], timeout=5),
    pb.ExecRequest(container_id=ID, cmd=["sh"], stdin=True, tty=True), pb.AttachRequest(container_id=ID),
    pb.PortForwardRequest(pod_sandbox_id=ID, port=[80]), pb.ReopenContainerLogRequest(container_id=ID),
    pb.PullImageRequest(image=pb.ImageSpec(image="registry.k8s.io/pause:3.9@sha256:" + "0" * 64)),
    run(pod(annotations={f"k{i}": "v" * 1000 for i in range(250)})),    # 250 kB: within Kubernetes' limit
    run(pod(metadata=_md(name="n" * 253, namespace="n" * 63, uid="u" * 253), hostname="h" * 64)),
    create(container(args=["a" * (128 << 10)])),
    pb.StartContainerRequest(container_id=ID), pb.ListPodSandboxRequest(),
], ids=lambda r: type(r).__name__)
def test_ordinary_requests_pass(req):
    check_request(req)


def test_the_sandbox_config_create_container_repeats_is_not_checked():
    """husk-cri uses the stored config of the pod (which passed RunPodSandbox); the copy is not read."""
    check_request(pb.CreateContainerRequest(pod_sandbox_id=ID, config=container(),
                                            sandbox_config=pod(hostname="h" * 100)))


@pytest.mark.parametrize("handler,req", [
    (sandbox_run.run_pod_sandbox, run(pod(hostname="h" * 10000))),
    (container_exec.exec_sync, pb.ExecSyncRequest(container_id=ID, cmd=[""])),
    (container_exec.reopen_container_log, pb.ReopenContainerLogRequest(container_id="\0")),
    (container_exec.update_container_resources, pb.UpdateContainerResourcesRequest(container_id="\0")),
    (streaming.exec_, pb.ExecRequest(container_id=ID, cmd=["a\0"])),
    (streaming.attach, pb.AttachRequest(container_id="\0")),
    (streaming.port_forward, pb.PortForwardRequest(pod_sandbox_id="\0")),
    (images.pull_image, pb.PullImageRequest(image=pb.ImageSpec(image="x\0"))),
    (sandbox_status.update_pod_sandbox_resources, pb.UpdatePodSandboxResourcesRequest(pod_sandbox_id="\0")),
], ids=lambda x: getattr(x, "__name__", ""))
def test_handlers_check_first(handler, req):
    """Each handler refuses before touching anything: a Services with nothing in it is enough."""
    with pytest.raises(InvalidArgument):
        asyncio.run(handler(None, req))


# --- List responses: the budget and the cache ------------------------------------------------------------


@pytest.fixture
def svc(tmp_path):
    store = Store(str(tmp_path / "meta.db"))
    yield Services(config=Config(), store=store, cni=CniManager(str(tmp_path), [], str(tmp_path)),
                   oom=OomScorePolicy(-1000))
    store.close()


def _sandbox(i: int, **kw) -> SandboxRecord:
    return SandboxRecord(id=f"{i:064x}", name=f"n{i}", pod_name=f"p{i}", pod_uid=f"u{i}", pod_namespace="ns",
                         attempt=0, state=SandboxState.READY, created_at=i + 1, **kw)


def test_a_pod_that_would_overflow_the_list_is_refused(svc):
    big = {f"k{i}": "v" * 1000 for i in range(250)}        # ~250 kB each: allowed one by one
    n = listing.LIST_BUDGET // (250 * 1006)
    for i in range(n):
        svc.store.put_sandbox(_sandbox(i, annotations=big))
    with pytest.raises(ResourceExhausted) as e:
        listing.check_sandbox_room(svc, run(pod(annotations=big)))
    assert "past" in e.value.message and "16 MiB" in e.value.message
    listing.check_sandbox_room(svc, run(pod()))            # a small pod still fits
    resp = asyncio.run(sandbox_status.list_pod_sandbox(svc, pb.ListPodSandboxRequest()))
    assert len(resp.items) == n and resp.ByteSize() < listing.MESSAGE_LIMIT


def test_a_container_that_would_overflow_the_list_is_refused(svc):
    svc.store.put_sandbox(_sandbox(0))
    big = {f"k{i}": "v" * 1000 for i in range(250)}
    for i in range(listing.LIST_BUDGET // (250 * 1006)):
        svc.store.put_container(ContainerRecord(id=f"{i:064x}", sandbox_id=f"{0:064x}", name=f"c{i}",
                                                container_name="c", attempt=i, state=ContainerState.EXITED,
                                                created_at=1, image="busybox", image_ref="sha256:a",
                                                image_id="sha256:a", annotations=big))
    with pytest.raises(ResourceExhausted):
        listing.check_container_room(svc, create(container(annotations=big)))
    listing.check_container_room(svc, create(container()))


def test_pods_and_containers_share_one_budget_for_list_pod_sandbox_stats(svc):
    """ListPodSandboxStats carries each pod's and each of its containers' labels and annotations: half the
    budget in pods and half in containers was accepted, and that response went past 16 MiB."""
    big = {f"k{i}": "v" * 1000 for i in range(250)}
    half = listing.LIST_BUDGET // (250 * 1006) // 2 + 1
    for i in range(half):
        svc.store.put_sandbox(_sandbox(i, annotations=big))
        svc.store.put_container(ContainerRecord(id=f"{i:064x}", sandbox_id=f"{i:064x}", name=f"c{i}",
                                                container_name="c", attempt=0, state=ContainerState.RUNNING,
                                                created_at=1, image="busybox", image_ref="sha256:a",
                                                image_id="sha256:a", annotations=big))
    with pytest.raises(ResourceExhausted, match="ListPodSandboxStats"):
        listing.check_sandbox_room(svc, run(pod(annotations=big)))
    with pytest.raises(ResourceExhausted, match="ListPodSandboxStats"):
        listing.check_container_room(svc, create(container(annotations=big)))


def test_removed_records_leave_the_listing_cache_at_once(svc):
    """Two pods with big annotations, then removed: their encodings must not stay in memory (the cache was
    pruned only past 64 entries, so a node with few pods kept them for good)."""
    for i in range(3):
        svc.store.put_sandbox(_sandbox(i, annotations={"a": "x" * (200 << 10)} if i else {}))
    asyncio.run(sandbox_status.list_pod_sandbox(svc, pb.ListPodSandboxRequest()))
    assert len(sandbox_status.list_items) == 3
    for i in (1, 2):
        svc.store.delete_sandbox(_sandbox(i).id)
    asyncio.run(sandbox_status.list_pod_sandbox(svc, pb.ListPodSandboxRequest(
        filter=pb.PodSandboxFilter(id=_sandbox(0).id))))
    assert len(sandbox_status.list_items) == 1


def test_container_list_cache_forgets_removed_containers(svc):
    svc.store.put_sandbox(_sandbox(0))
    rec = ContainerRecord(id="c" * 64, sandbox_id=_sandbox(0).id, name="c", container_name="c", attempt=0,
                          state=ContainerState.RUNNING, created_at=1, image="b", image_ref="r", image_id="i",
                          annotations={"a": "x" * 1000})
    svc.store.put_container(rec)
    asyncio.run(container_status.list_containers(svc, pb.ListContainersRequest()))
    svc.store.put_container(dataclasses.replace(rec, id="d" * 64, name="d"))
    svc.store.delete_container(rec.id)
    resp = asyncio.run(container_status.list_containers(svc, pb.ListContainersRequest()))
    assert [c.id for c in resp.containers] == ["d" * 64] and len(container_status.list_items) == 1


# --- host paths -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("given,clean", [("/a/b/../c", "/a/c"), ("/a/./b//c/", "/a/b/c"), ("//a/../../b", "/b"),
                                         ("/var/lib/kubelet/pods/x", "/var/lib/kubelet/pods/x")])
def test_host_paths_are_cleaned_lexically(given, clean, caplog):
    with caplog.at_level(logging.INFO, logger="cri_server.spec.mounts"):
        assert mounts.clean_host_path(given, "cid", "config.mounts[0]") == clean
    logged = [r for r in caplog.records if r.name == "cri_server.spec.mounts"]
    assert bool(logged) == (given != clean)
    assert all(getattr(r, "id", None) == "cid" and given in r.getMessage() for r in logged)


def test_dotdot_in_a_missing_host_path_creates_only_the_clean_path(tmp_path):
    """`<tmp>/made/../vol` used to create `<tmp>/made` too (os.makedirs walks the path as given)."""
    config = pb.ContainerConfig(mounts=[pb.Mount(container_path="/v", host_path=f"{tmp_path}/made/../vol")])
    spec = apply(mounts.with_cri_mounts, cctx(tmp_path, config=config))
    assert [m["source"] for m in spec["mounts"] if m["destination"] == "/v"] == [str(tmp_path / "vol")]
    assert (tmp_path / "vol").is_dir() and not (tmp_path / "made").exists()


def test_a_refused_request_is_not_held_by_the_abort():
    """grpc keeps the abort's exception in a reference cycle; neither it nor its context may reach the request
    (each refused 10 MB request stayed in husk-cri's memory until a full garbage collection)."""
    from cri_server.service import RuntimeServicer

    class Aborted(Exception):
        pass

    class Context:
        async def abort(self, code, message):
            raise Aborted(code, message)

    req = run(pod(hostname="h" * 100))
    servicer = RuntimeServicer(services=None)
    with pytest.raises(Aborted) as e:
        asyncio.run(servicer.RunPodSandbox(req, Context()))
    assert e.value.args[1].startswith("config.hostname: 100 characters")
    assert e.value.__context__ is None
    tb = e.value.__traceback__.tb_next        # past this test's own frame
    while tb is not None:
        assert not any(v is req for v in tb.tb_frame.f_locals.values()), tb.tb_frame.f_code.co_name
        tb = tb.tb_next
