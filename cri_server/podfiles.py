"""The files a pod's containers share: /etc/resolv.conf from the CRI DNSConfig, /etc/hosts, /etc/hostname.

Renders and writes them atomically into the pod's directory; RunPodSandbox bind-mounts them.
"""
from __future__ import annotations

from cri_server.api.v1 import api_pb2 as pb
from cri_server.errors import InvalidArgument
from runtime.fsutil import atomic_write

HOST_RESOLV_CONF = "/etc/resolv.conf"


def resolv_conf(dns: pb.DNSConfig | None, host_resolv: str = HOST_RESOLV_CONF) -> str:
    """kubelet's DNSConfig when it sent one; the node's resolv.conf otherwise (host-network pods)."""
    if dns is None or not (dns.servers or dns.searches or dns.options):
        try:
            with open(host_resolv) as f:
                return f.read()
        except FileNotFoundError:
            return ""
    for i, s in enumerate(dns.servers):
        if not s or any(c.isspace() for c in s):
            raise InvalidArgument(f"config.dns_config.servers[{i}]: {s!r} is not an address")
    lines = []
    if dns.searches:
        lines.append("search " + " ".join(dns.searches))
    lines += [f"nameserver {s}" for s in dns.servers]
    if dns.options:
        lines.append("options " + " ".join(dns.options))
    return "\n".join(lines) + "\n"


def hosts(hostname: str, ips: list[str] | tuple[str, ...] = ()) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             "fe00::0\tip6-localnet", "fe00::0\tip6-mcastprefix", "fe00::1\tip6-allnodes",
             "fe00::2\tip6-allrouters"]
    if hostname:
        lines += [f"{ip}\t{hostname}" for ip in ips]
    return "\n".join(lines) + "\n"


def hostname_file(hostname: str) -> str:
    return hostname + "\n" if hostname else ""


def write_atomic(path: str, content: str, mode: int = 0o644) -> None:
    # the file is fsync'd, its directory not (~1.6 ms per file on ext4, on the pod start path): pods and their
    # files are made again after a reboot, and a lost rename leaves the old file or none, never a torn one
    atomic_write(path, content, mode=mode, sync_dir=False)
