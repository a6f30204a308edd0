"""What ps and pgrep read of a process, from /proc."""
from __future__ import annotations


def alive(pid: int) -> bool:
    """Whether `pid` exists and is neither a zombie nor dead (a zombie's /proc entry stays until it is reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def comm(pid: int) -> str:
    """The process name (PR_SET_NAME, at most 15 bytes): what `pgrep -x` matches."""
    with open(f"/proc/{pid}/comm") as f:
        return f.read().rstrip("\n")


def args(pid: int) -> str:
    """The command line as `ps -o args` and `pgrep -f` see it: NULs as spaces, trailing ones dropped."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().rstrip(b"\0").replace(b"\0", b" ").decode()


def live_with_args(*cmdlines: str) -> list[int]:
    """Live (non-zombie) processes whose command line (as `args` gives it) is one of `cmdlines`."""
    import os
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if args(pid) in cmdlines and alive(pid):
                found.append(pid)
        except (OSError, UnicodeDecodeError):
            continue                  # gone meanwhile, or not ours
    return found


def open_files_under(root: str, ignore: tuple[str, ...] = ()) -> list[str]:
    """`pid N: path` for every file under `root` some process holds open (as `lsof +D` would list them), but
    paths containing one of `ignore`; a removed file shows as `path (deleted)`."""
    import os
    out = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(root + "/") and not any(x in target for x in ignore):
                out.append(f"pid {pid}: {target}")
    return out


def fd_targets(pid: int) -> list[str]:
    """What each open fd of `pid` points to (readlink of /proc/PID/fd/N: a path, `anon_inode:[eventfd]`,
    `anon_inode:[pidfd]`, `pipe:[...]`...); [] once the process is gone."""
    import os
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    for fd in fds:
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out
