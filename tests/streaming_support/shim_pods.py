"""Real containers behind the streaming server: busybox bundles run by husk-shim (runtime runc), a
StreamTargets over them, and a StreamingServer with HuskStreamBackend, with leak checks on both sides.

Every container gets a unique `hstrm-` id; cleanup force-deletes it, ends its shim by pid, removes its
cgroups. Used by tests/integration/streaming/test_streaming_husk*.py (root).
"""
from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from cri_server.streaming import StreamingOptions, StreamingServer, shimexec
from cri_server.streaming.husk_backend import HuskStreamBackend
from cri_server.streaming.targets import ContainerTarget
from shim.pb import google
from shim.pb import husk as huskpb
from shim.pb import task_types
from tests.shim_fixtures import RunningShim, cleanup_shim, make_bundle, start_shim, unique
from tests.support.waiting import wait_for_async

# The tests run over every runtime the shim can drive here (runc, and husk when runtime/ is importable).
DEFAULT_RUNTIME = "runc"
MARK = "HSTRM_MARK=from-the-container-spec"
EXTRA_APPLETS = ("httpd", "pwd", "grep", "mkdir")


@dataclass
class ShimContainer:
    shim: RunningShim
    bundle: str
    target: ContainerTarget
    init_pid: int = 0

    @property
    def cid(self) -> str:
        return self.shim.cid

    @property
    def rootfs(self) -> str:
        return os.path.join(self.bundle, "rootfs")

    def pids(self) -> list[int]:
        with self.shim.client() as c:
            return sorted(p.pid for p in c.Pids(id=self.cid).processes)

    def status(self) -> int:
        with self.shim.client() as c:
            return c.State(id=self.cid).status

    def shim_children(self) -> list[int]:
        """Live (non-zombie) host processes whose parent is the shim: its container init, and any exec
        or runtime process still around."""
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.shim.proc.pid and fields[0] != "Z":
                out.append(int(entry))
        return sorted(out)

    def leftover_execs(self) -> list[str]:
        """Exec processes the shim still holds (each has an attach socket until it is deleted)."""
        return sorted(os.path.basename(p) for p in glob.glob(os.path.join(self.shim.state_dir, "attach-*.sock")))


def start_container(tmp: str, args: list[str], *, tty: bool = False, stdin: bool = False, stdin_once: bool = False,
                    netns: str | None = None, runtime: str = DEFAULT_RUNTIME) -> ShimContainer:
    """Create and start a busybox container under its own shim. Its process has a marker variable in
    its env and /tmp as cwd, so tests can see that execs inherit them."""
    cid = unique("hstrm")
    bundle = make_bundle(tmp, cid, args, terminal=tty)
    for applet in EXTRA_APPLETS:
        with contextlib.suppress(FileExistsError):
            os.symlink("busybox", os.path.join(bundle, "rootfs", "bin", applet))
    cfg_path = os.path.join(bundle, "config.json")
    with open(cfg_path) as f:
        spec = json.load(f)
    spec["process"]["env"].append(MARK)
    spec["process"]["cwd"] = "/tmp"
    if netns is not None:
        for ns in spec["linux"]["namespaces"]:
            if ns["type"] == "network":
                ns["path"] = netns
    with open(cfg_path, "w") as f:
        json.dump(spec, f)
    shim = start_shim(tmp, runtime, cid=cid)
    try:
        opts = huskpb.CreateOptions(stdin_once=stdin_once)
        with shim.client() as c:
            c.Create(id=cid, bundle=bundle, terminal=tty, stdin="attach:" if stdin else "", stdout="attach:",
                     stderr="" if tty else "attach:",
                     options=google.Any(type_url=opts.FULL_NAME, value=opts.encode()))
            pid = c.Start(id=cid).pid
    except BaseException:
        cleanup_shim(shim)
        raise
    target = ContainerTarget(cid, shim.address, running=True, tty=tty, stdin=stdin, stdin_once=stdin_once)
    return ShimContainer(shim, bundle, target, pid)


def stop_container(c: ShimContainer) -> None:
    cleanup_shim(c.shim)


@dataclass
class Targets:
    """StreamTargets for tests: whatever the test registered."""

    containers: dict[str, ContainerTarget] = field(default_factory=dict)
    netns: dict[str, str] = field(default_factory=dict)

    def add(self, c: ShimContainer, **changes: object) -> None:
        self.containers[c.cid] = replace(c.target, **changes)  # type: ignore[arg-type]

    async def container(self, container_id: str) -> ContainerTarget | None:
        return self.containers.get(container_id)

    async def sandbox_netns(self, sandbox_id: str) -> str | None:
        return self.netns.get(sandbox_id)


@contextlib.asynccontextmanager
async def serving(targets: Targets, containers: tuple[ShimContainer, ...] = (), first_size_wait: float = 0.5,
                  own_children: bool = False, **options: object) -> AsyncIterator[StreamingServer]:
    """A StreamingServer with HuskStreamBackend; on exit: stopped, no task left on the loop, and each
    listed container with no exec left in its shim, no child of its shim besides the init, and (unless
    own_children: attach tests, whose container may be between a child's output and its exit) no
    process in its cgroup besides the init."""
    before = set(asyncio.all_tasks())
    srv = StreamingServer(("127.0.0.1", 0), HuskStreamBackend(targets, first_size_wait), options=StreamingOptions(**options))  # type: ignore[arg-type]
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()
        # a cancelled session's exec cleanup runs on after stop() (as husk-cri's shutdown, wait for it)
        assert await shimexec.drain_closes(10) == 0, "exec cleanups still running 10 s after stop()"
        await asyncio.sleep(0)
        leftover = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task() and not t.done()]
        assert not leftover, f"tasks left running after stop(): {leftover}"
        assert srv.active_connections == 0
        for c in containers:
            await assert_no_leaks(c, own_children)


async def assert_no_leaks(c: ShimContainer, own_children: bool = False) -> None:
    loop = asyncio.get_running_loop()
    execs = await loop.run_in_executor(None, c.leftover_execs)
    assert not execs, f"{c.cid}: execs left in the shim: {execs}"
    if await loop.run_in_executor(None, c.status) == task_types.Status.RUNNING:  # only its init may be left
        if not own_children:
            pids = await loop.run_in_executor(None, c.pids)
            assert pids == [c.init_pid], f"{c.cid}: processes besides the init {c.init_pid}: {pids}"
        children = await loop.run_in_executor(None, c.shim_children)
        assert children == [c.init_pid], f"{c.cid}: the shim has children besides the init: {children}"


async def wait_until(pred, what: str, limit: float = 60.0, step: float = 0.02):
    """waiting.wait_for_async for a blocking predicate (it talks to the shim): run in a thread, so the
    streaming server in this loop keeps serving meanwhile."""
    loop = asyncio.get_running_loop()
    return await wait_for_async(lambda: loop.run_in_executor(None, pred), limit, what, step)


logging.getLogger("husk.cri.streaming").setLevel(logging.DEBUG)
