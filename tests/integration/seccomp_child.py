"""Test helpers: run a function in a forked child (filters are irreversible) and make raw syscalls there,
including i386 syscalls through `int 0x80` so that the filter's architecture handling can be observed."""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# x86_64 syscall numbers used by the tests
NR = {"getpid": 39, "socket": 41, "kill": 62, "umask": 95, "getppid": 110, "personality": 135,
      "getpriority": 140, "chroot": 161, "mount": 165, "sethostname": 170, "keyctl": 250,
      "unshare": 272, "setns": 308, "clone3": 435}
# i386 numbers
NR_I386 = {"getpid": 20, "getppid": 64, "unshare": 310, "keyctl": 288}
X32_SYSCALL_BIT = 0x40000000


@dataclass(frozen=True)
class ChildResult:
    exit_code: int | None  # None when killed by a signal
    signal: int | None
    value: object  # what the function returned (JSON round trip), None if it did not return


def run_child(fn: Callable[[], object]) -> ChildResult:
    """Forks; the child runs fn() and sends its JSON-encoded result back, then _exits(0).
    An exception in the child is reported as {"exception": "Type: message"}."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code = 0
        try:
            try:
                value = fn()
            except BaseException as err:  # report everything, the child must never return into pytest
                value = {"exception": f"{type(err).__name__}: {err}"}
            data = json.dumps(value).encode()
            while data:
                data = data[os.write(w, data):]
        except BaseException:
            code = 99
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    with os.fdopen(r, "rb") as f:
        chunks.append(f.read())
    _, status = os.waitpid(pid, 0)
    raw = b"".join(chunks)
    value = json.loads(raw) if raw else None
    if os.WIFSIGNALED(status):
        return ChildResult(None, os.WTERMSIG(status), value)
    return ChildResult(os.WEXITSTATUS(status), None, value)


def sys_call(name_or_nr: str | int, *args: int) -> tuple[int, int]:
    """A raw x86_64 syscall: (return value, errno or 0). Arguments are passed as full 64-bit values."""
    nr = NR[name_or_nr] if isinstance(name_or_nr, str) else name_or_nr
    ctypes.set_errno(0)
    ret = _libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a) for a in args])
    return (ret, ctypes.get_errno() if ret == -1 else 0)


_i386_stub: object = None


def i386_call(nr: int, arg1: int = 0, arg2: int = 0) -> tuple[int, int]:
    """An i386 syscall from this 64-bit process through `int 0x80`: (return value, errno or 0).
    The kernel (and seccomp) see it with AUDIT_ARCH_I386 and the i386 numbering."""
    global _i386_stub
    if _i386_stub is None:
        code = bytes([
            0x53,              # push rbx (callee-saved)
            0x48, 0x89, 0xF8,  # mov rax, rdi  (nr)
            0x48, 0x89, 0xF3,  # mov rbx, rsi  (arg1)
            0x48, 0x89, 0xD1,  # mov rcx, rdx  (arg2)
            0xCD, 0x80,        # int 0x80
            0x5B,              # pop rbx
            0xC3,              # ret
        ])
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(code)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
        fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_long, ctypes.c_long, ctypes.c_long)(addr)
        _i386_stub = (page, fn)
    ret = _i386_stub[1](nr, arg1, arg2)  # type: ignore[index]
    if -4096 < ret < 0:
        return (-1, -ret)
    return (ret, 0)


def i386_supported() -> bool:
    """Whether the kernel runs i386 syscalls (IA32 emulation can be compiled out or disabled at boot)."""
    res = run_child(lambda: i386_call(NR_I386["getpid"])[0] == os.getpid())
    return res.exit_code == 0 and res.value is True


def status_fields(*names: str) -> dict[str, str]:
    with open("/proc/self/status") as f:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    return {n: fields[n].strip() for n in names}


SIGSYS = signal.SIGSYS
