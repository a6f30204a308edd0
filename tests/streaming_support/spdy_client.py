"""A minimal SPDY/3.1 client for tests, written apart from cri_server.streaming.spdy on purpose.

It shares no code with the server: its own frame reader/writer, its own copy of the SPDY/3 dictionary
(as the raw bytes of the specification's table, where the server builds it from a word list), so an
error in one is not mirrored by the other. It behaves like client-go + spdystream by default (never
sends WINDOW_UPDATE, ignores the server's), and can honour SPDY/3.1 flow control strictly.
"""
from __future__ import annotations

import asyncio
import ssl as ssl_mod
import zlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit

_DICT_HEX = (
    "000000076f7074696f6e73000000046865616400000004706f7374000000037075740000000664656c65746500000005"
    "7472616365000000066163636570740000000e6163636570742d636861727365740000000f6163636570742d656e636f"
    "64696e670000000f6163636570742d6c616e67756167650000000d6163636570742d72616e6765730000000361676500"
    "000005616c6c6f770000000d617574686f72697a6174696f6e0000000d63616368652d636f6e74726f6c0000000a636f"
    "6e6e656374696f6e0000000c636f6e74656e742d6261736500000010636f6e74656e742d656e636f64696e6700000010"
    "636f6e74656e742d6c616e67756167650000000e636f6e74656e742d6c656e67746800000010636f6e74656e742d6c6f"
    "636174696f6e0000000b636f6e74656e742d6d64350000000d636f6e74656e742d72616e67650000000c636f6e74656e"
    "742d74797065000000046461746500000004657461670000000665787065637400000007657870697265730000000466"
    "726f6d00000004686f73740000000869662d6d617463680000001169662d6d6f6469666965642d73696e63650000000d"
    "69662d6e6f6e652d6d617463680000000869662d72616e67650000001369662d756e6d6f6469666965642d73696e6365"
    "0000000d6c6173742d6d6f646966696564000000086c6f636174696f6e0000000c6d61782d666f727761726473000000"
    "06707261676d610000001270726f78792d61757468656e7469636174650000001370726f78792d617574686f72697a61"
    "74696f6e0000000572616e676500000007726566657265720000000b72657472792d6166746572000000067365727665"
    "7200000002746500000007747261696c6572000000117472616e736665722d656e636f64696e67000000077570677261"
    "64650000000a757365722d6167656e74000000047661727900000003766961000000077761726e696e67000000107777"
    "772d61757468656e746963617465000000066d6574686f64000000036765740000000673746174757300000006323030"
    "204f4b0000000776657273696f6e00000008485454502f312e310000000375726c000000067075626c69630000000a73"
    "65742d636f6f6b69650000000a6b6565702d616c697665000000066f726967696e313030313031323031323032323035"
    "323036333030333032333033333034333035333036333037343032343035343036343037343038343039343130343131"
    "343132343133343134343135343136343137353032353034353035323033204e6f6e2d417574686f7269746174697665"
    "20496e666f726d6174696f6e323034204e6f20436f6e74656e74333031204d6f766564205065726d616e656e746c7934"
    "303020426164205265717565737434303120556e617574686f72697a656434303320466f7262696464656e343034204e"
    "6f7420466f756e6435303020496e7465726e616c20536572766572204572726f72353031204e6f7420496d706c656d65"
    "6e746564353033205365727669636520556e617661696c61626c654a616e20466562204d617220417072204d6179204a"
    "756e204a756c204175672053657074204f6374204e6f76204465632030303a30303a3030204d6f6e2c205475652c2057"
    "65642c205468752c204672692c205361742c2053756e2c20474d546368756e6b65642c746578742f68746d6c2c696d61"
    "67652f706e672c696d6167652f6a70672c696d6167652f6769662c6170706c69636174696f6e2f786d6c2c6170706c69"
    "636174696f6e2f7868746d6c2b786d6c2c746578742f706c61696e2c746578742f6a6176617363726970742c7075626c"
    "6963707269766174656d61782d6167653d677a69702c6465666c6174652c73646368636861727365743d7574662d3863"
    "6861727365743d69736f2d383835392d312c7574662d2c2a2c656e713d302e"
)
SPDY3_DICT = bytes.fromhex("".join(_DICT_HEX))

CTRL_SYN_STREAM, CTRL_SYN_REPLY, CTRL_RST, CTRL_SETTINGS = 1, 2, 3, 4
CTRL_PING, CTRL_GOAWAY, CTRL_HEADERS, CTRL_WINDOW = 6, 7, 8, 9
FIN = 1


def _u32(b: bytes, off: int = 0) -> int:
    return int.from_bytes(b[off:off + 4], "big")


def _ctrl(ctype: int, flags: int, body: bytes) -> bytes:
    return bytes([0x80, 3]) + ctype.to_bytes(2, "big") + bytes([flags]) + len(body).to_bytes(3, "big") + body


def _data(sid: int, flags: int, payload: bytes) -> bytes:
    return sid.to_bytes(4, "big") + bytes([flags]) + len(payload).to_bytes(3, "big") + payload


def _nv_block(headers: dict[str, str]) -> bytes:
    out = bytearray(len(headers).to_bytes(4, "big"))
    for k, v in headers.items():
        kb, vb = k.lower().encode(), v.encode()
        out += len(kb).to_bytes(4, "big") + kb + len(vb).to_bytes(4, "big") + vb
    return bytes(out)


def _parse_nv(raw: bytes) -> dict[str, str]:
    n, pos, out = _u32(raw), 4, {}
    for _ in range(n):
        ln = _u32(raw, pos); pos += 4
        k = raw[pos:pos + ln].decode(); pos += ln
        lv = _u32(raw, pos); pos += 4
        out[k] = raw[pos:pos + lv].decode(); pos += lv
    assert pos == len(raw), "junk after name/value block"
    return out


@dataclass
class HttpReply:
    status: int
    headers: dict[str, list[str]]
    body: bytes

    def first(self, name: str) -> str | None:
        v = self.headers.get(name.lower())
        return v[0] if v else None


async def read_http_reply(reader: asyncio.StreamReader, *, read_body: bool) -> HttpReply:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ")[1])
    headers: dict[str, list[str]] = {}
    for line in head[1:]:
        if line:
            k, _, v = line.partition(":")
            headers.setdefault(k.strip().lower(), []).append(v.strip())
    body = b""
    if read_body:
        n = int(headers.get("content-length", ["0"])[0])
        body = await reader.readexactly(n)
    return HttpReply(status, headers, body)


async def http_request(url: str, method: str, headers: dict[str, str] | list[tuple[str, str]],
                       ssl: ssl_mod.SSLContext | None = None
                       ) -> tuple[HttpReply, asyncio.StreamReader, asyncio.StreamWriter]:
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port, ssl=ssl)
    items = headers.items() if isinstance(headers, dict) else headers
    lines = [f"{method} {u.path}{'?' + u.query if u.query else ''} HTTP/1.1", f"Host: {u.netloc}"]
    lines += [f"{k}: {v}" for k, v in items]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await writer.drain()
    reply = await read_http_reply(reader, read_body=False)
    if reply.status != 101:
        n = int(reply.first("content-length") or "0")
        reply.body = await reader.readexactly(n)
    return reply, reader, writer


class ClientStream:
    def __init__(self, client: SpdyClient, sid: int) -> None:
        self.client = client
        self.id = sid
        self.replied = asyncio.get_running_loop().create_future()
        self.reply_headers: dict[str, str] = {}
        self.chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.remote_fin = False
        self.rst_status: int | None = None
        self.send_window = client.initial_window
        self.window_open = asyncio.Event()
        self.window_open.set()
        self.received = 0

    async def send(self, data: bytes, fin: bool = False) -> None:
        view = memoryview(data)
        while view:
            n = min(len(view), 16384)
            if self.client.honor_window:
                while self.send_window <= 0 or self.client.session_window <= 0:
                    ev = self.window_open if self.send_window <= 0 else self.client.session_window_open
                    ev.clear()
                    await ev.wait()
                n = min(n, self.send_window, self.client.session_window)
                self.send_window -= n
                self.client.session_window -= n
            self.client.raw(_data(self.id, 0, bytes(view[:n])))
            view = view[n:]
            await self.client.writer.drain()
        if fin:
            await self.close()

    async def close(self) -> None:
        self.client.raw(_data(self.id, FIN, b""))
        await self.client.writer.drain()

    async def reset(self, status: int = 5) -> None:
        self.client.raw(_ctrl(CTRL_RST, 0, self.id.to_bytes(4, "big") + status.to_bytes(4, "big")))
        await self.client.writer.drain()

    async def read_chunk(self) -> bytes | None:
        return await self.chunks.get()

    async def read_all(self) -> bytes:
        out = bytearray()
        while (c := await self.chunks.get()) is not None:
            out += c
        return bytes(out)


class SpdyClient:
    """Opens streams (odd ids), reads frames in a background task, answers server PINGs."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 honor_window: bool = False, send_window_updates: bool = False) -> None:
        self.reader, self.writer = reader, writer
        self.deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, SPDY3_DICT)
        self.inflate = zlib.decompressobj(zdict=SPDY3_DICT)
        self.next_id = 1
        self.streams: dict[int, ClientStream] = {}
        self.honor_window = honor_window
        self.send_window_updates = send_window_updates
        self.initial_window = 65536
        self.session_window = 65536
        self.session_window_open = asyncio.Event()
        self.pongs: dict[int, asyncio.Future[None]] = {}
        self.goaway: tuple[int, int] | None = None
        self.goaway_event = asyncio.Event()
        self.rst_unknown: list[tuple[int, int]] = []  # RST_STREAM for ids never opened here
        self.window_updates: list[tuple[int, int]] = []
        self.eof = asyncio.Event()
        self.task = asyncio.create_task(self._read_loop())

    def raw(self, frame: bytes) -> None:
        self.writer.write(frame)

    async def open_stream(self, headers: dict[str, str], *, fin: bool = False, wait_reply: bool = True) -> ClientStream:
        sid = self.next_id
        self.next_id += 2
        stream = ClientStream(self, sid)
        self.streams[sid] = stream
        block = self.deflate.compress(_nv_block(headers)) + self.deflate.flush(zlib.Z_SYNC_FLUSH)
        body = sid.to_bytes(4, "big") + (0).to_bytes(4, "big") + bytes([0, 0]) + block
        self.raw(_ctrl(CTRL_SYN_STREAM, FIN if fin else 0, body))
        await self.writer.drain()
        if wait_reply:
            await stream.replied
        return stream

    async def ping(self, ping_id: int = 1) -> None:
        fut = asyncio.get_running_loop().create_future()
        self.pongs[ping_id] = fut
        self.raw(_ctrl(CTRL_PING, 0, ping_id.to_bytes(4, "big")))
        await self.writer.drain()
        await fut

    async def send_goaway(self, last: int = 0) -> None:
        self.raw(_ctrl(CTRL_GOAWAY, 0, last.to_bytes(4, "big") + (0).to_bytes(4, "big")))
        await self.writer.drain()

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def _read_loop(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(8)
                length = int.from_bytes(head[5:8], "big")
                flags = head[4]
                body = await self.reader.readexactly(length)
                if head[0] & 0x80:
                    assert head[1] == 3 and head[0] == 0x80, f"version {head[:2]!r}"
                    self._control(int.from_bytes(head[2:4], "big"), flags, body)
                else:
                    self._on_data(_u32(head) & 0x7FFFFFFF, flags, body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.eof.set()
            for s in self.streams.values():
                if not s.remote_fin:
                    s.remote_fin = True
                    s.chunks.put_nowait(None)
                if not s.replied.done():
                    s.replied.set_exception(ConnectionError("connection closed before SYN_REPLY"))

    def _on_data(self, sid: int, flags: int, payload: bytes) -> None:
        s = self.streams.get(sid)
        assert s is not None, f"data for unknown stream {sid}"
        assert not s.remote_fin, f"data after FIN on stream {sid}"
        if payload:
            s.received += len(payload)
            s.chunks.put_nowait(payload)
            if self.send_window_updates:
                self.raw(_ctrl(CTRL_WINDOW, 0, sid.to_bytes(4, "big") + len(payload).to_bytes(4, "big")))
        if flags & FIN:
            s.remote_fin = True
            s.chunks.put_nowait(None)

    def _control(self, ctype: int, flags: int, body: bytes) -> None:
        if ctype == CTRL_SYN_REPLY:
            sid = _u32(body) & 0x7FFFFFFF
            headers = _parse_nv(self.inflate.decompress(body[4:]))
            s = self.streams[sid]
            s.reply_headers = headers
            s.replied.set_result(None)
            if flags & FIN:
                s.remote_fin = True
                s.chunks.put_nowait(None)
        elif ctype == CTRL_RST:
            sid, status = _u32(body) & 0x7FFFFFFF, _u32(body, 4)
            s = self.streams.get(sid)
            if s is None:
                self.rst_unknown.append((sid, status))
                return
            s.rst_status = status
            if not s.replied.done():
                s.replied.set_exception(ConnectionResetError(f"stream {sid} reset with status {status}"))
            if not s.remote_fin:
                s.remote_fin = True
                s.chunks.put_nowait(None)
        elif ctype == CTRL_PING:
            pid = _u32(body)
            if pid % 2 == 0:  # the server's ping: echo
                self.raw(_ctrl(CTRL_PING, 0, body))
            elif pid in self.pongs:
                self.pongs.pop(pid).set_result(None)
        elif ctype == CTRL_GOAWAY:
            self.goaway = (_u32(body) & 0x7FFFFFFF, _u32(body, 4))
            self.goaway_event.set()
        elif ctype == CTRL_WINDOW:
            sid, delta = _u32(body) & 0x7FFFFFFF, _u32(body, 4) & 0x7FFFFFFF
            self.window_updates.append((sid, delta))
            if sid == 0:
                self.session_window += delta
                self.session_window_open.set()
            elif sid in self.streams:
                self.streams[sid].send_window += delta
                self.streams[sid].window_open.set()
        elif ctype in (CTRL_SETTINGS, CTRL_HEADERS):
            if ctype == CTRL_HEADERS:
                self.inflate.decompress(body[4:])
        else:
            raise AssertionError(f"unexpected control frame type {ctype}")


async def spdy_connect(url: str, protocols: list[str] | None, *, method: str = "POST",
                       ssl: ssl_mod.SSLContext | None = None, extra: list[tuple[str, str]] | None = None,
                       **client_opts: bool) -> tuple[HttpReply, SpdyClient | None]:
    headers = [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")]
    headers += [("X-Stream-Protocol-Version", p) for p in (protocols or [])]
    headers += extra or []
    reply, reader, writer = await http_request(url, method, headers, ssl=ssl)
    if reply.status != 101:
        writer.close()
        return reply, None
    return reply, SpdyClient(reader, writer, **client_opts)


# -- the remotecommand protocol on top, as client-go drives it ------------------------------------------------


@dataclass
class ExecResult:
    protocol: str | None
    stdout: bytes = b""
    stderr: bytes = b""
    error: bytes = b""
    goaway: tuple[int, int] | None = None
    extra: dict[str, object] = field(default_factory=dict)


async def spdy_exec(url: str, *, protocols: list[str] | None = None, stdin: bytes | None = None,
                    stdout: bool = True, stderr: bool = False, tty: bool = False, close_stdin: bool = True,
                    resizes: tuple[tuple[int, int], ...] = (), ssl: ssl_mod.SSLContext | None = None,
                    on_ready=None, **client_opts: bool) -> ExecResult:
    """Open the streams in client-go's order (error, stdin, stdout, stderr, resize), send stdin, read all."""
    protocols = ["v4.channel.k8s.io"] if protocols is None else protocols
    reply, client = await spdy_connect(url, protocols, ssl=ssl, **client_opts)
    if client is None:
        raise HttpFailure(reply)
    chosen = reply.first("x-stream-protocol-version")
    try:
        err = await client.open_stream({"streamType": "error"})
        sin = await client.open_stream({"streamType": "stdin"}) if stdin is not None else None
        sout = await client.open_stream({"streamType": "stdout"}) if stdout else None
        serr = await client.open_stream({"streamType": "stderr"}) if stderr and not tty else None
        rsz = None
        if tty and chosen in ("v3.channel.k8s.io", "v4.channel.k8s.io", "v5.channel.k8s.io"):
            rsz = await client.open_stream({"streamType": "resize"})
        streams = {"error": err, "stdin": sin, "stdout": sout, "stderr": serr, "resize": rsz}
        if on_ready is not None:
            await on_ready(client, streams)
        if rsz is not None:
            for w, h in resizes:
                await rsz.send(f'{{"Width":{w},"Height":{h}}}\n'.encode())
        readers = [asyncio.create_task(s.read_all()) if s else None for s in (sout, serr, err)]
        if sin is not None:
            await sin.send(stdin)
            if close_stdin:
                await sin.close()
        outs = [await r if r else b"" for r in readers]
        return ExecResult(chosen, outs[0], outs[1], outs[2], client.goaway)
    finally:
        await client.close()


class HttpFailure(Exception):
    def __init__(self, reply: HttpReply) -> None:
        super().__init__(f"HTTP {reply.status}: {reply.body!r}")
        self.reply = reply
