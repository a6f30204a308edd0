"""The OCI spec of a sandbox (pause) or a container: a base spec and an ordered list of spec options.

Each option is `(spec, ctx) -> None`, changes one concern and is unit-tested alone (containerd's pattern); a
new CRI field means one new option. Validation errors are InvalidArgument with the field path.
"""
from __future__ import annotations

from typing import Callable, Sequence

from cri_server.spec import mounts, namespaces, process, resources, security
from cri_server.spec.context import ContainerContext, SandboxContext, Spec
from runtime.state import OCI_VERSION, OCI_VERSION_BASELINE

# Annotations a shim or runtime may read (the shim groups a pod's containers by sandbox id).
CONTAINER_TYPE = "io.kubernetes.cri.container-type"
SANDBOX_ID = "io.kubernetes.cri.sandbox-id"
SANDBOX_NAME = "io.kubernetes.cri.sandbox-name"
SANDBOX_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
SANDBOX_UID = "io.kubernetes.cri.sandbox-uid"
SANDBOX_LOG_DIR = "io.kubernetes.cri.sandbox-log-directory"
CONTAINER_NAME = "io.kubernetes.cri.container-name"
IMAGE_NAME = "io.kubernetes.cri.image-name"


def base_spec() -> Spec:
    return {
        "ociVersion": OCI_VERSION_BASELINE,
        "process": {"user": {"uid": 0, "gid": 0}, "cwd": "/", "args": [], "env": []},
        "root": {"path": "rootfs", "readonly": False},
        "mounts": [],
        "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}},
    }


def with_container_annotations(spec: Spec, ctx: ContainerContext) -> None:
    md = ctx.sandbox_config.metadata
    spec["annotations"] = {
        CONTAINER_TYPE: "container", SANDBOX_ID: ctx.sandbox.id, SANDBOX_NAME: md.name,
        SANDBOX_NAMESPACE: md.namespace, SANDBOX_UID: md.uid, CONTAINER_NAME: ctx.config.metadata.name,
        IMAGE_NAME: ctx.image_name or ctx.config.image.image,
    }


def with_sandbox_annotations(spec: Spec, ctx: SandboxContext) -> None:
    md = ctx.config.metadata
    spec["annotations"] = {
        CONTAINER_TYPE: "sandbox", SANDBOX_ID: ctx.id, SANDBOX_NAME: md.name, SANDBOX_NAMESPACE: md.namespace,
        SANDBOX_UID: md.uid, SANDBOX_LOG_DIR: ctx.config.log_directory, IMAGE_NAME: ctx.image_name,
    }


ContainerOption = Callable[[Spec, ContainerContext], None]
SandboxOption = Callable[[Spec, SandboxContext], None]

CONTAINER_OPTIONS: tuple[ContainerOption, ...] = (
    security.check_privileged,
    process.with_process_args,
    process.with_env,
    process.with_cwd,
    process.with_terminal,
    process.with_user,
    process.with_rlimits,
    mounts.with_default_mounts,
    mounts.with_pod_files,
    mounts.with_cri_mounts,
    mounts.with_termination_message,
    mounts.with_devices,
    mounts.with_privileged_devices,
    security.with_capabilities,
    security.with_readonly_rootfs,
    security.with_no_new_privs,
    security.with_seccomp,            # after capabilities: Localhost profiles may depend on them
    security.with_masked_paths,
    namespaces.with_container_namespaces,
    resources.with_resources,
    process.with_oom_score_adj,
    resources.with_cgroups_path,
    with_container_annotations,
    namespaces.with_container_userns,  # after the mounts and annotations it adds to
)

SANDBOX_OPTIONS: tuple[SandboxOption, ...] = (
    process.with_sandbox_process,
    process.with_sandbox_user,
    process.with_rlimits,
    namespaces.with_sandbox_hostname,
    namespaces.with_sandbox_namespaces,
    mounts.with_default_mounts,
    mounts.with_sandbox_shm,
    security.with_sandbox_capabilities,
    security.with_readonly_rootfs,
    security.with_sandbox_seccomp,
    security.with_sandbox_masked_paths,
    resources.with_sysctls,
    resources.with_sandbox_resources,
    process.with_sandbox_oom_score_adj,
    with_sandbox_annotations,
    namespaces.with_sandbox_userns,  # after the mounts and annotations it adds to
)


def with_oci_version(spec: Spec) -> None:
    """The lowest ociVersion that describes the spec: 1.0.2 (the baseline every runtime takes) unless a mount
    is idmapped (uidMappings on a mount: 1.1; the idmap/ridmap options: 1.2), then the version husk implements."""
    for m in spec.get("mounts") or []:
        if m.get("uidMappings") or m.get("gidMappings") or {"idmap", "ridmap"} & set(m.get("options") or ()):
            spec["ociVersion"] = OCI_VERSION
            return


def container_spec(ctx: ContainerContext, options: Sequence[ContainerOption] = CONTAINER_OPTIONS) -> Spec:
    spec = base_spec()
    for opt in options:
        opt(spec, ctx)
    with_oci_version(spec)
    return spec


def sandbox_spec(ctx: SandboxContext, options: Sequence[SandboxOption] = SANDBOX_OPTIONS) -> Spec:
    spec = base_spec()
    for opt in options:
        opt(spec, ctx)
    with_oci_version(spec)
    return spec
