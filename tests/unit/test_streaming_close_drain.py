"""An exec's cleanup (ShimExec.close, run by close_shielded) outlives the cancelled session that started it, and
husk-cri's shutdown waits for it (shimexec.drain_closes) before ending the loop: before, the loop could end under
it and leave the exec's process running in its container and the exec in its shim."""
from __future__ import annotations

import asyncio

from cri_server.streaming import shimexec


class SlowClose:
    """Stands in for a ShimExec whose close (kill, wait, delete) is still talking to the shim."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.closed = False

    async def close(self) -> None:
        self.started.set()
        await self.gate.wait()
        self.closed = True


async def _cancelled_session(proc: SlowClose) -> None:
    session = asyncio.create_task(shimexec.close_shielded(proc))  # type: ignore[arg-type]
    await proc.started.wait()
    session.cancel()
    try:
        await session
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("the session was not cancelled")


def test_drain_waits_for_the_close_of_a_cancelled_session():
    async def main():
        proc = SlowClose()
        await _cancelled_session(proc)
        assert not proc.closed                      # the session is gone, its cleanup is not
        asyncio.get_running_loop().call_later(0.05, proc.gate.set)
        assert await shimexec.drain_closes(5) == 0
        assert proc.closed
    asyncio.run(main())


def test_drain_gives_up_after_its_timeout_and_reports_what_is_left():
    async def main():
        proc = SlowClose()
        await _cancelled_session(proc)
        assert await shimexec.drain_closes(0.05) == 1
        assert not proc.closed
        proc.gate.set()
        assert await shimexec.drain_closes(5) == 0
        assert proc.closed
    asyncio.run(main())


def test_drain_returns_at_once_with_nothing_under_way():
    async def main():
        proc = SlowClose()
        proc.gate.set()
        await shimexec.close_shielded(proc)  # type: ignore[arg-type]
        assert proc.closed
        assert await asyncio.wait_for(shimexec.drain_closes(5), 1) == 0
    asyncio.run(main())
