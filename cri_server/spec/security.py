"""Spec options for security: capabilities, privileged, read-only rootfs, no_new_privs, seccomp, masked and
read-only paths. Seccomp's RuntimeDefault profile comes from runtime.seccomp (imported only when used)."""
from __future__ import annotations

import json
import platform
from typing import Any

from cri_server.api.v1 import api_pb2 as pb
from cri_server.errors import FailedPrecondition
from cri_server.spec import caps
from cri_server.spec.context import ContainerContext, SandboxContext, Spec, ensure, invalid

DEFAULT_MASKED_PATHS = (
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
)
DEFAULT_READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


def _set_caps(spec: Spec, names: list[str], ambient: list[str] | None = None) -> None:
    c = ensure(spec, "process", "capabilities")
    c["bounding"] = list(names)
    c["effective"] = list(names)
    c["permitted"] = list(names)
    # Ambient capabilities must also be inheritable and permitted to stay raised across execve.
    c["inheritable"] = list(ambient or [])
    if ambient:
        c["ambient"] = list(ambient)
    else:
        c.pop("ambient", None)


def with_capabilities(spec: Spec, ctx: ContainerContext) -> None:
    """Default set, then add ALL (every capability this host's bounding set has), drop ALL, individual adds,
    individual drops (containerd's order). Privileged gets every host capability and ignores the lists."""
    sc = ctx.config.linux.security_context
    if sc.privileged:
        _set_caps(spec, list(ctx.host.capabilities))
        return
    host = set(ctx.host.capabilities)
    current = [c for c in caps.DEFAULT_CAPABILITIES if c in host]
    field = "config.linux.security_context.capabilities"
    add, drop, ambient = [], [], []
    for lst, out, name in ((sc.capabilities.add_capabilities, add, "add_capabilities"),
                           (sc.capabilities.drop_capabilities, drop, "drop_capabilities"),
                           (sc.capabilities.add_ambient_capabilities, ambient, "add_ambient_capabilities")):
        for i, c in enumerate(lst):
            if c.upper() == "ALL" and name != "add_ambient_capabilities":
                out.append("ALL")
                continue
            n = caps.normalize(c)
            if n is None:
                raise invalid(f"{field}.{name}[{i}]", f"unknown capability {c!r}")
            out.append(n)
    if "ALL" in add:
        current = list(ctx.host.capabilities)
    if "ALL" in drop:
        current = []
    for c in add:
        if c != "ALL" and c not in current:
            if c not in host:
                raise invalid(f"{field}.add_capabilities", f"{c} is not in this host's bounding set")
            current.append(c)
    current = [c for c in current if c not in drop]
    for c in ambient:
        if c not in host:
            raise invalid(f"{field}.add_ambient_capabilities", f"{c} is not in this host's bounding set")
        if c not in current:
            current.append(c)
    _set_caps(spec, current, ambient)


def check_privileged(spec: Spec, ctx: ContainerContext) -> None:
    """A privileged container only in a privileged sandbox (kubelet's rule, enforced as containerd does)."""
    if ctx.config.linux.security_context.privileged and \
            not ctx.sandbox_config.linux.security_context.privileged:
        raise invalid("config.linux.security_context.privileged", "the pod sandbox is not privileged")


def with_readonly_rootfs(spec: Spec, ctx: ContainerContext | SandboxContext) -> None:
    ensure(spec, "root")["readonly"] = bool(ctx.config.linux.security_context.readonly_rootfs)


def with_no_new_privs(spec: Spec, ctx: ContainerContext) -> None:
    sc = ctx.config.linux.security_context
    ensure(spec, "process")["noNewPrivileges"] = bool(sc.no_new_privs) and not sc.privileged


def with_masked_paths(spec: Spec, ctx: ContainerContext) -> None:
    """Defaults unless privileged; kubelet's explicit lists (even empty, for procMount Unmasked) win."""
    sc = ctx.config.linux.security_context
    linux = ensure(spec, "linux")
    if sc.privileged:
        linux.pop("maskedPaths", None)
        linux.pop("readonlyPaths", None)
        return
    # A repeated field cannot tell "unset" from "empty": kubelet sends both lists, or neither (defaults).
    explicit = bool(sc.masked_paths) or bool(sc.readonly_paths)
    linux["maskedPaths"] = list(sc.masked_paths) if explicit else list(DEFAULT_MASKED_PATHS)
    linux["readonlyPaths"] = list(sc.readonly_paths) if explicit else list(DEFAULT_READONLY_PATHS)


def with_sandbox_masked_paths(spec: Spec, ctx: SandboxContext) -> None:
    linux = ensure(spec, "linux")
    if ctx.config.linux.security_context.privileged:
        return
    linux["maskedPaths"] = list(DEFAULT_MASKED_PATHS)
    linux["readonlyPaths"] = list(DEFAULT_READONLY_PATHS)


# --- seccomp -------------------------------------------------------------------------------

_ARCH = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64", "ppc64le": "SCMP_ARCH_PPC64LE",
         "s390x": "SCMP_ARCH_S390X", "riscv64": "SCMP_ARCH_RISCV64"}


def runtime_default_profile() -> dict[str, Any]:
    try:
        from runtime.seccomp import default_profile  # imported only when a pod asks for it
    except ImportError as e:
        raise FailedPrecondition("seccomp RuntimeDefault needs runtime.seccomp.default_profile(), which this "
                                 f"husk build lacks ({e})") from None
    return default_profile()


def _docker_to_oci(profile: dict[str, Any], capabilities: list[str]) -> dict[str, Any]:
    """Accepts the Docker/containerd profile format too: archMap selects this machine's architectures, and
    includes/excludes (by capability or arch) decide which syscall groups apply."""
    arch = _ARCH.get(platform.machine(), "")
    out: dict[str, Any] = {k: v for k, v in profile.items() if k not in ("archMap", "syscalls")}
    if "archMap" in profile:
        for entry in profile.get("archMap") or ():
            if entry.get("architecture") == arch:
                out["architectures"] = [arch] + list(entry.get("subArchitectures") or ())
    syscalls = []
    for s in profile.get("syscalls") or ():
        inc, exc = s.get("includes") or {}, s.get("excludes") or {}
        if inc.get("caps") and not all(c in capabilities for c in inc["caps"]):
            continue
        if inc.get("arches") and arch not in [_ARCH.get(a, a) for a in inc["arches"]] + inc["arches"]:
            continue
        if exc.get("caps") and any(c in capabilities for c in exc["caps"]):
            continue
        if exc.get("arches") and arch in [_ARCH.get(a, a) for a in exc["arches"]] + exc["arches"]:
            continue
        names = list(s.get("names") or ()) + ([s["name"]] if s.get("name") else [])
        entry = {k: v for k, v in s.items() if k not in ("includes", "excludes", "comment", "name", "names")}
        syscalls.append({"names": names, **entry})
    out["syscalls"] = syscalls
    return out


def load_localhost_profile(path: str, field: str, capabilities: list[str]) -> dict[str, Any]:
    if not path.startswith("/"):
        raise invalid(field, f"seccomp profile {path!r} must be an absolute path")
    try:
        with open(path) as f:
            profile = json.load(f)
    except OSError as e:
        raise invalid(field, f"seccomp profile {path}: {e.strerror}") from None
    except ValueError as e:
        raise invalid(field, f"seccomp profile {path}: not valid JSON: {e}") from None
    if not isinstance(profile, dict) or "defaultAction" not in profile:
        raise invalid(field, f"seccomp profile {path}: no defaultAction")
    return _docker_to_oci(profile, capabilities)


def _seccomp_choice(sp: pb.SecurityProfile | None, legacy: str, field: str) -> tuple[str, str]:
    """("", "") unconfined, ("default", ""), or ("localhost", path); the new field wins over the legacy one."""
    if sp is not None:
        if sp.profile_type == pb.SecurityProfile.RuntimeDefault:
            return "default", ""
        if sp.profile_type == pb.SecurityProfile.Unconfined:
            return "", ""
        if sp.profile_type == pb.SecurityProfile.Localhost:
            return "localhost", sp.localhost_ref
        raise invalid(field, f"unknown profile type {sp.profile_type}")
    if legacy in ("", "unconfined"):
        return "", ""
    if legacy in ("runtime/default", "docker/default"):
        return "default", ""
    if legacy.startswith("localhost/"):
        return "localhost", legacy[len("localhost/"):]
    raise invalid(field.replace("seccomp", "seccomp_profile_path"), f"unknown profile {legacy!r}")


def _apply_seccomp(spec: Spec, sc: Any, field: str) -> None:
    linux = ensure(spec, "linux")
    linux.pop("seccomp", None)
    if sc.privileged:
        return  # privileged ignores any profile
    kind, ref = _seccomp_choice(sc.seccomp if sc.HasField("seccomp") else None, sc.seccomp_profile_path, field)
    if kind == "default":
        linux["seccomp"] = runtime_default_profile()
    elif kind == "localhost":
        linux["seccomp"] = load_localhost_profile(
            ref, f"{field}.localhost_ref", spec.get("process", {}).get("capabilities", {}).get("bounding", []))


def with_seccomp(spec: Spec, ctx: ContainerContext) -> None:
    """Unset or Unconfined: none; RuntimeDefault: the built-in profile; Localhost: the JSON file named by an
    absolute path. Privileged containers get none whatever was asked."""
    _apply_seccomp(spec, ctx.config.linux.security_context, "config.linux.security_context.seccomp")


def with_sandbox_seccomp(spec: Spec, ctx: SandboxContext) -> None:
    _apply_seccomp(spec, ctx.config.linux.security_context, "config.linux.security_context.seccomp")


def with_sandbox_capabilities(spec: Spec, ctx: SandboxContext) -> None:
    host = set(ctx.host.capabilities)
    if ctx.config.linux.security_context.privileged:
        _set_caps(spec, list(ctx.host.capabilities))
    else:
        _set_caps(spec, [c for c in caps.DEFAULT_CAPABILITIES if c in host])
    ensure(spec, "process")["noNewPrivileges"] = not ctx.config.linux.security_context.privileged

