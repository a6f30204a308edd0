"""husk-cri's side of the shims: starting one per pod sandbox, where it lives, talking to it.

Owns the shim directory layout under the run dir (<state>/shims/<id>/: the task's exit files and attach
sockets; for the shim's first task, a sandbox, also the socket and the shim log) and one asyncio ttrpc
client per live shim (keyed by its address: the tasks of a pod share it). Shims are forked by the spawner
(zygote) started before gRPC; without one (tests, or a zygote that died) a fresh `husk-shim start` process
is used. Which tasks share a shim is the caller's (cri_server.tasks): this module decides nothing about pods.
Records made before shims were grouped have a shim per container: they work the same (one task, own socket).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any

from cri_server.errors import Internal

log = logging.getLogger(__name__)

SHIMS_DIR = "shims"


@dataclass(frozen=True)
class ShimPaths:
    dir: str        # the shim's state dir: exit files, attach sockets, init.pid
    socket: str     # the ttrpc socket
    log: str        # the shim's own log (not the container's)


class ShimGone(Exception):
    """The shim cannot be reached (it exited or was killed); `exit` is its durable exit record if any."""


class ShimManager:
    def __init__(self, state_dir: str, runtime_root: str, spawner: Any = None, debug: bool = False,
                 default_runtime: str = "", systemd_cgroup: bool = False) -> None:
        self.base = os.path.join(state_dir, SHIMS_DIR)
        self.runtime_root = runtime_root
        self.default_runtime = default_runtime
        self.systemd_cgroup = systemd_cgroup
        self.spawner = spawner
        self.debug = debug
        self._clients: dict[str, Any] = {}           # by shim address
        self._connecting: dict[str, asyncio.Future[Any]] = {}
        os.makedirs(self.base, mode=0o711, exist_ok=True)

    def root_for(self, runtime: str) -> str:
        """The --root of `runtime`: the configured one for the default runtime, a sibling for every other
        (two runtimes must not share a state directory)."""
        if not runtime or runtime == self.default_runtime:
            return self.runtime_root
        return f"{self.runtime_root}-{os.path.basename(runtime)}"

    def paths(self, object_id: str) -> ShimPaths:
        d = os.path.join(self.base, object_id)
        return ShimPaths(d, os.path.join(d, "shim.sock"), os.path.join(d, "shim.log"))

    def task_dir(self, object_id: str) -> str:
        """The state dir of a task grouped into another object's shim (made here; the shim fills it)."""
        d = self.paths(object_id).dir
        os.makedirs(d, mode=0o711, exist_ok=True)
        return d

    def shim_dir(self, address: str) -> str:
        """The directory of the shim listening at `address` if it is one of ours, else ""."""
        path = address[len("unix://"):] if address.startswith("unix://") else address
        d = os.path.dirname(path)
        return d if path and os.path.dirname(d) == self.base else ""

    def create_options(self, **fields: Any) -> Any:
        """The options of a task Create (husk.shim.v1.CreateOptions as a google.protobuf.Any): `fields` plus
        what every task of this husk-cri shares, the cgroup driver the runtime runs with (in-process or a
        binary, which gets --systemd-cgroup)."""
        from shim.pb import google
        from shim.pb import husk as huskpb
        opts = huskpb.CreateOptions(systemd_cgroup=self.systemd_cgroup, **fields)
        return google.Any(type_url=huskpb.CreateOptions.FULL_NAME, value=opts.encode())

    # --- starting ---------------------------------------------------------------------------
    async def spawn(self, object_id: str, bundle: str, runtime: str) -> tuple[int, str]:
        """Starts the shim of `object_id` (detached: it outlives husk-cri); returns (pid, address)."""
        from shim.service import ShimConfig
        p = self.paths(object_id)
        os.makedirs(p.dir, mode=0o711, exist_ok=True)
        cfg = ShimConfig(id=object_id, address=p.socket, state_dir=p.dir, namespace="k8s.io", runtime=runtime,
                         runtime_root=self.root_for(runtime), bundle=bundle, allowed_uids=(0,))
        loop = asyncio.get_running_loop()
        if self.spawner is not None and self.spawner.pid:
            from shim.spawner import SpawnError
            try:
                spawned = await loop.run_in_executor(None, lambda: self.spawner.spawn(cfg, p.log, self.debug))
                return int(spawned.pid), spawned.address
            except SpawnError as e:
                if "spawner exited" not in str(e) and "spawner:" not in str(e):
                    raise Internal(f"start shim for {object_id}: {e}") from None
                log.error("the shim spawner is gone; starting shims as fresh processes",
                          extra={"id": object_id, "error": str(e)})
                self.spawner = None
        return await self._spawn_process(cfg, p)

    async def _spawn_process(self, cfg: Any, p: ShimPaths) -> tuple[int, str]:
        args = [sys.executable, "-m", "shim.main", "start", "--id", cfg.id, "--address", cfg.address,
                "--state-dir", cfg.state_dir, "--runtime", cfg.runtime, "--runtime-root", cfg.runtime_root,
                "--bundle", cfg.bundle, "--log", p.log]
        if self.debug:
            args.append("--debug")
        proc = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise Internal(f"start shim for {cfg.id}: exit {proc.returncode}: {err.decode(errors='replace')[-500:]}")
        try:
            doc = json.loads(out.decode().strip().splitlines()[-1])
            return int(doc["pid"]), str(doc["address"])
        except (ValueError, KeyError, IndexError):
            raise Internal(f"start shim for {cfg.id}: unexpected output {out[-300:]!r}") from None

    # --- clients ----------------------------------------------------------------------------
    async def client(self, object_id: str, address: str) -> Any:
        """The (cached) connection to the shim at `address` (serving `object_id`); ShimGone when nobody
        answers there."""
        c = self._clients.get(address)
        if c is not None and not c.closed:
            return c
        fut = self._connecting.get(address)
        if fut is not None:
            return await asyncio.shield(fut)
        fut = asyncio.get_running_loop().create_future()
        self._connecting[address] = fut
        try:
            from shim.client import AsyncTtrpcClient
            try:
                c = await AsyncTtrpcClient.connect(address)
            except OSError as e:
                raise ShimGone(f"shim of {object_id} at {address}: {e.strerror or e}") from None
            self._clients[address] = c
            fut.set_result(c)
            return c
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: waiters get it through shield
            raise
        finally:
            del self._connecting[address]

    async def call(self, object_id: str, address: str, method: str, timeout: float | None = 60.0,
                   **fields: Any) -> Any:
        """One task API call; a dropped connection becomes ShimGone (one reconnect is tried first)."""
        for attempt in (0, 1):
            c = await self.client(object_id, address)
            try:
                return await c.task(method, timeout=timeout, **fields)
            except ConnectionError as e:
                await self.forget(address, c)
                if attempt:
                    raise ShimGone(f"shim of {object_id}: {e}") from None
        raise AssertionError("unreachable")

    async def husk_call(self, object_id: str, address: str, method: str, timeout: float | None = 60.0,
                        **fields: Any) -> Any:
        c = await self.client(object_id, address)
        try:
            return await c.husk(method, timeout=timeout, **fields)
        except ConnectionError as e:
            await self.forget(address, c)
            raise ShimGone(f"shim of {object_id}: {e}") from None

    async def forget(self, address: str, client: Any = None) -> None:
        """Closes the connection to the shim at `address` (only if it is still `client`, when given: another
        task's call may have reconnected already)."""
        c = self._clients.get(address)
        if c is None or (client is not None and c is not client):
            return
        del self._clients[address]
        if c is not None:
            try:
                await c.close()
            except (OSError, RuntimeError):
                pass

    # --- ending -----------------------------------------------------------------------------
    async def shutdown(self, object_id: str, address: str, pid: int = 0, shared: bool = False) -> None:
        """`object_id`'s task is done with its shim (deleted, or to be abandoned): removes the task's
        directory, and ends the shim with its directory unless `shared` (another task of the pod still
        uses it). The shim itself refuses to end while it serves another task. Idempotent."""
        from shim import ttrpc_wire as w
        own = self.paths(object_id).dir
        shim_dir = self.shim_dir(address) if address else own
        if shared:
            if own != shim_dir:
                shutil.rmtree(own, ignore_errors=True)
            return
        gone = True
        if address:
            try:
                await self.call(object_id, address, "Shutdown", timeout=10.0, id=object_id, now=True)
            except ShimGone:
                pass
            except w.TtrpcError as e:
                log.warning("shim shutdown failed", extra={"id": object_id, "error": str(e)})
            await self.forget(address)
        if pid > 0:
            gone = await _wait_gone(pid, 5.0)
        if own != shim_dir or gone:
            shutil.rmtree(own, ignore_errors=True)
        if shim_dir and shim_dir != own and gone:
            shutil.rmtree(shim_dir, ignore_errors=True)

    def exit_record(self, object_id: str, exec_id: str = "") -> Any:
        """The shim's durable exit record of the init (or an exec), None if it has none."""
        from shim import exitfile
        return exitfile.read(self.paths(object_id).dir, exec_id)

    async def close(self) -> None:
        for address in list(self._clients):
            await self.forget(address)


async def _wait_gone(pid: int, timeout: float) -> bool:
    """Waits until `pid` no longer exists (a shim is not our child: poll /proc); False on timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.002
    while os.path.exists(f"/proc/{pid}") and _not_zombie(pid):
        if loop.time() > deadline:
            log.warning("shim still alive after shutdown", extra={"pid": pid})
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False
