"""The pull worker's protocol (images/pullworker.py) without a registry: errors cross the process boundary as the
same ImageError class, message, gRPC code and attributes; anything else is INTERNAL; a worker that dies without
an answer is an error naming its status; a worker whose stdin closes (husk-cri gone) stops its pull and exits."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys

import pytest

from cri_server.images import manifest as mf
from cri_server.images import pullworker
from cri_server.images.errors import ImageError, InvalidReference, NoSpace, PlatformNotFound, Unauthorized
from cri_server.images.pullworker import PullWorkerError, error_dict, error_from
from tests.support.registry import write_hosts_toml


def _roundtrip(e: BaseException) -> ImageError:
    return error_from(json.loads(json.dumps(error_dict(e))))


@pytest.mark.parametrize("err", [
    PlatformNotFound("docker.io/library/x:1", "linux/amd64", ["linux/arm64", "linux/s390x"]),
    NoSpace("pulling x", "/nonexistent/images/content", needed=10, written=4),
    InvalidReference("Bad//Ref", "empty path component"),
    Unauthorized("registry.test: credentials refused"),
])
def test_image_errors_keep_class_message_code_and_attributes(err: ImageError) -> None:
    got = _roundtrip(err)
    assert type(got) is type(err) and str(got) == str(err) and got.code == err.code
    assert {k: v for k, v in vars(got).items()} == {k: v for k, v in vars(err).items()}


def test_other_errors_are_internal() -> None:
    got = _roundtrip(PermissionError(13, "Permission denied", "/var/lib/husk/images/meta.db"))
    assert type(got) is PullWorkerError and got.code == "INTERNAL"
    assert str(got).startswith("PermissionError: ") and "meta.db" in str(got)
    # a class of the same name elsewhere is not trusted
    fake = {"module": "evil", "class": "NotFound", "message": "x", "attrs": {}}
    assert type(error_from(fake)) is PullWorkerError


def test_a_worker_without_an_answer_is_an_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(pullworker, "_interpreter",
                        lambda: (sys.executable, [sys.executable, "-c", "import sys; sys.exit(3)"]))
    with pytest.raises(PullWorkerError, match="exited with status 3 without a result"):
        asyncio.run(pullworker.run("busybox", None, mf.Platform("linux", "amd64"), None, str(tmp_path), None, {}))


def test_the_worker_stops_when_its_stdin_closes(tmp_path) -> None:
    srv = socket.socket()      # a registry that accepts and never answers: the pull hangs until told to stop
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    certs = str(tmp_path / "certs.d")
    write_hosts_toml(certs, "hang.test", f"http://127.0.0.1:{srv.getsockname()[1]}")
    exe, argv = pullworker._interpreter()
    proc = subprocess.Popen(argv, executable=exe, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        req = {"ref": "hang.test/x:1", "platform": {"os": "linux", "architecture": "amd64"}, "auth": None,
               "plain_http": None, "root": str(tmp_path / "root"), "registry_config_dir": certs,
               "options": {"retry_backoff": 0.01}, "log_level": 20, "ppid": os.getpid()}
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(req).encode() + b"\n")
        proc.stdin.flush()
        conn, _ = srv.accept()          # the worker is pulling
        proc.stdin.close()
        proc.wait(timeout=60)
        conn.close()
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
        result = json.loads(out.decode().strip().splitlines()[-1])
        assert result["error"]["class"] == "CancelledError", err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        srv.close()
