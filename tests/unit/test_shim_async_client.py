"""shim.client.AsyncTtrpcClient when the connection ends: pending and later calls fail with
ConnectionError instead of waiting forever (a Wait has no timeout)."""
from __future__ import annotations

import asyncio

import pytest

from shim.client import AsyncTtrpcClient
from tests.support.waiting import wait_for_async


def test_calls_fail_once_the_server_closed_its_side(tmp_path):
    """The shim's side of the connection ended (here: it shut down writing but still reads): no answer
    can come, so a call must fail at once rather than wait forever."""
    path = str(tmp_path / "halfclosed.sock")

    async def main():
        done = asyncio.Event()

        async def half_close(reader, writer):
            writer.write_eof()
            await reader.read()  # keeps reading what the client sends, never answers
            done.set()
            writer.close()
        server = await asyncio.start_unix_server(half_close, path)
        try:
            client = await AsyncTtrpcClient.connect(path)
            await wait_for_async(client._task.done, 10, "the client's read loop to see the EOF", interval=0.01)
            for _ in range(2):
                with pytest.raises(ConnectionError):
                    # The bound only turns the old behaviour (waiting forever) into a failure.
                    await asyncio.wait_for(client.task("Wait", timeout=None, id="x"), 10)
            await client.close()
            await done.wait()
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_close_fails_pending_calls(tmp_path):
    path = str(tmp_path / "silent.sock")

    async def main():
        async def silent(reader, writer):
            await reader.read()  # never answers
            writer.close()
        server = await asyncio.start_unix_server(silent, path)
        try:
            client = await AsyncTtrpcClient.connect(path)
            pending = asyncio.ensure_future(client.task("Wait", timeout=None, id="x"))
            while not client._futures:
                await asyncio.sleep(0)
            await client.close()
            with pytest.raises(ConnectionError):
                await pending
            with pytest.raises(ConnectionError):
                await client.task("Connect", id="x")
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(asyncio.wait_for(main(), 60))
