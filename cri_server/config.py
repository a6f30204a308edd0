"""husk-cri's configuration: one TOML file, embedded defaults that work offline, flags on top.

Owns the config record (frozen dataclasses), loading and validating the file, applying flag overrides and
printing the defaults as TOML. It does not create directories or look at the network.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Mapping

DEFAULT_CONFIG_PATH = "/etc/husk/cri.toml"


class ConfigError(ValueError):
    """The file or a flag is invalid; `key` is the dotted TOML key (e.g. `cni.bin_dirs`)."""

    def __init__(self, key: str, reason: str, source: str = "") -> None:
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}: {reason}" if key else f"{where}{reason}")
        self.key = key
        self.reason = reason


def _opt(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class ServerConfig:
    listen: str = _opt("/run/husk/cri.sock", "unix socket kubelet and crictl connect to (a path or unix:///path)")
    socket_mode: str = _opt("0660", "permission bits of the socket, octal")
    socket_group: str = _opt("", "group owning the socket (name or number); empty keeps root's")
    log_level: str = _opt("info", "debug, info, warning or error")
    log_format: str = _opt("json", "json (one object per line) or text")
    shutdown_grace: float = _opt(5.0, "seconds in-flight RPCs get on SIGTERM before they are cancelled")


@dataclass(frozen=True)
class PathsConfig:
    root: str = _opt("/var/lib/husk/cri", "persistent state: metadata database, pod and container dirs, CNI cache")
    state: str = _opt("/run/husk/cri", "volatile state: pinned network namespaces, sockets, fifos")


@dataclass(frozen=True)
class RuntimeConfig:
    runtime: str = _opt("in-process", "OCI runtime of the default handler: a binary (husk, runc, crun, a path) "
                                      "or in-process (the shim calls husk's runtime code directly)")
    runtime_root: str = _opt("/run/husk/runtime", "the OCI runtime's --root")
    handlers: dict = _opt({}, "extra runtime handlers for RuntimeClass: name = runtime (as `runtime`)")
    sandbox_image: str = _opt("registry.k8s.io/pause:3.9", "image of the pause container every pod runs")
    restrict_oom_score_adj: str = _opt("auto", "auto (clamp when CAP_SYS_RESOURCE is missing), true or false")
    systemd_cgroup: bool = _opt(False, "cgroup driver of pods and containers (containerd's SystemdCgroup): true = "
                                       "systemd (pod cgroup_parent is a slice, each container a scope made by "
                                       "systemd), false = cgroupfs; kubelet's cgroupDriver must say the same")
    tolerate_missing_hugetlb_controller: bool = _opt(
        True, "without a hugetlb cgroup controller, drop the hugepage limits of 0 kubelet always sends (a non-zero "
              "one is refused); false passes them to the runtime, which refuses them")
    default_stop_signal: str = _opt("SIGTERM", "stop signal when neither the request nor the image names one")
    max_container_log_line_size: int = _opt(16384, "longer log lines are split into partial records")

    @property
    def cgroup_driver(self) -> str:
        """What RuntimeConfig reports to kubelet: "systemd" or "cgroupfs"."""
        return "systemd" if self.systemd_cgroup else "cgroupfs"


@dataclass(frozen=True)
class CniConfig:
    conf_dir: str = _opt("/etc/cni/net.d", "the first .conflist/.conf/.json here (by name) is the pod network")
    bin_dirs: list = _opt(["/opt/cni/bin", "/usr/lib/cni"], "directories searched for CNI plugin binaries")
    plugin_timeout: float = _opt(60.0, "seconds one CNI plugin call may take")


@dataclass(frozen=True)
class RegistryConfig:
    config_dir: str = _opt("/etc/husk/certs.d",
                           "containerd hosts.toml layout: <dir>/<registry host>/hosts.toml (+ CA files)")


@dataclass(frozen=True)
class StreamingConfig:
    address: str = _opt("127.0.0.1", "address the exec/attach/port-forward server binds")
    port: int = _opt(0, "port of the streaming server; 0 picks a free one")
    tls_cert_file: str = _opt("", "PEM certificate (chain) of the streaming server; with tls_key_file the server "
                                  "speaks TLS only and its URLs are https://; empty: plain HTTP")
    tls_key_file: str = _opt("", "PEM private key of tls_cert_file")
    tls_ca_file: str = _opt("", "PEM CA bundle: when set, clients must present a certificate it signed "
                                "(mutual TLS); needs tls_cert_file")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file)


@dataclass(frozen=True)
class MetricsConfig:
    address: str = _opt("", "host:port of the Prometheus /metrics endpoint (plain HTTP), e.g. 127.0.0.1:9101; "
                            "empty: off (prometheus_client is not even imported)")

    def host_port(self) -> tuple[str, int]:
        """(host, port) of `address`: "127.0.0.1:9101", "[::1]:9101", ":9101" (every IPv4 address); ValueError
        says what is wrong."""
        host, sep, port = self.address.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"expected host:port with a port 0..65535, got {self.address!r}")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            raise ValueError(f"write an IPv6 address in brackets ([::1]:9101), got {self.address!r}")
        return host or "0.0.0.0", int(port)


@dataclass(frozen=True)
class TraceConfig:
    slow_step_seconds: float = _opt(2.0, "a start-up step (cri_server/trace.py) slower than this logs a warning "
                                         "naming the pod and the step; 0: never")


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    cni: CniConfig = field(default_factory=CniConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    streaming: StreamingConfig = field(default_factory=StreamingConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)

    # Paths derived from the two roots, in one place so every module agrees on them.
    @property
    def socket_path(self) -> str:
        listen = self.server.listen
        for prefix in ("unix://", "unix:"):
            if listen.startswith(prefix):
                return listen[len(prefix):]
        return listen

    @property
    def db_path(self) -> str:
        return os.path.join(self.paths.root, "metadata.db")

    @property
    def sandboxes_dir(self) -> str:
        return os.path.join(self.paths.root, "sandboxes")

    @property
    def containers_dir(self) -> str:
        return os.path.join(self.paths.root, "containers")

    @property
    def cni_cache_dir(self) -> str:
        return os.path.join(self.paths.root, "cni-cache")

    @property
    def netns_dir(self) -> str:
        return os.path.join(self.paths.state, "netns")


_SECTION_TYPES: dict[str, type] = {
    "server": ServerConfig, "paths": PathsConfig, "runtime": RuntimeConfig,
    "cni": CniConfig, "registry": RegistryConfig, "streaming": StreamingConfig,
    "metrics": MetricsConfig, "trace": TraceConfig,
}


def _check_type(key: str, value: Any, default: Any, source: str) -> Any:
    if isinstance(default, bool) or isinstance(value, bool):
        if not isinstance(value, bool) or not isinstance(default, bool):
            raise ConfigError(key, f"expected {type(default).__name__}, got {value!r}", source)
        return value
    if isinstance(default, float) and isinstance(value, int):
        return float(value)
    if isinstance(default, list):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(key, f"expected a list of strings, got {value!r}", source)
        return list(value)
    if isinstance(default, dict):
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ConfigError(key, f"expected a table of strings, got {value!r}", source)
        return dict(value)
    if not isinstance(value, type(default)):
        raise ConfigError(key, f"expected {type(default).__name__}, got {value!r}", source)
    return value


def from_mapping(data: Mapping[str, Any], source: str = "") -> Config:
    """Builds a Config from parsed TOML; unknown sections or keys are errors (a typo must not be ignored)."""
    sections: dict[str, Any] = {}
    for name, value in data.items():
        cls = _SECTION_TYPES.get(name)
        if cls is None:
            raise ConfigError(name, f"unknown section (known: {', '.join(_SECTION_TYPES)})", source)
        if not isinstance(value, dict):
            raise ConfigError(name, "expected a table", source)
        defaults = cls()
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {}
        if name == "runtime" and "cgroup_driver" in value:
            value = _legacy_cgroup_driver(value, source)
        for key, v in value.items():
            if key not in known:
                raise ConfigError(f"{name}.{key}", f"unknown key (known: {', '.join(sorted(known))})", source)
            kwargs[key] = _check_type(f"{name}.{key}", v, getattr(defaults, key), source)
        sections[name] = cls(**kwargs)
    config = Config(**sections)
    validate(config, source)
    return config


def _legacy_cgroup_driver(runtime: Mapping[str, Any], source: str) -> dict[str, Any]:
    """`runtime.cgroup_driver` ("cgroupfs" or "systemd") is the old spelling of `runtime.systemd_cgroup`: old files
    keep working, and a file that says both must say the same thing."""
    value = dict(runtime)
    driver = value.pop("cgroup_driver")
    if driver not in ("cgroupfs", "systemd"):
        raise ConfigError("runtime.cgroup_driver", f"unknown driver {driver!r} (cgroupfs or systemd; prefer "
                                                   "runtime.systemd_cgroup = true or false)", source)
    systemd = driver == "systemd"
    if isinstance(value.get("systemd_cgroup"), bool) and value["systemd_cgroup"] is not systemd:
        raise ConfigError("runtime.cgroup_driver", f"{driver!r} contradicts runtime.systemd_cgroup = "
                                                   f"{_toml_value(value['systemd_cgroup'])}; keep only "
                                                   "systemd_cgroup", source)
    value.setdefault("systemd_cgroup", systemd)
    return value


def validate(config: Config, source: str = "") -> None:
    """Semantic checks the types cannot express."""
    s = config.server
    try:
        if not 0 <= int(s.socket_mode, 8) <= 0o777:
            raise ValueError(s.socket_mode)
    except ValueError:
        raise ConfigError("server.socket_mode", f"not an octal mode: {s.socket_mode!r}", source) from None
    from cri_server.logs import LEVELS
    if s.log_level.lower() not in LEVELS:
        raise ConfigError("server.log_level", f"unknown level {s.log_level!r} (one of {', '.join(LEVELS)})",
                          source)
    if s.log_format not in ("json", "text"):
        raise ConfigError("server.log_format", f"unknown format {s.log_format!r}", source)
    if not os.path.isabs(config.socket_path):
        raise ConfigError("server.listen", f"must be an absolute unix socket path, got {s.listen!r}", source)
    for key in ("root", "state"):
        if not os.path.isabs(getattr(config.paths, key)):
            raise ConfigError(f"paths.{key}", "must be an absolute path", source)
    for key in ("conf_dir",):
        if not os.path.isabs(getattr(config.cni, key)):
            raise ConfigError(f"cni.{key}", "must be an absolute path", source)
    for d in config.cni.bin_dirs:
        if not os.path.isabs(d):
            raise ConfigError("cni.bin_dirs", f"{d!r} must be an absolute path", source)
    if config.runtime.restrict_oom_score_adj not in ("auto", "true", "false"):
        raise ConfigError("runtime.restrict_oom_score_adj", "must be auto, true or false", source)
    if "" in config.runtime.handlers:
        raise ConfigError("runtime.handlers", "the default handler is set with runtime.runtime", source)
    if not 0 <= config.streaming.port <= 65535:
        raise ConfigError("streaming.port", "must be 0..65535", source)
    _validate_streaming_tls(config.streaming, source)
    if config.trace.slow_step_seconds < 0:
        raise ConfigError("trace.slow_step_seconds", "must be >= 0", source)
    if config.metrics.address:
        try:
            config.metrics.host_port()
        except ValueError as e:
            raise ConfigError("metrics.address", str(e), source) from None


def _validate_streaming_tls(st: StreamingConfig, source: str) -> None:
    """The TLS keys come as a set; whether the files exist and parse is checked when the server starts."""
    for key in ("tls_cert_file", "tls_key_file", "tls_ca_file"):
        value = getattr(st, key)
        if value and not os.path.isabs(value):
            raise ConfigError(f"streaming.{key}", f"must be an absolute path, got {value!r}", source)
    if st.tls_cert_file and not st.tls_key_file:
        raise ConfigError("streaming.tls_key_file", "must be set when streaming.tls_cert_file is", source)
    if st.tls_key_file and not st.tls_cert_file:
        raise ConfigError("streaming.tls_cert_file", "must be set when streaming.tls_key_file is", source)
    if st.tls_ca_file and not st.tls_cert_file:
        raise ConfigError("streaming.tls_ca_file", "client certificates need TLS: set streaming.tls_cert_file "
                                                   "and streaming.tls_key_file too", source)


def load(path: str | None) -> Config:
    """Reads the file at `path`; None means the defaults, and the default path is used only if it exists."""
    if path is None:
        if not os.path.exists(DEFAULT_CONFIG_PATH):
            return Config()
        path = DEFAULT_CONFIG_PATH
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError("", f"cannot read: {e.strerror}", path) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("", f"not valid TOML: {e}", path) from None
    return from_mapping(data, path)


# Flag name -> (section, key); multi-valued flags replace the whole list.
FLAG_KEYS = {
    "listen": ("server", "listen"),
    "log_level": ("server", "log_level"),
    "root": ("paths", "root"),
    "state": ("paths", "state"),
    "sandbox_image": ("runtime", "sandbox_image"),
    "runtime": ("runtime", "runtime"),
    "systemd_cgroup": ("runtime", "systemd_cgroup"),
    "cni_conf_dir": ("cni", "conf_dir"),
    "cni_bin_dir": ("cni", "bin_dirs"),
    "registry_config_dir": ("registry", "config_dir"),
    "stream_address": ("streaming", "address"),
    "stream_tls_cert": ("streaming", "tls_cert_file"),
    "stream_tls_key": ("streaming", "tls_key_file"),
    "stream_tls_ca": ("streaming", "tls_ca_file"),
    "metrics_address": ("metrics", "address"),
}


def with_overrides(config: Config, overrides: Mapping[str, Any]) -> Config:
    """Flags override the file (CRI-O style). `overrides` maps FLAG_KEYS names to values; None/empty means unset."""
    changes: dict[str, dict[str, Any]] = {}
    for flag, value in overrides.items():
        if value is None or value == () or value == []:
            continue
        section, key = FLAG_KEYS[flag]
        if isinstance(value, tuple):
            value = list(value)
        changes.setdefault(section, {})[key] = value
    if not changes:
        return config
    new = dataclasses.replace(config, **{
        s: dataclasses.replace(getattr(config, s), **kv) for s, kv in changes.items()})
    validate(new, "flags")
    return new


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def _toml_key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else _toml_value(k)


def to_toml(config: Config) -> str:
    """The config as a commented TOML file; `husk-cri config default` prints this for Config()."""
    out = ["# husk-cri configuration. Flags given on the command line override these values.", ""]
    for section in dataclasses.fields(Config):
        obj = getattr(config, section.name)
        out.append(f"[{section.name}]")
        for f in dataclasses.fields(obj):
            out.append(f"# {f.metadata['help']}")
            out.append(f"{f.name} = {_toml_value(getattr(obj, f.name))}")
        out.append("")
    return "\n".join(out)


def to_dict(config: Config) -> dict[str, Any]:
    return dataclasses.asdict(config)
