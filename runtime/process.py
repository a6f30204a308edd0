"""The last steps before a container process runs: rlimits, user, capabilities, no_new_privs, env, execve.

Shared by the container init and `husk exec`; runs inside the container (after pivot_root or setns).
Nothing here forks; `exec_program` never returns.
"""
from __future__ import annotations

import os
import _signal as signal  # the C module: `signal` builds enums on import (~2 ms)
TYPE_CHECKING = False  # `typing` costs ~4 ms (it imports re): annotations only
if TYPE_CHECKING:
    from typing import Any

from runtime.config import RLIMITS
from runtime.errors import SetupError
from runtime.linux import syscalls as sc

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def env_dict(env: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in env:
        k, _, v = item.partition("=")
        out[k] = v
    return out


def find_executable(arg0: str, env: dict[str, str], cwd: str = "/") -> str:
    """Resolves args[0] with the container's PATH (like execvp, but reported before the process starts)."""
    if "/" in arg0:
        path = arg0 if arg0.startswith("/") else os.path.join(cwd, arg0)
        _check_exec(path, arg0)
        return path
    for d in (env.get("PATH") or DEFAULT_PATH).split(":"):
        cand = os.path.join(d or ".", arg0)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise SetupError(f'exec: "{arg0}": executable file not found in $PATH')


def _check_exec(path: str, arg0: str) -> None:
    try:
        st = os.stat(path)
    except OSError as e:
        raise SetupError(f'exec: "{arg0}": {e.strerror}') from None
    import stat
    if stat.S_ISDIR(st.st_mode):
        raise SetupError(f'exec: "{arg0}": is a directory')
    if not os.access(path, os.X_OK):
        raise SetupError(f'exec: "{arg0}": permission denied')


def home_for(uid: int) -> str:
    try:
        with open("/etc/passwd") as f:
            for line in f:
                parts = line.rstrip("\n").split(":")
                if len(parts) >= 6 and parts[2] == str(uid):
                    return parts[5] or "/"
    except OSError:
        pass
    return "/"


def set_rlimits(rlimits: list[dict[str, Any]]) -> None:
    import resource
    for rl in rlimits:
        soft, hard = rl["soft"], rl["hard"]
        inf = resource.RLIM_INFINITY
        soft = inf if soft >= 2**64 - 1 else soft
        hard = inf if hard >= 2**64 - 1 else hard
        try:
            resource.setrlimit(RLIMITS[rl["type"]], (soft, hard))
        except (OSError, ValueError) as e:
            cur = resource.getrlimit(RLIMITS[rl["type"]])
            why = getattr(e, "strerror", None) or str(e)
            raise SetupError(f"setrlimit {rl['type']} to soft={rl['soft']} hard={rl['hard']}: {why} "
                             f"(current hard limit {cur[1]}; raising it needs CAP_SYS_RESOURCE)") from None


def set_oom_score_adj(value: int) -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(value))
    except OSError as e:
        with open("/proc/self/oom_score_adj") as f:
            cur = f.read().strip()
        raise SetupError(f"process.oomScoreAdj: set to {value}: {e.strerror} (current value {cur}; lowering it "
                         f"needs CAP_SYS_RESOURCE, which this host's bounding set lacks)") from None


def set_apparmor(profile: str) -> None:
    if not os.path.isdir("/sys/kernel/security/apparmor"):
        raise SetupError(f"process.apparmorProfile {profile!r} is set but AppArmor is not enabled on this host")
    for path in ("/proc/self/attr/apparmor/exec", "/proc/self/attr/exec"):
        try:
            with open(path, "w") as f:
                f.write(f"exec {profile}")
            return
        except FileNotFoundError:
            continue
        except OSError as e:
            raise SetupError(f"apply AppArmor profile {profile!r}: {e.strerror}") from None


_POLICIES = {"SCHED_OTHER": 0, "SCHED_FIFO": 1, "SCHED_RR": 2, "SCHED_BATCH": 3, "SCHED_IDLE": 5}
_IOPRIO_CLASSES = {"IOPRIO_CLASS_RT": 1, "IOPRIO_CLASS_BE": 2, "IOPRIO_CLASS_IDLE": 3}


def apply_scheduling(proc: dict[str, Any], personality: dict[str, Any] | None = None) -> None:
    """process.scheduler, ioPriority, execCPUAffinity and linux.personality: all survive execve."""
    sched = proc.get("scheduler")
    if sched:
        policy = sched["policy"]
        if policy not in _POLICIES or sched.get("flags") or sched.get("runtime") or sched.get("deadline"):
            raise SetupError(f"process.scheduler: policy {policy} with flags/runtime/deadline is not supported "
                             f"by husk (sched_setattr); use SCHED_OTHER/FIFO/RR/BATCH/IDLE with priority and nice")
        try:
            os.sched_setscheduler(0, _POLICIES[policy], os.sched_param(sched.get("priority", 0)))
            if sched.get("nice") is not None:
                os.setpriority(os.PRIO_PROCESS, 0, sched["nice"])
        except OSError as e:
            raise SetupError(f"process.scheduler {policy}: {e.strerror}") from None
    prio = proc.get("ioPriority")
    if prio:
        try:
            sc.ioprio_set(_IOPRIO_CLASSES[prio["class"]], prio.get("priority", 0))
        except OSError as e:
            raise SetupError(f"process.ioPriority: {e.strerror}") from None
    aff = proc.get("execCPUAffinity")
    cpus = (aff or {}).get("final") or (aff or {}).get("initial")
    if cpus:
        try:
            os.sched_setaffinity(0, parse_cpu_list(cpus))
        except (OSError, ValueError) as e:
            raise SetupError(f"process.execCPUAffinity {cpus!r}: {getattr(e, 'strerror', None) or e}") from None
    if personality:
        if personality.get("flags"):
            raise SetupError("linux.personality.flags are not supported by husk")
        persona = sc.PER_LINUX32 if personality.get("domain") == "LINUX32" else sc.PER_LINUX
        try:
            sc.personality(persona)
        except OSError as e:
            raise SetupError(f"linux.personality: {e.strerror}") from None


def parse_cpu_list(text: str) -> set[int]:
    """'0-2,4' -> {0, 1, 2, 4}"""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    if not out:
        raise ValueError("empty cpu list")
    return out


def switch_user(user: dict[str, Any], denied: bool | None = None) -> None:
    """`denied`: setgroups_denied(), read earlier by a caller whose /proc/self no longer names it (`husk exec`'s
    stage, in the container's mount namespace but not in its pid namespace)."""
    uid, gid = user.get("uid", 0), user.get("gid", 0)
    if denied is None:
        denied = setgroups_denied()
    sc.set_keepcaps(True)
    try:
        groups = user.get("additionalGids") or []
        if groups or not denied:
            try:
                os.setgroups(groups)
            except OSError as e:
                why = (" (setgroups is denied in this user namespace: an unprivileged runtime wrote the gid map)"
                       if denied else "")
                raise SetupError(f"process.user.additionalGids {groups}: setgroups: {e.strerror}{why}") from None
        try:
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        except OSError as e:
            raise SetupError(f"switch to uid {uid} gid {gid}: {e.strerror} (is the id mapped?)") from None
    finally:
        sc.set_keepcaps(False)


def setgroups_denied() -> bool:
    try:
        with open("/proc/self/setgroups") as f:
            return f.read().strip() == "deny"
    except OSError:
        return False


def build_env(proc: dict[str, Any], extra: dict[str, str] | None = None) -> dict[str, str]:
    env = env_dict(proc.get("env") or [])
    if extra:
        env.update(extra)
    if "HOME" not in env:
        env["HOME"] = home_for((proc.get("user") or {}).get("uid", 0))
    return env


def enter_cwd(cwd: str) -> None:
    """chdir into process.cwd, then prove the result is inside the container (the CVE-2024-21626 class: a cwd
    such as /proc/self/fd/N naming a leaked host directory fd would put the process outside its root, where
    getcwd(3) can only answer ENOENT, "unreachable")."""
    try:
        os.chdir(cwd)
    except OSError as e:
        raise SetupError(f"process.cwd {cwd}: {e.strerror}") from None
    try:
        here = os.getcwd()
    except FileNotFoundError:
        here = ""
    if not here.startswith("/"):
        raise SetupError(f"process.cwd {cwd}: resolves to a directory outside the container (through a file "
                         f"descriptor or a magic link); refusing to run the process there")


def _enter_cwd_early(cwd: str) -> bool:
    """enter_cwd before the user switch; False (nothing done) when the runtime's user may not enter it, or on
    another chdir error, which the later attempt then reports."""
    try:
        os.chdir(cwd)
    except OSError:
        return False
    enter_cwd(cwd)
    return True


def close_fds(first: int, keep: tuple[int, ...] = ()) -> None:
    """Closes every fd from `first` up except those in `keep` (before anything can name them by /proc path)."""
    lo = first
    for fd in sorted(k for k in set(keep) if k >= first):
        if fd > lo:
            sc.close_range(lo, fd - 1)
        lo = fd + 1
    sc.close_range(lo, 0xFFFFFFFF)


def take_credentials(proc: dict[str, Any], *, seccomp: Any, preserve_fds: int, keep_fds: tuple[int, ...] = (),
                     rlimits_set: bool = False, personality: dict[str, Any] | None = None,
                     on_listener: Any = None) -> None:
    """The first half of starting a container process (exec_program is the second): rlimits, scheduling, fds
    made inheritable, cwd, seccomp without noNewPrivileges, then user, capabilities, AppArmor, no_new_privs and
    umask. The container init does this before it waits for `start` (runc's order), so that while it waits it
    holds the container's credentials only."""
    from runtime import capabilities
    caps = proc.get("capabilities") or {}
    user = proc.get("user") or {}
    nnp = bool(proc.get("noNewPrivileges"))
    if proc.get("rlimits") and not rlimits_set:
        set_rlimits(proc["rlimits"])
    apply_scheduling(proc, personality)
    # Before any seccomp filter: profiles written before close_range(2) existed (runtime-tools', older
    # docker ones) refuse it, and without noNewPrivileges the filter is loaded right below.
    first = 3 + preserve_fds
    sc.close_range(first, 0xFFFFFFFF, sc.CLOSE_RANGE_CLOEXEC)
    # stdio and the preserved fds must survive execve even if the caller opened them close-on-exec
    for fd in (0, 1, 2, *range(3, first), *keep_fds):
        try:
            os.set_inheritable(fd, True)
        except OSError:
            pass
    # runc's order: the cwd is entered as the runtime's user first (tried again after the user switch only if
    # that is refused), and the getcwd proof runs before a filter is loaded: a profile may refuse getcwd
    # (runtime-tools' linux_seccomp test does).
    cwd = proc.get("cwd") or "/"
    in_cwd = _enter_cwd_early(cwd)
    if seccomp is not None and not nnp:
        from runtime import seccomp as seccomp_mod
        seccomp_mod.install(seccomp, False, on_listener=on_listener)
    capabilities.drop_bounding(caps)
    switch_user(user)
    capabilities.apply(caps)
    if proc.get("apparmorProfile"):
        set_apparmor(proc["apparmorProfile"])
    if nnp:
        sc.set_no_new_privs()
    os.umask(user.get("umask", 0o022) if user.get("umask") is not None else 0o022)
    if not in_cwd:
        enter_cwd(cwd)


def default_signals() -> None:
    """Python ignores SIGPIPE and SIGXFSZ; ignored signals survive execve, so give the program the defaults
    (before any seccomp filter: a tight one may not allow rt_sigaction)."""
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def exec_program(proc: dict[str, Any], path: str, env: dict[str, str], *, seccomp: Any,
                 on_listener: Any = None) -> None:
    """The last step (signals already defaulted): seccomp with noNewPrivileges (last of all), execve."""
    if seccomp is not None and proc.get("noNewPrivileges"):
        from runtime import seccomp as seccomp_mod
        seccomp_mod.install(seccomp, True, on_listener=on_listener)
    try:
        os.execve(path, proc["args"], env)
    except OSError as e:
        raise SetupError(f'exec {proc["args"][0]!r}: {e.strerror}') from None
