"""Linux capability names and the host's capability set; no syscalls beyond reading /proc."""
from __future__ import annotations

CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
    "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
    "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
)

# What an unprivileged container gets (the set containerd and Docker use).
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
)


def normalize(name: str) -> str | None:
    """"net_admin" / "NET_ADMIN" / "CAP_NET_ADMIN" -> "CAP_NET_ADMIN"; None for an unknown name."""
    n = name.strip().upper()
    if not n.startswith("CAP_"):
        n = "CAP_" + n
    return n if n in CAPABILITIES else None


def host_capabilities(status_path: str = "/proc/self/status") -> tuple[str, ...]:
    """The capabilities in this process's bounding set: what "privileged" and "ALL" may grant here (a host
    without CAP_SYS_RESOURCE in its bounding set cannot give it to a container)."""
    with open(status_path) as f:
        for line in f:
            if line.startswith("CapBnd:"):
                mask = int(line.split()[1], 16)
                return tuple(c for i, c in enumerate(CAPABILITIES) if mask >> i & 1)
    raise RuntimeError(f"{status_path}: no CapBnd line")
