"""husk-cri's stop (issue 19 item 5a): the event loop runner does not wait for executor threads (a worker left
by a cancelled stats RPC, the metrics server's 0.5 s poll), which asyncio.run does."""
from __future__ import annotations

import asyncio
import threading

from cri_server import daemon
from tests.support.waiting import wait_for_async


def test_run_loop_returns_without_waiting_for_executor_threads():
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def worker() -> None:
        started.set()
        release.wait(10)  # with asyncio.run, run_loop would return only after this
        finished.set()

    async def main() -> int:
        asyncio.get_running_loop().run_in_executor(None, worker)
        await wait_for_async(started.is_set, 10, "the worker to start", interval=0.001)
        return 7

    try:
        assert daemon.run_loop(main()) == 7
        assert not finished.is_set()  # returned while the worker was still busy
    finally:
        release.set()


def test_run_loop_cancels_tasks_left_behind():
    seen: list[str] = []

    async def left() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> str:
        asyncio.ensure_future(left())
        await asyncio.sleep(0)
        return "done"

    assert daemon.run_loop(main()) == "done"
    assert seen == ["cancelled"]
