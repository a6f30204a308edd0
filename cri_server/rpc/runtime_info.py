"""Version, Status, RuntimeConfig and UpdateRuntimeConfig: what kubelet asks before and while it runs pods.

Reads the config, the CNI manager and the run-time settings; changes nothing but the pod CIDR.
"""
from __future__ import annotations

import json
import logging

from cri_server.version import VERSION
from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services

log = logging.getLogger(__name__)

RUNTIME_NAME = "husk"
RUNTIME_API_VERSION = "v1"
# The version of the kubelet runtime API this server speaks; kubelet only checks that Version answers.
KUBE_API_VERSION = "0.1.0"


async def version(svc: Services, req: pb.VersionRequest) -> pb.VersionResponse:
    """Version returns the runtime name, its version and the CRI API version."""
    return pb.VersionResponse(version=KUBE_API_VERSION, runtime_name=RUNTIME_NAME,
                              runtime_version=VERSION, runtime_api_version=RUNTIME_API_VERSION)


async def status(svc: Services, req: pb.StatusRequest) -> pb.StatusResponse:
    """Status reports RuntimeReady and NetworkReady (false, with a reason, while CNI has no usable config),
    the runtime handlers and their features; `verbose` adds the effective configuration as JSON."""
    runtime_ready = pb.RuntimeCondition(type="RuntimeReady", status=True)
    net = svc.cni.status()
    network_ready = pb.RuntimeCondition(type="NetworkReady", status=net.ready,
                                        reason="" if net.ready else "NetworkPluginNotReady",
                                        message=net.message)
    handlers = [pb.RuntimeHandler(name=name, features=pb.RuntimeHandlerFeatures(
        recursive_read_only_mounts=False,
        user_namespaces=user_namespaces(_handler_runtime(svc, name), svc.config.paths.root)))
        for name in ["", *sorted(svc.config.runtime.handlers)]]
    resp = pb.StatusResponse(status=pb.RuntimeStatus(conditions=[runtime_ready, network_ready]),
                             runtime_handlers=handlers,
                             features=pb.RuntimeFeatures(supplemental_groups_policy=False,
                                                         user_namespaces_host_network=False))
    if req.verbose:
        from cri_server.config import to_dict
        resp.info["config"] = json.dumps(to_dict(svc.config))
        resp.info["cni"] = json.dumps({"ready": net.ready, "message": net.message, "config_file": net.config_file,
                                       "network": net.network_name, "pod_cidr": svc.settings.pod_cidr})
        resp.info["oomScoreAdjMinimum"] = str(svc.oom.minimum)
    return resp


_USERNS: dict[tuple[str, str], bool] = {}


def _handler_runtime(svc: Services, name: str) -> str:
    if not name:
        return svc.default_runtime
    from cri_server.context import shim_runtime
    return shim_runtime(svc.config.runtime.handlers[name])


def user_namespaces(runtime: str, root: str) -> bool:
    """Pods with their own user namespace (userns_options mode POD) need idmapped mounts: true when the
    runtime's features say so (`<runtime> features`: linux.mountExtensions.idmap.enabled, as containerd reads it;
    husk in-process: runtime.features), husk-cri runs as root and the kernel idmaps the filesystem of husk-cri's
    root directory (the snapshots' layers, the pod files; as critest probes it). Cached per runtime and root."""
    key = (runtime, root)
    if key not in _USERNS:
        import os
        ok, why = False, "husk-cri does not run as root"
        if os.geteuid() == 0:
            if runtime == "husk":
                from runtime.features import idmap_supported
                ok = idmap_supported()
            else:
                ok = _features_idmap(runtime)
            why = f"runtime {runtime} has no idmapped mounts"
            if ok:
                why = _fs_idmap_refusal(root)
                ok = not why
        _USERNS[key] = ok
        log.info("user namespaces for pods: %s", "supported" if ok else f"not supported: {why}",
                 extra={"runtime": runtime})
    return _USERNS[key]


def _fs_idmap_refusal(root: str) -> str:
    """"" when the kernel idmaps a bind of `root` (made if missing), else why not; in a subprocess (the probe
    forks, which a threaded gRPC server must not)."""
    import os
    import subprocess
    import sys
    try:
        os.makedirs(root, mode=0o711, exist_ok=True)
        cp = subprocess.run([sys.executable, "-m", "runtime.idmap", root], capture_output=True, text=True,
                            timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"probe: {e}"
    return "" if cp.returncode == 0 else (cp.stdout.strip() + " " + cp.stderr.strip()).strip()


def _features_idmap(runtime: str) -> bool:
    import subprocess
    try:
        cp = subprocess.run([runtime, "features"], capture_output=True, timeout=10, text=True)
        doc = json.loads(cp.stdout) if cp.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return False
    return bool(((doc.get("linux") or {}).get("mountExtensions") or {}).get("idmap", {}).get("enabled"))


async def runtime_config(svc: Services, req: pb.RuntimeConfigRequest) -> pb.RuntimeConfigResponse:
    """RuntimeConfig tells kubelet which cgroup driver to use (kubelet >= 1.28 with KubeletCgroupDriverFromCRI
    follows it): SYSTEMD with runtime.systemd_cgroup = true, CGROUPFS otherwise."""
    driver = pb.SYSTEMD if svc.config.runtime.systemd_cgroup else pb.CGROUPFS
    return pb.RuntimeConfigResponse(linux=pb.LinuxRuntimeConfiguration(cgroup_driver=driver))


async def update_runtime_config(svc: Services, req: pb.UpdateRuntimeConfigRequest) -> pb.UpdateRuntimeConfigResponse:
    """UpdateRuntimeConfig records the node's pod CIDR (kubelet sends it when the node gets one). It is kept in
    the metadata store and reported by verbose Status; the CNI config in the conf dir stays the authority."""
    cidr = req.runtime_config.network_config.pod_cidr
    if cidr and cidr != svc.settings.pod_cidr:
        _check_cidr(cidr)
        svc.settings.pod_cidr = cidr
        svc.store.set_meta("pod_cidr", cidr)
        log.info("pod CIDR updated", extra={"pod_cidr": cidr})
    return pb.UpdateRuntimeConfigResponse()


def _check_cidr(cidr: str) -> None:
    import ipaddress
    from cri_server.errors import InvalidArgument
    for part in cidr.split(","):
        try:
            ipaddress.ip_network(part.strip(), strict=False)
        except ValueError as e:
            raise InvalidArgument(f"runtime_config.network_config.pod_cidr: {e}") from None
