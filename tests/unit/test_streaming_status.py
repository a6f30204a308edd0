"""The error-stream payloads (exactly what kubelet writes) and the resize event decoder."""
from __future__ import annotations

import asyncio
import json

from cri_server.streaming import ResizeQueue, TerminalSize
from cri_server.streaming import status as st
from cri_server.streaming.remotecommand import ResizeDecoder


def test_success_json():
    assert st.SUCCESS.to_json() == b'{"metadata":{},"status":"Success"}'
    assert st.SUCCESS.to_text() == b""


def test_non_zero_exit_json_as_kubelet_writes_it():
    s = st.exit_status(["sh", "-c", "exit 7"], 7)
    assert s.to_json() == (
        b'{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: '
        b'error executing command [sh -c exit 7], exit code 7","reason":"NonZeroExitCode",'
        b'"details":{"causes":[{"reason":"ExitCode","message":"7"}]}}')
    assert s.to_text() == b"command terminated with non-zero exit code: error executing command [sh -c exit 7], exit code 7"


def test_internal_error_json_and_go_escaping():
    s = st.internal_error("boom <&>")
    doc = json.loads(s.to_json())
    assert doc == {"metadata": {}, "status": "Failure", "message": "Internal error occurred: boom <&>",
                   "reason": "InternalError", "details": {"causes": [{"message": "boom <&>"}]}, "code": 500}
    assert b"\\u003c\\u0026\\u003e" in s.to_json() and b"<" not in s.to_json()


def _decode(*chunks: bytes) -> tuple[list[TerminalSize], bool]:
    async def main():
        q = ResizeQueue(maxlen=100)
        d = ResizeDecoder(q)
        for c in chunks:
            d.feed(c)
        d.close()
        return [s async for s in q], d._broken
    return asyncio.run(main())


def test_resize_decoder_streams_objects_across_chunks():
    sizes, broken = _decode(b'{"Width":80,"Height":24}\n{"Wid', b'th":100,', b'"Height":30}  {"height":5}')
    assert sizes == [TerminalSize(80, 24), TerminalSize(100, 30), TerminalSize(0, 5)] and not broken


def test_resize_decoder_stops_at_garbage_like_go_json_decoder():
    sizes, broken = _decode(b'{"Width":80,"Height":24}garbage{"Width":1,"Height":1}')
    assert sizes == [TerminalSize(80, 24)] and broken
    sizes, broken = _decode(b'{"Width":70000,"Height":1}')
    assert sizes == [] and broken
    sizes, broken = _decode(b'{"Width":"80","Height":1}')
    assert sizes == [] and broken


def test_resize_queue_keeps_latest_when_backend_is_slow():
    async def main():
        q = ResizeQueue(maxlen=2)
        for i in range(5):
            q.put(TerminalSize(i, i))
        q.close()
        return [s.width async for s in q]
    assert asyncio.run(main()) == [3, 4]
