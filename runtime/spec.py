"""The default config.json that `husk spec` writes (the same shape runc's `spec` produces).

Pure data: no I/O besides what the caller does with the returned dict.
"""
from __future__ import annotations

TYPE_CHECKING = False  # `typing` costs ~4 ms (it imports re): annotations only
if TYPE_CHECKING:
    from typing import Any

from runtime.state import OCI_VERSION

DEFAULT_CAPS = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
MASKED = ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
          "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"]
READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


def default_spec(rootless: bool = False, uid: int = 0, gid: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": True,
            "user": {"uid": 0, "gid": 0},
            "args": ["sh"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"],
            "cwd": "/",
            "capabilities": {k: list(DEFAULT_CAPS) for k in ("bounding", "effective", "permitted", "ambient")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "husk",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
             "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
             "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
        ],
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"},
                           {"type": "mount"}],
            "maskedPaths": list(MASKED),
            "readonlyPaths": list(READONLY),
        },
    }
    if rootless:
        linux = spec["linux"]
        linux["uidMappings"] = [{"containerID": 0, "hostID": uid, "size": 1}]
        linux["gidMappings"] = [{"containerID": 0, "hostID": gid, "size": 1}]
        linux["namespaces"] = [{"type": t} for t in ("pid", "ipc", "uts", "mount", "cgroup", "user")]
        del linux["resources"]
        mounts = [m for m in spec["mounts"] if m["destination"] not in ("/sys", "/sys/fs/cgroup")]
        mounts.append({"destination": "/sys", "type": "none", "source": "/sys",
                       "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]})
        for m in mounts:
            if m["destination"] in ("/dev/pts",):
                m["options"] = [o for o in m["options"] if o != "gid=5"]
        spec["mounts"] = mounts
    return spec
