"""RunPodSandbox: create and start a pod sandbox, ready when the call returns.

In order, each with its undo: reserve the name and write the record ahead (state creating), the pod's
directories and files (hostname, hosts, resolv.conf), its /dev/shm, the sandbox image (imported or pulled), the
pinned network namespace and CNI ADD (with port mappings), the pause container's bundle (rootfs snapshot and
config.json from the spec builder), its shim, task Create and Start; then the record turns ready in one
transaction. Any failure undoes every step that succeeded, so nothing is left behind.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import time

from cri_server import fsutil, podfiles, trace
from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.errors import CriError, FailedPrecondition, Internal, InvalidArgument, Unavailable, image_failure
from cri_server.images.errors import ImageError
from cri_server.rpc.bundle import prepare_rootfs
from cri_server.network import netns
from cri_server.network.cni import Attachment, CniError, PortMapping, pod_cni_args
from cri_server.rpc import events, listing
from cri_server.spec.builder import sandbox_spec
from cri_server.spec.context import ImageConfig, SandboxContext
from cri_server.store.records import SandboxRecord, SandboxState
from cri_server.store.store import sandbox_name
from cri_server.tasks import discard_task
from cri_server.undo import Undo
from cri_server.validation import check_request

log = logging.getLogger(__name__)

SHM_OPTIONS = "mode=1777,size=65536k"
_PROTOCOLS = {pb.TCP: "tcp", pb.UDP: "udp", pb.SCTP: "sctp"}


def new_id() -> str:
    return secrets.token_hex(32)


def validate(config: pb.PodSandboxConfig) -> None:
    if not config.HasField("metadata"):
        raise InvalidArgument("config.metadata: missing")
    md = config.metadata
    for field in ("name", "uid", "namespace"):
        if not getattr(md, field):
            raise InvalidArgument(f"config.metadata.{field}: must not be empty")
    if config.log_directory and not config.log_directory.startswith("/"):
        raise InvalidArgument(f"config.log_directory: {config.log_directory!r} must be an absolute path")
    for i, pm in enumerate(config.port_mappings):
        if not 0 < pm.container_port < 65536:
            raise InvalidArgument(f"config.port_mappings[{i}].container_port: {pm.container_port} is not a port")
        if not 0 <= pm.host_port < 65536:
            raise InvalidArgument(f"config.port_mappings[{i}].host_port: {pm.host_port} is not a port")
        if pm.protocol not in _PROTOCOLS:
            raise InvalidArgument(f"config.port_mappings[{i}].protocol: unknown value {pm.protocol}")
    from cri_server.spec.namespaces import check_userns
    check_userns(config)  # before anything is made: mode, one range from container id 0, no host root


def port_mappings(config: pb.PodSandboxConfig) -> tuple[PortMapping, ...]:
    """CRI port mappings with a host port, as the portmap plugin takes them (host port 0 = none)."""
    return tuple(PortMapping(pm.host_port, pm.container_port, _PROTOCOLS[pm.protocol], pm.host_ip)
                 for pm in config.port_mappings if pm.host_port)


def host_network(config: pb.PodSandboxConfig) -> bool:
    return config.linux.security_context.namespace_options.network == pb.NODE


def attachment(svc: Services, rec: SandboxRecord, config: pb.PodSandboxConfig) -> Attachment:
    return Attachment(container_id=rec.id, netns_path=rec.netns_path,
                      args=pod_cni_args(rec.pod_name, rec.pod_namespace, rec.pod_uid, rec.id),
                      port_mappings=port_mappings(config))


async def ensure_image(svc: Services, ref: str, tr: trace.Trace | None = None) -> object:
    """The sandbox image: already imported (scripts/start builds it locally) or pulled now (step "image.pull")."""
    images = svc.need_images()
    rec = images.get(ref)
    if rec is None:
        try:
            with tr.step("image.pull") if tr is not None else contextlib.nullcontext():
                rec = await images.pull(ref)
        except ImageError as e:
            raise image_failure(f"sandbox image {ref}: {e}", e, Unavailable) from None
    # Pinned, as containerd pins its sandbox image: kubelet's image GC skips pinned images; it removed the pause
    # image whenever no container used it, and the next pod had to pull it again.
    return rec if rec.pinned else images.set_pinned(rec.id, True)  # type: ignore[attr-defined]


async def run_pod_sandbox(svc: Services, req: pb.RunPodSandboxRequest) -> pb.RunPodSandboxResponse:
    """RunPodSandbox creates and starts a pod-level sandbox; the sandbox is READY when this returns."""
    check_request(req)
    config = req.config
    validate(config)
    listing.check_sandbox_room(svc, req)
    runtime = svc.runtime_for(req.runtime_handler)
    shims = svc.need_shims()
    images = svc.need_images()
    host = svc.host
    if host is None:
        raise FailedPrecondition("host information was not detected")
    md = config.metadata
    sid = new_id()
    name = sandbox_name(md.name, md.namespace, md.uid, md.attempt)
    tr = trace.Trace("sandbox", sid, f"{md.namespace}/{md.name}", svc.config.trace.slow_step_seconds)
    with tr.step("reserve_name"):
        svc.store.reserve_sandbox_name(name, sid)
    undo = Undo(sid)
    undo.push("release the name", svc.store.release_sandbox_name, name, sid)
    try:
        async with svc.locks.hold(sid):
            resp = await _create(svc, req, sid, name, runtime, shims, images, host, undo, tr)
        undo.discard()
        return resp
    except BaseException as e:
        if not isinstance(e, (CriError, asyncio.CancelledError)):
            log.exception("RunPodSandbox failed", extra={"id": sid})
        await undo.run()
        tr.failed_with(e)
        trace.save_failed(svc.store, tr)
        raise


async def _create(svc: Services, req: pb.RunPodSandboxRequest, sid: str, name: str, runtime: str,
                  shims: object, images: object, host: object, undo: Undo,
                  tr: trace.Trace) -> pb.RunPodSandboxResponse:
    config = req.config
    md = config.metadata
    store = svc.store
    use_host_net = host_network(config)
    ns_opts = config.linux.security_context.namespace_options
    pod_dir, state_dir, bundle = svc.pod_dir(sid), svc.pod_state_dir(sid), svc.bundle_dir(sid)
    netns_path = "" if use_host_net else os.path.join(svc.config.netns_dir, sid)
    rec = SandboxRecord(
        id=sid, name=name, pod_name=md.name, pod_uid=md.uid, pod_namespace=md.namespace, attempt=md.attempt,
        state=SandboxState.CREATING, created_at=time.time_ns(), runtime_handler=req.runtime_handler,
        labels=dict(config.labels), annotations=dict(config.annotations), config=config.SerializeToString(),
        netns_path=netns_path, cgroup_parent=config.linux.cgroup_parent, pod_dir=pod_dir,
        extra={"runtime": runtime, "bundle": bundle, "state_dir": state_dir})
    # Written ahead: a husk-cri that dies half-way finds this record and tears the rest down at start.
    with tr.step("record"):
        store.put_sandbox(rec)
    undo.push("delete the record", store.delete_sandbox, sid)

    # The pod's directories and files.
    with tr.step("pod_files"):
        for d in (pod_dir, state_dir):
            os.makedirs(d, mode=0o711, exist_ok=True)
        undo.push("remove the pod dirs", _remove_dirs, pod_dir, state_dir)
        hostname = config.hostname if not use_host_net else ""
        files = {"hostname_path": os.path.join(pod_dir, "hostname"), "hosts_path": os.path.join(pod_dir, "hosts"),
                 "resolv_path": os.path.join(pod_dir, "resolv.conf")}
        podfiles.write_atomic(files["resolv_path"], podfiles.resolv_conf(
            config.dns_config if config.HasField("dns_config") else None))
        podfiles.write_atomic(files["hostname_path"], podfiles.hostname_file(config.hostname or _node_hostname()))
        shm_path = ""
        if ns_opts.ipc != pb.NODE:
            shm_path = os.path.join(state_dir, "shm")
            from runtime.linux import syscalls
            fsutil.mount_tmpfs(shm_path, SHM_OPTIONS, syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC)

    # The sandbox image.
    image_ref = svc.config.runtime.sandbox_image
    with tr.step("image"):
        image = await ensure_image(svc, image_ref, tr)

    # The network.
    ips: list[str] = []
    if not use_host_net:
        status = svc.cni.status()
        if not status.ready:
            raise FailedPrecondition(f"the pod network is not ready: {status.message}")
        with tr.step("netns"):
            await asyncio.to_thread(netns.create, netns_path)
        undo.push("remove the network namespace", netns.remove, netns_path)
        att = attachment(svc, rec, config)
        with tr.step("cni"):
            try:
                result = await svc.cni.add(att, trace=tr)
            except CniError as e:
                raise Internal(f"set up the pod network: {e}") from None
        undo.push("CNI DEL", svc.cni.delete, att)
        ips = result.pod_ips(att.ifname)
        podfiles.write_atomic(files["hosts_path"], podfiles.hosts(hostname, ips))
    else:
        podfiles.write_atomic(files["hosts_path"], _host_file("/etc/hosts"))

    # The pause container's bundle.
    with tr.step("rootfs"):
        rootfs = await prepare_rootfs(images, undo, bundle, sid, image.id, f"sandbox rootfs from {image_ref}")
    with tr.step("spec"):
        ctx = SandboxContext(id=sid, config=config, image=ImageConfig.from_oci(_oci_config(image)), rootfs=rootfs,
                             host=host, netns_path=netns_path, shm_path=shm_path, image_name=image_ref,
                             runtime_handler=req.runtime_handler)
        spec = sandbox_spec(ctx)
        podfiles.write_atomic(os.path.join(bundle, "config.json"), json.dumps(spec))

    # Its shim and task.
    with tr.step("shim_spawn"):
        shim_pid, address = await shims.spawn(sid, bundle, runtime)
    undo.push("discard the task", discard_task, svc, sid, address, runtime, shim_pid)
    try:
        with tr.step("runtime_create"):
            trace.request_runtime_stages(bundle)
            try:
                created = await shims.call(sid, address, "Create", id=sid, bundle=bundle, stdin="", stdout="",
                                           stderr="", terminal=False, options=shims.create_options())
            finally:
                trace.add_runtime_stages(tr, bundle)
        with tr.step("runtime_start"):
            await shims.call(sid, address, "Start", id=sid)
    except Exception as e:  # noqa: BLE001 -- a runtime failure: the message is the runtime's
        from shim import ttrpc_wire as w
        if isinstance(e, w.TtrpcError):
            raise Internal(f"start the sandbox container: {e.message}") from None
        raise

    extra = dict(rec.extra, shim_pid=shim_pid, image_id=image.id, hostname=hostname, shm_path=shm_path, **files)
    extra[trace.KEY] = tr.to_json()
    final = dataclasses.replace(rec, state=SandboxState.READY, pid=int(created.pid), ips=tuple(ips),
                                shim_address=address, extra=extra)
    store.put_sandbox(final)
    svc.need_tasks().watch(sid)
    events.publish_sandbox(svc, sid, "started")
    log.info("pod sandbox ready", extra={"id": sid, "pod": f"{md.namespace}/{md.name}", "ips": ips})
    return pb.RunPodSandboxResponse(pod_sandbox_id=sid)


def _remove_dirs(*dirs: str) -> None:
    for d in dirs:
        fsutil.remove_tree(d)


def _node_hostname() -> str:
    import socket
    return socket.gethostname()


def _host_file(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _oci_config(image: object) -> dict:
    """The image's OCI config object (Entrypoint, Cmd, Env, ...) as the spec builder reads it."""
    c = image.config  # type: ignore[attr-defined]
    return {"Entrypoint": list(c.entrypoint), "Cmd": list(c.cmd), "Env": list(c.env),
            "WorkingDir": c.working_dir, "User": c.user, "StopSignal": c.stop_signal}
