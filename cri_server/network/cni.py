"""The CNI invoker: runs the plugins of the pod network for a sandbox's network namespace.

Loads the first network config in the conf dir (a .conflist, or a single-plugin .conf/.json turned into a
list), runs ADD through the chain with each result as the next plugin's prevResult, passes the capabilities
a plugin declares (portMappings) as runtimeConfig, caches the final result so DEL and CHECK get it later (as
libcni does), and tears down with DEL when ADD fails half-way. It only execs plugins; it never creates a
netns or touches links itself.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

log = logging.getLogger(__name__)

# The hook of cri_server/prometheus.py, None unless metrics are on: observer(command, plugin type, seconds, failed)
# after every plugin call.
observer: Callable[[str, str, float, bool], None] | None = None

CONF_EXTENSIONS = (".conflist", ".conf", ".json")
DEFAULT_IFNAME = "eth0"
# Result formats: 0.1.0/0.2.0 have ip4/ip6, later versions an ips list; CHECK exists from 0.4.0 on.
_LEGACY_VERSIONS = ("0.1.0", "0.2.0")


class CniError(Exception):
    """A CNI step failed; names the plugin, the command and the plugin's own error code and message."""

    def __init__(self, message: str, plugin: str = "", command: str = "", code: int = 0, details: str = "") -> None:
        super().__init__(message)
        self.plugin = plugin
        self.command = command
        self.code = code
        self.details = details


class CniConfigError(CniError):
    """The network configuration (file) is unusable; names the file and the field."""


@dataclass(frozen=True)
class NetworkConfigList:
    name: str
    cni_version: str
    plugins: tuple[Mapping[str, Any], ...]
    source: str
    disable_check: bool = False
    raw: bytes = b""

    @staticmethod
    def parse(data: bytes, source: str) -> "NetworkConfigList":
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise CniConfigError(f"{source}: not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise CniConfigError(f"{source}: expected a JSON object")
        if "plugins" in doc:
            plugins = doc["plugins"]
            if not isinstance(plugins, list) or not plugins:
                raise CniConfigError(f"{source}: plugins: expected a non-empty list")
        elif "type" in doc:
            # A single-plugin .conf: a list of one (libcni's ConfListFromConf).
            plugins = [doc]
        else:
            raise CniConfigError(f"{source}: neither a plugin list (plugins) nor a plugin (type)")
        name = doc.get("name")
        if not isinstance(name, str) or not name:
            raise CniConfigError(f"{source}: name: missing")
        version = doc.get("cniVersion")
        if not isinstance(version, str) or not version:
            raise CniConfigError(f"{source}: cniVersion: missing")
        for i, p in enumerate(plugins):
            if not isinstance(p, dict) or not isinstance(p.get("type"), str) or not p["type"]:
                raise CniConfigError(f"{source}: plugins[{i}].type: missing")
            if "/" in p["type"]:
                raise CniConfigError(f"{source}: plugins[{i}].type: must be a plugin name, not a path")
        return NetworkConfigList(name=name, cni_version=version, plugins=tuple(plugins), source=source,
                                 disable_check=bool(doc.get("disableCheck", False)), raw=data)


@dataclass(frozen=True)
class IPConfig:
    address: str            # CIDR notation, e.g. 10.88.0.5/16
    gateway: str = ""
    interface: int | None = None

    @property
    def ip(self) -> str:
        return self.address.split("/", 1)[0]


@dataclass(frozen=True)
class Result:
    cni_version: str
    ips: tuple[IPConfig, ...] = ()
    interfaces: tuple[Mapping[str, Any], ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict)

    @staticmethod
    def parse(doc: Mapping[str, Any], default_version: str) -> "Result":
        version = str(doc.get("cniVersion", default_version))
        ips: list[IPConfig] = []
        if version in _LEGACY_VERSIONS:
            for key in ("ip4", "ip6"):
                if isinstance(doc.get(key), dict) and doc[key].get("ip"):
                    ips.append(IPConfig(doc[key]["ip"], doc[key].get("gateway", "")))
        else:
            for entry in doc.get("ips") or ():
                if isinstance(entry, dict) and entry.get("address"):
                    ips.append(IPConfig(entry["address"], entry.get("gateway", ""), entry.get("interface")))
        return Result(version, tuple(ips), tuple(doc.get("interfaces") or ()), dict(doc))

    def pod_ips(self, ifname: str = DEFAULT_IFNAME) -> list[str]:
        """The IPs on the pod's interface (or all, when the plugins did not say which), IPv4 first."""
        names = [i.get("name") for i in self.interfaces]
        chosen = [c for c in self.ips
                  if c.interface is None or not (0 <= c.interface < len(names)) or names[c.interface] == ifname]
        return sorted((c.ip for c in chosen), key=lambda ip: ":" in ip)


@dataclass(frozen=True)
class PortMapping:
    host_port: int
    container_port: int
    protocol: str = "tcp"
    host_ip: str = ""

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"hostPort": self.host_port, "containerPort": self.container_port,
                             "protocol": self.protocol}
        if self.host_ip:
            d["hostIP"] = self.host_ip
        return d


@dataclass(frozen=True)
class Attachment:
    """One sandbox's attachment to the pod network: what CNI_* and the runtime config are built from."""
    container_id: str
    netns_path: str
    ifname: str = DEFAULT_IFNAME
    args: Mapping[str, str] = field(default_factory=dict)          # CNI_ARGS, e.g. K8S_POD_NAME
    port_mappings: tuple[PortMapping, ...] = ()

    def capability_args(self) -> dict[str, Any]:
        caps: dict[str, Any] = {}
        if self.port_mappings:
            caps["portMappings"] = [p.to_json() for p in self.port_mappings]
        return caps


@dataclass(frozen=True)
class NetworkStatus:
    ready: bool
    message: str = ""
    config_file: str = ""
    network_name: str = ""


def pod_cni_args(pod_name: str, pod_namespace: str, pod_uid: str, sandbox_id: str) -> dict[str, str]:
    """The CNI_ARGS kubelet-era runtimes pass, so plugins that read them (e.g. for host-local) work."""
    return {"IgnoreUnknown": "1", "K8S_POD_NAMESPACE": pod_namespace, "K8S_POD_NAME": pod_name,
            "K8S_POD_INFRA_CONTAINER_ID": sandbox_id, "K8S_POD_UID": pod_uid}


def find_config(conf_dir: str) -> NetworkConfigList:
    """The first parseable config file in `conf_dir` by name (as containerd and CRI-O pick it)."""
    try:
        names = sorted(n for n in os.listdir(conf_dir) if n.endswith(CONF_EXTENSIONS))
    except FileNotFoundError:
        raise CniConfigError(f"no network config found in {conf_dir}: the directory does not exist") from None
    errors = []
    for n in names:
        path = os.path.join(conf_dir, n)
        try:
            with open(path, "rb") as f:
                return NetworkConfigList.parse(f.read(), path)
        except (OSError, CniConfigError) as e:
            errors.append(str(e))
    if errors:
        raise CniConfigError(f"no valid network config in {conf_dir}: " + "; ".join(errors))
    raise CniConfigError(f"no network config found in {conf_dir}")


class CniManager:
    def __init__(self, conf_dir: str, bin_dirs: Sequence[str], cache_dir: str, timeout: float = 60.0) -> None:
        self.conf_dir = conf_dir
        self.bin_dirs = list(bin_dirs)
        self.cache_dir = cache_dir
        self.timeout = timeout

    # --- configuration --------------------------------------------------------------------
    def status(self) -> NetworkStatus:
        """Whether pods can get a network now: a config exists and every plugin it names is installed."""
        try:
            conf = find_config(self.conf_dir)
            for p in conf.plugins:
                self.find_plugin(p["type"])
        except CniError as e:
            return NetworkStatus(False, f"cni config not ready: {e}")
        return NetworkStatus(True, "", conf.source, conf.name)

    def load(self) -> NetworkConfigList:
        return find_config(self.conf_dir)

    def find_plugin(self, plugin_type: str) -> str:
        for d in self.bin_dirs:
            path = os.path.join(d, plugin_type)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        raise CniError(f"CNI plugin {plugin_type!r} not found in {':'.join(self.bin_dirs)}", plugin=plugin_type)

    # --- the operations ---------------------------------------------------------------------
    async def add(self, att: Attachment, conf: NetworkConfigList | None = None, trace: Any = None) -> Result:
        """ADD through the whole chain; on failure, DEL everything (best effort) and raise the ADD error.
        `trace` (cri_server.trace.Trace): each plugin's ADD is a step "cni.add.<plugin type>"."""
        conf = conf or self.load()
        prev: Mapping[str, Any] | None = None
        try:
            for plugin in conf.plugins:
                if trace is None:
                    prev = await self._exec("ADD", plugin, conf, att, prev)
                    continue
                with trace.step(f"cni.add.{plugin['type']}"):
                    prev = await self._exec("ADD", plugin, conf, att, prev)
        except CniError as e:
            log.warning("CNI ADD failed, tearing down", extra={"pod_id": att.container_id, "error": str(e)})
            try:
                await self.delete(att, conf, result=None)
            except CniError as e2:
                log.warning("CNI DEL after a failed ADD failed too",
                            extra={"pod_id": att.container_id, "error": str(e2)})
            raise
        if prev is None:
            raise CniError(f"{conf.source}: the chain returned no result", command="ADD")
        result = Result.parse(prev, conf.cni_version)
        self._write_cache(att, conf, prev)
        return result

    async def delete(self, att: Attachment, conf: NetworkConfigList | None = None,
                     result: Mapping[str, Any] | None | bool = True) -> None:
        """DEL through the chain in reverse. `result=True` uses the cached ADD result as prevResult (CNI ≥0.4.0);
        the cache entry is removed once every plugin succeeded. Plugins must tolerate repeated DELs."""
        cached = self._read_cache(att, conf.name if conf else None)
        if conf is None:
            conf = cached[0] if cached else self.load()
        prev: Mapping[str, Any] | None = None
        if result is True:
            prev = cached[1] if cached else None
        elif isinstance(result, Mapping):
            prev = result
        if conf.cni_version in _LEGACY_VERSIONS or _version_lt(conf.cni_version, "0.4.0"):
            prev = None
        errors = []
        for plugin in reversed(conf.plugins):
            try:
                await self._exec("DEL", plugin, conf, att, prev)
            except CniError as e:
                errors.append(e)
        if errors:
            raise errors[0]
        self._remove_cache(att, conf.name)

    async def check(self, att: Attachment, conf: NetworkConfigList | None = None) -> None:
        """CHECK through the chain with the cached ADD result (CNI ≥0.4.0 only)."""
        cached = self._read_cache(att, conf.name if conf else None)
        if conf is None:
            conf = cached[0] if cached else self.load()
        if conf.disable_check:
            return
        if conf.cni_version in _LEGACY_VERSIONS or _version_lt(conf.cni_version, "0.4.0"):
            raise CniError(f"CHECK needs cniVersion 0.4.0 or later, {conf.source} has {conf.cni_version}",
                           command="CHECK")
        if cached is None:
            raise CniError(f"no cached ADD result for {att.container_id} in {conf.name}", command="CHECK")
        for plugin in conf.plugins:
            await self._exec("CHECK", plugin, conf, att, cached[1])

    # --- one plugin call -------------------------------------------------------------------
    def plugin_config(self, plugin: Mapping[str, Any], conf: NetworkConfigList, att: Attachment,
                      prev: Mapping[str, Any] | None) -> dict[str, Any]:
        """The JSON a plugin reads on stdin: its own entry plus name, cniVersion, prevResult and the
        runtimeConfig of the capabilities it declares (libcni's buildOneConfig)."""
        doc = dict(plugin)
        doc["name"] = conf.name
        doc["cniVersion"] = conf.cni_version
        if prev is not None:
            doc["prevResult"] = prev
        declared = plugin.get("capabilities") or {}
        runtime_config = {k: v for k, v in att.capability_args().items() if declared.get(k)}
        if runtime_config:
            doc["runtimeConfig"] = runtime_config
        return doc

    async def _exec(self, command: str, plugin: Mapping[str, Any], conf: NetworkConfigList, att: Attachment,
                    prev: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        ptype = plugin["type"]
        path = self.find_plugin(ptype)
        stdin = json.dumps(self.plugin_config(plugin, conf, att, prev)).encode()
        env = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": att.container_id,
            "CNI_NETNS": att.netns_path,
            "CNI_IFNAME": att.ifname,
            "CNI_ARGS": ";".join(f"{k}={v}" for k, v in att.args.items()),
            "CNI_PATH": os.pathsep.join(self.bin_dirs),
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        }
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(path, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, env=env)
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), self.timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            if observer is not None:
                observer(command, ptype, time.monotonic() - t0, True)
            raise CniError(f"CNI plugin {ptype} {command} timed out after {self.timeout:g}s",
                           plugin=ptype, command=command) from None
        log.debug("CNI plugin ran", extra={"pod_id": att.container_id, "plugin": ptype, "command": command,
                                           "rc": proc.returncode})
        if observer is not None:
            observer(command, ptype, time.monotonic() - t0, proc.returncode != 0)
        if proc.returncode != 0:
            raise _plugin_error(ptype, command, out, err, proc.returncode or 0)
        if command != "ADD":
            return None
        try:
            doc = json.loads(out) if out.strip() else None
        except ValueError:
            raise CniError(f"CNI plugin {ptype} ADD printed a result that is not JSON: {out[:200]!r}",
                           plugin=ptype, command=command) from None
        if doc is None:
            # A plugin may pass the previous result through by printing nothing only if it had one.
            if prev is None:
                raise CniError(f"CNI plugin {ptype} ADD printed no result", plugin=ptype, command=command)
            return prev
        return doc

    # --- the result cache (as libcni: one file per network, container and interface) ------------
    def _cache_path(self, att: Attachment, network: str) -> str:
        return os.path.join(self.cache_dir, "results", f"{network}-{att.container_id}-{att.ifname}")

    def _write_cache(self, att: Attachment, conf: NetworkConfigList, result: Mapping[str, Any]) -> None:
        path = self._cache_path(att, conf.name)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        doc = {"kind": "cniCacheV1", "containerId": att.container_id, "ifName": att.ifname,
               "networkName": conf.name, "config": base64.b64encode(conf.raw).decode(),
               "configSource": conf.source, "cniArgs": [[k, v] for k, v in att.args.items()],
               "capabilityArgs": att.capability_args(), "result": result}
        from runtime.fsutil import atomic_write  # fsync'd file, directory not: as before the shared helper
        atomic_write(path, json.dumps(doc), mode=0o600, sync_dir=False)

    def _read_cache(self, att: Attachment, network: str | None) -> tuple[NetworkConfigList, Mapping[str, Any]] | None:
        """The config and result of the last successful ADD, so DEL works even after the conf dir changed."""
        results = os.path.join(self.cache_dir, "results")
        if network is not None:
            candidates = [self._cache_path(att, network)]
        else:
            suffix = f"-{att.container_id}-{att.ifname}"
            try:
                candidates = [os.path.join(results, n) for n in os.listdir(results) if n.endswith(suffix)]
            except FileNotFoundError:
                return None
        for path in candidates:
            try:
                with open(path) as f:
                    doc = json.load(f)
                conf = NetworkConfigList.parse(base64.b64decode(doc["config"]), doc.get("configSource", path))
                return conf, doc["result"]
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, CniConfigError) as e:
                log.warning("unreadable CNI cache entry ignored", extra={"path": path, "error": str(e)})
        return None

    def _remove_cache(self, att: Attachment, network: str) -> None:
        try:
            os.unlink(self._cache_path(att, network))
        except FileNotFoundError:
            pass

    def cached_result(self, att: Attachment) -> Result | None:
        cached = self._read_cache(att, None)
        return Result.parse(cached[1], cached[0].cni_version) if cached else None


def _version_lt(a: str, b: str) -> bool:
    def parts(v: str) -> tuple[int, ...]:
        try:
            return tuple(int(x) for x in v.split("."))
        except ValueError:
            return (0,)
    return parts(a) < parts(b)


def _plugin_error(ptype: str, command: str, out: bytes, err: bytes, rc: int) -> CniError:
    """A plugin's failure: the spec's JSON error on stdout ({code, msg, details}) when it printed one."""
    try:
        doc = json.loads(out)
        if isinstance(doc, dict) and "msg" in doc:
            details = doc.get("details", "")
            msg = f"CNI plugin {ptype} {command} failed (code {doc.get('code', 0)}): {doc['msg']}"
            if details:
                msg += f": {details}"
            return CniError(msg, ptype, command, int(doc.get("code", 0) or 0), details)
    except ValueError:
        pass
    text = (err or out).decode(errors="replace").strip()[:500]
    return CniError(f"CNI plugin {ptype} {command} exited {rc}: {text}", ptype, command)

