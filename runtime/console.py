"""Terminals: a pty allocated inside the container, its master sent over --console-socket (SCM_RIGHTS).

Used by the container init and by exec; it does not read or write the terminal's data.
"""
from __future__ import annotations

import fcntl
import os
import socket
import struct
import termios

TIOCGPTN = 0x80045430
TIOCSPTLCK = 0x40045431


def open_pty() -> tuple[int, int, str]:
    """Opens /dev/ptmx (the container's devpts instance) and its slave; returns (master, slave, slave path)."""
    master = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(master, TIOCSPTLCK, struct.pack("i", 0))
        n = struct.unpack("I", fcntl.ioctl(master, TIOCGPTN, b"\0\0\0\0"))[0]
        path = f"/dev/pts/{n}"
        slave = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except BaseException:
        os.close(master)
        raise
    return master, slave, path


def set_size(fd: int, height: int, width: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))


def send_master(sock_fd: int, master: int) -> None:
    """Sends the pty master over the connected console socket, as runc does (payload: the ptmx path)."""
    sock = socket.socket(fileno=sock_fd)
    try:
        socket.send_fds(sock, [b"/dev/ptmx"], [master])
    finally:
        sock.detach()


def connect(path: str) -> int:
    """Connects to the --console-socket path (in the runtime's mount namespace) and returns the fd."""
    from runtime.errors import SetupError
    try:
        import stat
        mode = os.stat(path).st_mode
        if not stat.S_ISSOCK(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a fifo" if stat.S_ISFIFO(mode)
                    else "a regular file" if stat.S_ISREG(mode) else "not a socket")
            raise SetupError(f"--console-socket {path} is not a unix socket (it is {kind})")
    except OSError as e:
        raise SetupError(f"--console-socket {path}: {e.strerror}") from None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        from runtime.errors import describe
        raise SetupError(f"connect to console socket {path}: {describe(e)}") from None
    return s.detach()


def make_controlling(slave: int) -> None:
    """Makes the pty slave the process's stdio and controlling terminal (the process must lead a session)."""
    for fd in (0, 1, 2):
        os.dup2(slave, fd)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
