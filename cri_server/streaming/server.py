"""The streaming server husk-cri runs next to its gRPC server: URLs with single-use tokens, and one HTTP
port that upgrades to SPDY/3.1 or WebSocket for exec, attach and port-forward.

Owns routing, token consumption, subprotocol negotiation and the connection tasks. Must not contain
protocol framing (spdy/, websocket.py) or session logic (remotecommand.py, portforward.py).
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import ssl
from dataclasses import dataclass
from typing import Any

from . import portforward, remotecommand
from .backend import StreamBackend, TargetNotFound, TargetNotRunning
from .httpio import HttpError, HttpRequest, error_response, not_found, read_request
from .requests import AttachRequest, ExecRequest, PortForwardRequest
from .tokens import DEFAULT_MAX_IN_FLIGHT, DEFAULT_TTL, RequestCache
from .transport import IdleWatchdog, TcpByteStream
from .websocket import WebSocketByteStream, WebSocketConnection, handshake_response, is_websocket_request, \
    negotiate_subprotocol, offered_subprotocols

log = logging.getLogger("husk.cri.streaming")

_ROUTE = re.compile(r"/(exec|attach|portforward)/([A-Za-z0-9_-]+)")
_KINDS = {"exec": ExecRequest, "attach": AttachRequest, "portforward": PortForwardRequest}

CachedRequest = ExecRequest | AttachRequest | PortForwardRequest


@dataclass(frozen=True)
class StreamingOptions:
    """Tunables; the defaults are kubelet's CRI streaming server's."""

    token_ttl: float = DEFAULT_TTL
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    stream_creation_timeout: float = 30.0
    stream_idle_timeout: float | None = 4 * 3600.0
    request_head_timeout: float = 30.0
    shutdown_grace: float = 5.0
    # The base of the URLs handed out, e.g. "https://10.0.0.5:10010" when clients must use another
    # address than the bound one. Default: scheme plus the address actually bound.
    base_url: str | None = None


def parse_address(address: str | tuple[str, int]) -> tuple[str, int]:
    """"host:port", "[v6]:port" or (host, port)."""
    if isinstance(address, tuple):
        host, port = address
    else:
        m = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\[\]]*):(\d+)", address.strip())
        if not m:
            raise ValueError(f"streaming address {address!r}: expected host:port")
        host = m.group(1) if m.group(1) is not None else m.group(3)
        port = int(m.group(2) or m.group(4))
    if not 0 <= int(port) < 65536:
        raise ValueError(f"streaming address {address!r}: port out of range")
    return host or "0.0.0.0", int(port)


def _host_for_url(host: str) -> str:
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]"
    except ValueError:
        pass
    return host


class StreamingServer:
    """Serves /exec/{token}, /attach/{token}, /portforward/{token} on one TCP port (plain or TLS).

    get_*_url() cache the request under a fresh token and return the URL the CRI response carries;
    the options of a session come from the cached request only, never from the query string."""

    def __init__(self, address: str | tuple[str, int], backend: StreamBackend, tls: ssl.SSLContext | None = None,
                 options: StreamingOptions | None = None) -> None:
        self._host, self._port = parse_address(address)
        self._backend = backend
        self._tls = tls
        self._cfg = options or StreamingOptions()
        self._session_cfg = remotecommand.SessionConfig(
            stream_creation_timeout=self._cfg.stream_creation_timeout,
            idle_timeout=self._cfg.stream_idle_timeout,
            shutdown_grace=self._cfg.shutdown_grace)
        self._cache: RequestCache[CachedRequest] = RequestCache(self._cfg.token_ttl, self._cfg.max_in_flight)
        self._server: asyncio.Server | None = None
        self._base_url: str | None = None
        self._connections: set[asyncio.Task] = set()
        self._seq = 0

    # -- life cycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("streaming server already started")
        self._server = await asyncio.start_server(self._on_connection, self._host, self._port, ssl=self._tls)
        sockname = self._server.sockets[0].getsockname()
        self._port = sockname[1]
        scheme = "https" if self._tls is not None else "http"
        self._base_url = (self._cfg.base_url or f"{scheme}://{_host_for_url(sockname[0])}:{sockname[1]}").rstrip("/")
        log.info("streaming server listening on %s", self._base_url)

    async def stop(self) -> None:
        """Stop listening, end every session (backend calls are cancelled), wait until all are gone."""
        if self._server is None:
            return
        self._server.close()
        tasks = list(self._connections)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None
        log.info("streaming server stopped")

    @property
    def base_url(self) -> str:
        if self._base_url is None:
            raise RuntimeError("streaming server not started")
        return self._base_url

    @property
    def port(self) -> int:
        return self._port

    @property
    def active_connections(self) -> int:
        return len(self._connections)

    @property
    def pending_tokens(self) -> int:
        return len(self._cache)

    # -- URLs ------------------------------------------------------------------------------------------

    def get_exec_url(self, request: Any) -> str:
        """request: an ExecRequest, the CRI ExecRequest message, or anything with its field names.
        Raises InvalidStreamRequest (bad fields) or TooManyRequests (cache full)."""
        return self._url("exec", ExecRequest.of(request))

    def get_attach_url(self, request: Any) -> str:
        return self._url("attach", AttachRequest.of(request))

    def get_port_forward_url(self, request: Any) -> str:
        return self._url("portforward", PortForwardRequest.of(request))

    def _url(self, kind: str, request: CachedRequest) -> str:
        base = self.base_url
        return f"{base}/{kind}/{self._cache.insert(request)}"

    # -- connections -----------------------------------------------------------------------------------

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._seq += 1
        name = f"stream-conn-{self._seq}"
        try:
            await self._serve(reader, writer, name)
        except asyncio.CancelledError:
            # stop() cancels connection tasks. This is the outermost frame of a task that asyncio's
            # start_server owns, whose done-callback calls task.exception(), which raises (and logs
            # a traceback) for a cancelled task in 3.11: so the cancellation ends here.
            log.debug("%s: cancelled", name)
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            log.debug("%s: connection lost: %s", name, exc)
        except Exception:  # one broken connection must not take the server down
            log.exception("%s: unexpected error", name)
        finally:
            writer.close()
            self._connections.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str) -> None:
        try:
            try:
                req = await asyncio.wait_for(read_request(reader), self._cfg.request_head_timeout)
            except asyncio.TimeoutError:
                raise HttpError(408, "timed out reading the request") from None
            if req is None:
                return
            kind, cached = await self._route(req)
        except HttpError as err:
            log.info("%s: HTTP %d: %s", name, err.status, err.message)
            writer.write(error_response(err))
            await writer.drain()
            return
        target = cached.pod_sandbox_id if isinstance(cached, PortForwardRequest) else cached.container_id
        name = f"{name} {kind} {target}"
        log.info("%s: %s upgrade", name, "websocket" if is_websocket_request(req) else "spdy")
        if is_websocket_request(req):
            await self._serve_websocket(req, reader, writer, kind, cached, name)
        else:
            await self._serve_spdy(req, reader, writer, kind, cached, name)

    async def _route(self, req: HttpRequest) -> tuple[str, CachedRequest]:
        m = _ROUTE.fullmatch(req.path)
        if m is None:
            raise not_found()
        if req.method not in ("GET", "POST"):
            raise HttpError(405, "405: Method Not Allowed")
        kind, token = m.group(1), m.group(2)
        cached = self._cache.consume(token)
        # Unknown, expired, reused, or a token of another kind: all look the same to the client.
        if cached is None or not isinstance(cached, _KINDS[kind]):
            raise not_found()
        try:
            await self._backend.check(cached)
        except TargetNotFound as exc:
            raise HttpError(404, str(exc)) from exc
        except TargetNotRunning as exc:
            raise HttpError(409, str(exc)) from exc
        except Exception as exc:  # the backend's failure, reported to the client rather than dropped
            log.warning("streaming %s request: backend check failed: %s", kind, exc)
            raise HttpError(500, f"internal error: {exc}") from exc
        return kind, cached

    async def _serve_spdy(self, req: HttpRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          kind: str, cached: CachedRequest, name: str) -> None:
        supported = (portforward.SPDY_PROTOCOL,) if kind == "portforward" else tuple(remotecommand.SPDY_PROTOCOLS)
        offered = req.header_tokens("x-stream-protocol-version")
        chosen = next((p for p in offered if p in supported), None)
        if offered and chosen is None:
            accepted = tuple(("X-Accepted-Stream-Protocol-Versions", p) for p in supported)
            err = HttpError(403, "unable to upgrade: unable to negotiate protocol: client supports "
                                 f"[{' '.join(offered)}], server accepts [{' '.join(supported)}]", accepted)
            await self._reject(writer, err, name)
            return
        connection = [t.lower() for t in req.header_tokens("connection")]
        if "upgrade" not in connection or "spdy/3.1" not in (req.header("upgrade") or "").lower():
            await self._reject(writer, HttpError(400, "unable to upgrade: missing upgrade headers in request"), name)
            return
        headers = ["HTTP/1.1 101 Switching Protocols", "Connection: Upgrade", "Upgrade: SPDY/3.1"]
        if chosen is not None:
            headers.append(f"X-Stream-Protocol-Version: {chosen}")
        writer.write(("\r\n".join(headers) + "\r\n\r\n").encode("ascii"))
        await writer.drain()
        conn = TcpByteStream(reader, writer)
        if isinstance(cached, PortForwardRequest):
            await portforward.serve_spdy(conn, cached, self._backend, self._session_cfg, name)
        else:
            proto = remotecommand.SPDY_PROTOCOLS[chosen or remotecommand.SPDY_FALLBACK]
            await remotecommand.serve_spdy(conn, proto, cached, self._backend, self._session_cfg, name)

    async def _serve_websocket(self, req: HttpRequest, reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter, kind: str, cached: CachedRequest, name: str) -> None:
        if kind == "portforward":
            supported = (*portforward.WS_PROTOCOLS, portforward.SPDY_TUNNEL_PROTOCOL)
        else:
            supported = tuple(remotecommand.WS_PROTOCOLS)
        offered = offered_subprotocols(req)
        chosen = negotiate_subprotocol(offered, supported)
        if chosen is None:
            err = HttpError(403, f"requested protocol(s) are not supported: [{' '.join(offered)}]; "
                                 f"supports [{' '.join(p for p in supported if p)}]")
            await self._reject(writer, err, name)
            return
        try:
            reply = handshake_response(req, chosen)
        except HttpError as err:
            await self._reject(writer, err, name)
            return
        writer.write(reply)
        await writer.drain()
        ws = WebSocketConnection(reader, writer, name=name)
        watchdog = IdleWatchdog(self._cfg.stream_idle_timeout, ws.abort)
        ws.on_activity = watchdog.touch
        watchdog.start()
        try:
            if isinstance(cached, PortForwardRequest):
                if chosen == portforward.SPDY_TUNNEL_PROTOCOL:
                    await portforward.serve_spdy(WebSocketByteStream(ws), cached, self._backend,
                                                 self._session_cfg, name)
                else:
                    await portforward.serve_websocket(ws, portforward.WS_PROTOCOLS[chosen], cached, self._backend,
                                                      self._session_cfg, name)
            else:
                await remotecommand.serve_websocket(ws, remotecommand.WS_PROTOCOLS[chosen], cached, self._backend,
                                                    self._session_cfg, name)
        finally:
            await watchdog.stop()
            ws.abort()

    @staticmethod
    async def _reject(writer: asyncio.StreamWriter, err: HttpError, name: str) -> None:
        log.info("%s: HTTP %d: %s", name, err.status, err.message)
        writer.write(error_response(err))
        await writer.drain()

