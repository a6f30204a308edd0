"""SPDY session rules seen from a client: frames the server must tolerate or refuse, GOAWAY, flow
control, idle timeout, protocol errors."""
from __future__ import annotations

import asyncio
import json

from cri_server.streaming import ExecRequest, PortForwardRequest
from cri_server.streaming.netns import open_connection_in_netns
from tests.streaming_support import spdy_client as sc
from tests.streaming_support.harness import run, serving
from tests.streaming_support.spdy_client import spdy_connect, spdy_exec

PF = PortForwardRequest("s1")


def test_settings_window_update_headers_and_unknown_frames_are_tolerated():
    async def main():
        async with serving() as (srv, be):
            _, client = await spdy_connect(srv.get_port_forward_url(PF), ["portforward.k8s.io"])
            client.raw(sc._ctrl(sc.CTRL_SETTINGS, 0, (1).to_bytes(4, "big") + bytes([0, 0, 0, 7]) + (1 << 20).to_bytes(4, "big")))
            client.raw(sc._ctrl(sc.CTRL_WINDOW, 0, (0).to_bytes(4, "big") + (1000).to_bytes(4, "big")))
            client.raw(sc._ctrl(0x0B, 0, b"whatever"))
            await client.ping(1)
            await client.close()
    run(main)


def test_data_after_fin_resets_the_stream():
    async def main():
        async with serving() as (srv, be):
            _, client = await spdy_connect(srv.get_port_forward_url(PF), ["portforward.k8s.io"])
            err = await client.open_stream({"streamType": "error", "port": "1", "requestID": "0"})
            await err.close()
            await err.send(b"late")
            assert await err.read_all() == b""
            assert err.rst_status == 9  # STREAM_ALREADY_CLOSED
            await client.close()
    run(main)


def test_undecodable_header_block_ends_the_session_with_goaway():
    async def main():
        async with serving() as (srv, be):
            _, client = await spdy_connect(srv.get_port_forward_url(PF), ["portforward.k8s.io"])
            body = (1).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"\0\0" + b"this is not zlib"
            client.raw(sc._ctrl(sc.CTRL_SYN_STREAM, 0, body))
            await client.eof.wait()
            assert client.goaway == (0, 1)  # last good stream 0, PROTOCOL_ERROR
            await client.close()
    run(main)


def test_goaway_from_client_during_exec_lets_it_finish():
    async def main():
        async with serving() as (srv, be):
            async def goaway(client, streams):
                await client.send_goaway(last=0)
            res = await spdy_exec(srv.get_exec_url(ExecRequest("c1", ("sh", "-c", "cat; echo end"), stdin=True,
                                                               stdout=True)), stdin=b"in\n", on_ready=goaway)
            assert res.stdout == b"in\nend\n" and json.loads(res.error)["status"] == "Success"
    run(main)


def test_server_ends_exec_with_fin_on_every_stream_then_goaway():
    async def main():
        async with serving() as (srv, be):
            reply, client = await spdy_connect(srv.get_exec_url(ExecRequest("c1", ("true",), stdout=True, stdin=True)),
                                               ["v4.channel.k8s.io"])
            streams = [await client.open_stream({"streamType": t}) for t in ("error", "stdin", "stdout")]
            await client.goaway_event.wait()
            assert client.goaway == (streams[-1].id, 0)
            assert all(s.remote_fin and s.rst_status is None for s in streams)
            await client.close()
    run(main)


def test_window_updates_are_sent_for_consumed_stdin():
    async def main():
        async with serving() as (srv, be):
            res_holder = {}

            async def count(client, streams):
                res_holder["client"] = client
            data = b"a" * 300_000
            res = await spdy_exec(srv.get_exec_url(ExecRequest("c1", ("wc", "-c"), stdin=True, stdout=True)),
                                  stdin=data, on_ready=count)
            assert res.stdout.strip() == b"300000"
            updates = res_holder["client"].window_updates
            stdin_id = 3
            assert sum(d for s, d in updates if s == stdin_id) >= 300_000 - 32 * 1024
            assert sum(d for s, d in updates if s == 0) == sum(d for s, d in updates if s == stdin_id)
    run(main)


def test_idle_connections_are_closed():
    async def main():
        async with serving(stream_idle_timeout=0.2) as (srv, be):
            _, client = await spdy_connect(srv.get_port_forward_url(PF), ["portforward.k8s.io"])
            await client.ping(1)
            await client.eof.wait()  # nothing happened for a while: the server hung up
            await client.close()
    run(main)


def test_netns_dial_errors_reach_the_caller():
    # Without root: the namespace file does not exist, so the failure comes before any setns.
    async def main():
        try:
            await open_connection_in_netns("/nonexistent/netns/file", 80)
        except FileNotFoundError:
            return
        raise AssertionError("expected FileNotFoundError")
    run(main, timeout=10)


def test_netns_none_means_host_network():
    async def main():
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        r, w = await open_connection_in_netns(None, port)
        assert await r.read() == b""
        w.close()
        server.close()
        await server.wait_closed()
    run(main, timeout=10)
