"""Request validation before anything is created: every string of a CRI request is checked for NUL bytes and
for its length, string maps for their total size, exec commands for being non-empty.

One walk over the fields the request has set (`ListFields`, cheap: unset fields cost nothing), with limits from
one table keyed by (message, field). A violation is InvalidArgument naming the field as the request spells it
(`config.hostname: 10000 characters, at most 64`). Checks of meaning (absolute paths, port ranges, ...) stay
with the handlers and the spec builder; this module only stops strings that the kernel, the store or a List
response cannot take. It creates nothing and reads no state.
"""
from __future__ import annotations

from typing import Any, Callable

from cri_server.errors import InvalidArgument

PATH_MAX = 4096                # the kernel's limit for a path
MAX_ARG_STRLEN = 128 * 1024    # the kernel's limit for one argv/envp string: the bound of any other string
MAP_TOTAL = (256 + 16) * 1024  # Kubernetes' 256 KiB on an object's annotations, checked by the API server
                               # before kubelet adds its own (kubernetes.io/config.*, io.kubernetes.*): 16 KiB slack
MAP_KEY = PATH_MAX
DNS_NAME = 253                 # a DNS subdomain: Kubernetes' longest object name
DNS_LABEL = 63                 # a DNS label: Kubernetes' namespace names
ID = 256                       # ids are 64 hex digits (or a prefix); anything longer cannot match

_PATHS = ("log_directory", "log_path", "working_dir", "container_path", "host_path", "image_sub_path",
          "cgroup_parent", "masked_paths", "readonly_paths", "seccomp_profile_path", "localhost_ref")

# (message name, field name) -> the longest value of that string field (of each item when repeated). A field
# not listed: MAX_ARG_STRLEN. Paths anywhere: PATH_MAX.
LIMITS: dict[tuple[str, str], int] = {
    ("PodSandboxConfig", "hostname"): 64,            # the kernel's UTS name length
    ("PodSandboxMetadata", "name"): DNS_NAME,
    ("PodSandboxMetadata", "namespace"): DNS_LABEL,
    ("PodSandboxMetadata", "uid"): DNS_NAME,
    ("ContainerMetadata", "name"): DNS_NAME,         # Kubernetes: a DNS label; critest uses up to ~80 characters
    ("DNSConfig", "servers"): DNS_NAME,
    ("DNSConfig", "searches"): DNS_NAME,
    ("DNSConfig", "options"): DNS_NAME,
    ("PortMapping", "host_ip"): DNS_NAME,
    ("ImageSpec", "image"): 1024,                    # a reference: name (255) + tag (128) + digest
    ("Device", "permissions"): 3,
    ("CDIDevice", "name"): DNS_NAME,
}
# Fields not walked: the sandbox config CreateContainer and PullImage repeat (husk-cri uses the one it stored,
# which passed RunPodSandbox's validation).
SKIP = {("CreateContainerRequest", "sandbox_config"), ("PullImageRequest", "sandbox_config")}


def check_request(req: Any) -> None:
    """Raise InvalidArgument naming the first bad field of `req` (any CRI request message)."""
    try:
        _walk(req, None)
    except _Bad:
        _walk(req, "")     # again, naming the field: paths are only built for a bad request
    extra = _EXTRA.get(type(req).DESCRIPTOR.name)
    if extra is not None:
        extra(req)


class _Bad(Exception):
    """A violation found by the walk that builds no paths."""


def _walk(msg: Any, where: str | None) -> None:
    """Check the fields `msg` has set; `where` is its path in the request, None to name nothing (faster)."""
    plan = _plan(msg.DESCRIPTOR)
    for fd, value in msg.ListFields():
        step = plan.get(fd.name)
        if step is None:
            continue
        kind, limit = step
        path = None if where is None else f"{where}.{fd.name}" if where else fd.name
        if kind == _STR:
            _string(value, limit, path)
        elif kind == _STRS:
            for i, s in enumerate(value):
                _string(s, limit, path and f"{path}[{i}]")
        elif kind == _MSG:
            _walk(value, path)
        elif kind == _MSGS:
            for i, m in enumerate(value):
                _walk(m, path and f"{path}[{i}]")
        else:
            _string_map(value, path)


def _string(s: str | bytes, limit: int, path: str | None) -> None:
    if ("\0" if isinstance(s, str) else b"\0") in s:
        _fail(path, "contains a NUL byte")
    if len(s) > limit:
        _fail(path, f"{len(s)} characters, at most {limit}")
    if isinstance(s, str) and not s.isascii() and len(s.encode()) > limit:
        _fail(path, f"{len(s.encode())} bytes (UTF-8), at most {limit}")


def _string_map(m: Any, path: str | None) -> None:
    total = 0
    for k, v in m.items():
        if "\0" in k or len(k) > MAP_KEY:
            _string(k, MAP_KEY, path and f"{path}: key {k[:64]!r}")
        if "\0" in v:
            _fail(path and f"{path}[{k!r}]", "contains a NUL byte")
        total += len(k) + len(v) if k.isascii() and v.isascii() else len(k.encode()) + len(v.encode())
    if total > MAP_TOTAL:
        _fail(path, f"keys and values take {total} bytes, at most {MAP_TOTAL} "
                    "(Kubernetes' limit for an object's annotations)")


def _fail(path: str | None, reason: str) -> None:
    if path is None:
        raise _Bad()
    raise InvalidArgument(f"{path}: {reason}")


_STR, _STRS, _MSG, _MSGS, _MAP = range(5)
_plans: dict[str, dict[str, tuple[int, int]]] = {}


def _plan(desc: Any) -> dict[str, tuple[int, int]]:
    """Field name -> (kind, limit) for the string-bearing fields of one message type, built once per type."""
    plan = _plans.get(desc.full_name)
    if plan is not None:
        return plan
    from google.protobuf.descriptor import FieldDescriptor as F
    plan = {}
    for fd in desc.fields:
        if (desc.name, fd.name) in SKIP:
            continue
        if fd.type in (F.TYPE_STRING, F.TYPE_BYTES):    # bytes: KeyValue.value (env values)
            limit = LIMITS.get((desc.name, fd.name), PATH_MAX if fd.name in _PATHS else MAX_ARG_STRLEN)
            if fd.name.endswith("_id"):
                limit = ID
            plan[fd.name] = (_STRS if fd.is_repeated else _STR, limit)
        elif fd.type == F.TYPE_MESSAGE:
            mt = fd.message_type
            if mt.GetOptions().map_entry:
                if mt.fields_by_name["value"].type == F.TYPE_STRING:
                    plan[fd.name] = (_MAP, MAP_TOTAL)
                elif mt.fields_by_name["value"].type == F.TYPE_MESSAGE:
                    raise AssertionError(f"{desc.full_name}.{fd.name}: maps of messages are not walked")
            elif _has_strings(mt, set()):
                plan[fd.name] = (_MSGS if fd.is_repeated else _MSG, 0)
    _plans[desc.full_name] = plan
    return plan


def _has_strings(desc: Any, seen: set[str]) -> bool:
    from google.protobuf.descriptor import FieldDescriptor as F
    if desc.full_name in seen:
        return False
    seen.add(desc.full_name)
    return any(fd.type in (F.TYPE_STRING, F.TYPE_BYTES)
               or (fd.type == F.TYPE_MESSAGE and _has_strings(fd.message_type, seen))
               for fd in desc.fields)


def _command(req: Any) -> None:
    if not req.cmd:
        raise InvalidArgument("cmd: must not be empty")
    if not req.cmd[0]:
        raise InvalidArgument("cmd[0]: the command must not be empty")


_EXTRA: dict[str, Callable[[Any], None]] = {"ExecSyncRequest": _command, "ExecRequest": _command}
