"""The copy helpers backends use between process pipes and the client's streams."""
from __future__ import annotations

import asyncio

from cri_server.streaming import copy_input, copy_output
from cri_server.streaming.transport import InboundBuffer


class Sink:
    def __init__(self) -> None:
        self.data = bytearray()

    async def write(self, data: bytes) -> None:
        self.data += data

    async def close(self) -> None:
        pass


def test_copy_output_drains_even_without_a_sink():
    async def main():
        r = asyncio.StreamReader()
        r.feed_data(b"x" * 200_000)
        r.feed_eof()
        await copy_output(r, None)
        assert r.at_eof()
        r2 = asyncio.StreamReader()
        r2.feed_data(b"abc")
        r2.feed_eof()
        sink = Sink()
        await copy_output(r2, sink)
        assert sink.data == b"abc"
    asyncio.run(main())


def test_copy_input_closes_or_keeps_the_process_stdin():
    async def main():
        for close in (True, False):
            proc = await asyncio.create_subprocess_exec("cat", stdin=asyncio.subprocess.PIPE,
                                                        stdout=asyncio.subprocess.PIPE)
            src = InboundBuffer()
            src.feed(b"hello\n")
            src.feed_eof()
            await copy_input(src, proc.stdin, close=close)
            assert await proc.stdout.readline() == b"hello\n"
            if close:
                assert await proc.wait() == 0  # cat saw EOF
            else:
                assert proc.returncode is None and not proc.stdin.is_closing()
                proc.stdin.close()
                await proc.wait()
    asyncio.run(asyncio.wait_for(main(), 30))
