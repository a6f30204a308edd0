"""The RuntimeDefault seccomp profile as an OCI `linux.seccomp` object, equivalent to the default profile of
containerd's CRI plugin and Docker: an allow-list with EPERM for everything else.

It only builds the dict (husk-cri puts it into the spec); it does not validate or load it (runtime.seccomp).

Choices, where the two upstream profiles differ or moved on:
- io_uring_setup/enter/register are not allowed (Docker 25 and containerd 2 dropped them: io_uring
  operations bypass seccomp);
- `socket` is allowed for every family but AF_VSOCK (as Docker); the i386 `socketcall` multiplexer
  cannot be inspected and stays allowed;
- ptrace is allowed without CAP_SYS_PTRACE (both allow it on kernels from 4.8, which we require);
- the newer syscalls libseccomp 2.5.4 (Debian 12) knows are allowed: cachestat, fchmodat2, futex_wait,
  futex_wake, futex_requeue, map_shadow_stack.
"""
from __future__ import annotations

import errno
import os

# Allowed for every container, whatever its capabilities. Syscalls that exist only on some of the
# filter's architectures (e.g. the *32 and *_time64 variants of i386) are listed too; libseccomp
# leaves them out where they do not exist.
_ALWAYS = """
    accept accept4 access adjtimex alarm bind brk cachestat capget capset chdir chmod chown chown32
    clock_adjtime clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64
    clock_nanosleep clock_nanosleep_time64 close close_range connect copy_file_range creat dup dup2 dup3
    epoll_create epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old
    eventfd eventfd2 execve execveat exit exit_group
    faccessat faccessat2 fadvise64 fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat fchmodat2
    fchown fchown32 fchownat fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr
    fstat fstat64 fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64
    futex futex_requeue futex_time64 futex_wait futex_waitv futex_wake futimesat
    getcpu getcwd getdents getdents64 getegid getegid32 geteuid geteuid32 getgid getgid32 getgroups getgroups32
    getitimer getpeername getpgid getpgrp getpid getppid getpriority getrandom getresgid getresgid32
    getresuid getresuid32 getrlimit get_robust_list getrusage getsid getsockname getsockopt get_thread_area
    gettid gettimeofday getuid getuid32 getxattr
    inotify_add_watch inotify_init inotify_init1 inotify_rm_watch
    io_cancel ioctl io_destroy io_getevents io_pgetevents io_pgetevents_time64 ioprio_get ioprio_set
    io_setup io_submit ipc kill landlock_add_rule landlock_create_ruleset landlock_restrict_self
    lchown lchown32 lgetxattr link linkat listen listxattr llistxattr _llseek lremovexattr lseek lsetxattr
    lstat lstat64 madvise map_shadow_stack membarrier memfd_create memfd_secret mincore mkdir mkdirat
    mknod mknodat mlock mlock2 mlockall mmap mmap2 mprotect
    mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend mq_timedsend_time64
    mq_unlink mremap msgctl msgget msgrcv msgsnd msync munlock munlockall munmap
    nanosleep newfstatat _newselect open openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2
    poll ppoll ppoll_time64 prctl pread64 preadv preadv2 prlimit64 process_mrelease pselect6
    pselect6_time64 ptrace pwrite64 pwritev pwritev2
    read readahead readlink readlinkat readv recv recvfrom recvmmsg recvmmsg_time64 recvmsg
    remap_file_pages removexattr rename renameat renameat2 restart_syscall rmdir rseq
    rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait
    rt_sigtimedwait_time64 rt_tgsigqueueinfo
    sched_getaffinity sched_getattr sched_getparam sched_get_priority_max sched_get_priority_min
    sched_getscheduler sched_rr_get_interval sched_rr_get_interval_time64 sched_setaffinity sched_setattr
    sched_setparam sched_setscheduler sched_yield seccomp select semctl semget semop semtimedop
    semtimedop_time64 send sendfile sendfile64 sendmmsg sendmsg sendto
    setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32 setgroups setgroups32 setitimer setpgid
    setpriority setregid setregid32 setresgid setresgid32 setresuid setresuid32 setreuid setreuid32
    setrlimit set_robust_list setsid setsockopt set_thread_area set_tid_address setuid setuid32 setxattr
    shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4 sigprocmask sigreturn socketcall
    socketpair splice stat stat64 statfs statfs64 statx symlink symlinkat sync sync_file_range syncfs
    sysinfo tee tgkill time timer_create timer_delete timer_getoverrun timer_gettime timer_gettime64
    timer_settime timer_settime64 timerfd_create timerfd_gettime timerfd_gettime64 timerfd_settime
    timerfd_settime64 times tkill truncate truncate64 ugetrlimit umask uname unlink unlinkat utime
    utimensat utimensat_time64 utimes vfork vmsplice wait4 waitid waitpid write writev
""".split()

# personality(2) personas a container may switch to: PER_LINUX, PER_LINUX with UNAME26 (0x0008),
# PER_LINUX32 (0x20000 and with UNAME26), and 0xffffffff, which only queries the current one.
_PERSONAS = (0x0, 0x0008, 0x20000, 0x20008, 0xFFFFFFFF)

AF_VSOCK = 40

# The namespace flags of clone(2): without CAP_SYS_ADMIN a container may clone, but not into new namespaces.
_CLONE_NAMESPACE_FLAGS = (0x00020000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
                          | 0x02000000)  # NEWNS UTS IPC USER PID NET CGROUP

# Syscalls a capability makes useful; allowed only when the container's bounding set has it.
_BY_CAPABILITY: dict[str, tuple[str, ...]] = {
    "CAP_DAC_READ_SEARCH": ("open_by_handle_at",),
    "CAP_SYS_ADMIN": ("bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen", "fspick",
                      "lookup_dcookie", "mount", "mount_setattr", "move_mount", "name_to_handle_at", "open_tree",
                      "perf_event_open", "quotactl", "quotactl_fd", "setdomainname", "sethostname", "setns",
                      "syslog", "umount", "umount2", "unshare"),
    "CAP_SYS_BOOT": ("reboot",),
    "CAP_SYS_CHROOT": ("chroot",),
    "CAP_SYS_MODULE": ("delete_module", "init_module", "finit_module"),
    "CAP_SYS_PACCT": ("acct",),
    "CAP_SYS_PTRACE": ("kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev"),
    "CAP_SYS_RAWIO": ("iopl", "ioperm"),
    "CAP_SYS_TIME": ("settimeofday", "stime", "clock_settime", "clock_settime64"),
    "CAP_SYS_TTY_CONFIG": ("vhangup",),
    "CAP_SYS_NICE": ("get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"),
    "CAP_SYSLOG": ("syslog",),
    "CAP_BPF": ("bpf",),
    "CAP_PERFMON": ("perf_event_open",),
}

# The capabilities a CRI container gets when the pod asks for none (containerd's default set).
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
)

# uname machine -> (the filter's architectures, syscalls only that platform has, clone's flags argument)
_PLATFORMS: dict[str, tuple[tuple[str, ...], tuple[str, ...], int]] = {
    "x86_64": (("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"), ("arch_prctl", "modify_ldt"), 0),
    "i686": (("SCMP_ARCH_X86",), ("modify_ldt",), 0),
    "aarch64": (("SCMP_ARCH_ARM", "SCMP_ARCH_AARCH64"),
                ("arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint", "cacheflush",
                 "set_tls"), 0),
    "armv7l": (("SCMP_ARCH_ARM",),
               ("arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint", "cacheflush",
                "set_tls"), 0),
    "ppc64le": (("SCMP_ARCH_PPC64LE",), ("sync_file_range2", "swapcontext"), 0),
    # s390's clone takes the stack first and the flags second.
    "s390x": (("SCMP_ARCH_S390", "SCMP_ARCH_S390X"),
              ("s390_pci_mmio_read", "s390_pci_mmio_write", "s390_runtime_instr"), 1),
    "riscv64": (("SCMP_ARCH_RISCV64",), ("riscv_flush_icache",), 0),
    "mips64": (("SCMP_ARCH_MIPS", "SCMP_ARCH_MIPS64", "SCMP_ARCH_MIPS64N32"), (), 0),
}


def _allow(names: list[str] | tuple[str, ...], *args: dict) -> dict:
    rule: dict = {"names": list(names), "action": "SCMP_ACT_ALLOW"}
    if args:
        rule["args"] = list(args)
    return rule


def default_profile(capabilities: list[str] | tuple[str, ...] | None = None, machine: str | None = None) -> dict:
    """The default profile for a container whose bounding set is `capabilities` (None: the CRI default set)
    on `machine` (None: this host's `uname -m`). The result is a fresh dict the caller may change."""
    caps = set(DEFAULT_CAPABILITIES if capabilities is None else capabilities)
    machine = machine or os.uname().machine
    arches, platform_names, clone_flags_arg = _PLATFORMS.get(machine, ((), (), 0))

    rules = [_allow(_ALWAYS)]
    rules += [_allow(["personality"], {"index": 0, "value": p, "op": "SCMP_CMP_EQ"}) for p in _PERSONAS]
    rules.append(_allow(["socket"], {"index": 0, "value": AF_VSOCK, "op": "SCMP_CMP_NE"}))
    if platform_names:
        rules.append(_allow(platform_names))
    for cap, names in _BY_CAPABILITY.items():
        if cap in caps:
            rules.append(_allow(names))
    if "CAP_SYS_ADMIN" not in caps:
        rules.append(_allow(["clone"], {"index": clone_flags_arg, "value": _CLONE_NAMESPACE_FLAGS, "valueTwo": 0,
                                        "op": "SCMP_CMP_MASKED_EQ"}))
        # ENOSYS, not EPERM: clone3's flags live in memory that seccomp cannot inspect, and C libraries
        # fall back to clone on ENOSYS (whose flags the rule above checks).
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})

    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": errno.EPERM,
        "architectures": list(arches),
        "syscalls": rules,
    }
