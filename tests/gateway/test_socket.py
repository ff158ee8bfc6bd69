"""The gateway's listening socket: connections it accepts have Nagle's algorithm off (TCP_NODELAY).

With Nagle on, a streamed event written while the previous write is still unacknowledged waits for the
client's delayed ACK (40 ms on Linux), which every keep-alive client paid in TTFT and ITL. uvicorn serves
``gateway.__main__.bind``'s socket through asyncio, which sets TCP_NODELAY on an accepted socket only
when its proto is IPPROTO_TCP; this checks the socket option on the server side of a real connection."""

from __future__ import annotations

import asyncio
import socket

from gateway.__main__ import bind


async def _accepted_nodelay() -> int:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen: asyncio.Future = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            accepted = transport.get_extra_info("socket")
            seen.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Probe, sock=sock)  # as uvicorn serves it
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        value = await asyncio.wait_for(seen, 10)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    return value


def test_accepted_connections_have_nagle_off():
    assert asyncio.run(_accepted_nodelay()) != 0


def test_bind_is_a_tcp_socket_on_the_port_asked():
    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert sock.getsockname()[1] > 0
    finally:
        sock.close()
