"""A grpc.aio server on an event loop of its own thread, for a process whose other threads are plain threads.

Why (the scheduler's Generate streams): with grpc's threaded server every open stream holds a handler thread
blocked on its request's queue. At the end of a wave of 64 requests the scheduler's loop puts 64 last messages and
stays busy building the next Forward; each of the 64 woken threads must take the GIL from it (up to the switch
interval each time) and then wait on the completion of its own send, which another thread signals. The last of the
64 reached its client 22-34 ms after the put on the CPU, against 3-11 ms when one asyncio loop takes them in one
wake-up and does every send itself (`python -m bench.stream_wave_bench`; bench/README.md "Streams on one event
loop"). Here every ``async def`` handler runs on that one loop; a plain (synchronous) handler of the same server
runs on ``migration_thread_pool``, as on a threaded server (grpc.aio's own migration path).

Health (grpc.health.v1) and reflection are registered as in ``grpc_server.start``, both their asyncio servicers, on
the loop: a synchronous Watch ran on ``migration_thread_pool`` and held a thread for as long as its stream stayed
open, and for good once its client left (grpc.aio never calls a synchronous handler's ``add_callback``, where the
servicer ends the stream): 32 Watch streams, even closed ones, left no thread for any other synchronous handler.
``set_serving`` sets the status on the loop from any other thread.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2

from common.grpc_server import SERVER_OPTIONS, add_health_reflection_and_port

_SERVERS = itertools.count()
SET_SERVING_TIMEOUT_S = 5.0


@dataclass
class AioRunningServer:
    """A started grpc.aio server: its loop (running in ``thread``), the port it bound, its health servicer, and the
    thread pool of its synchronous handlers (``executor``, threads named ``thread_prefix`` + "_")."""

    server: grpc.aio.Server
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    port: int
    health: health.aio.HealthServicer
    executor: futures.ThreadPoolExecutor
    thread_prefix: str

    def set_serving(self, serving: bool, service_names: Iterable[str] = ("",)) -> None:
        """Sets the services' health status (and tells their watchers); returns once it is set. Call it from a
        thread other than the loop's, while the loop runs. Raises TimeoutError when the loop did not set it within
        SET_SERVING_TIMEOUT_S (a loop that stopped or hangs)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING

        async def set_all() -> None:
            for name in service_names:
                await self.health.set(name, status)
        asyncio.run_coroutine_threadsafe(set_all(), self.loop).result(SET_SERVING_TIMEOUT_S)

    def stop(self, grace: float | None, timeout: float | None = None) -> bool:
        """Stops the server (calls still open after ``grace`` seconds are cancelled; None: at once), then its loop;
        waits up to ``timeout`` seconds for each (None: for ever). True when the loop's thread ended in time."""
        if self.loop.is_running():
            done = asyncio.run_coroutine_threadsafe(self.server.stop(grace), self.loop)
            try:
                done.result(timeout)
            except futures.TimeoutError:
                return False
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
        return not self.thread.is_alive()


def start_aio(
    add_servicers: Callable[[grpc.aio.Server], None],
    service_full_names: Iterable[str],
    address: str = "127.0.0.1:0",
    max_workers: int = 32,
) -> AioRunningServer:
    """Builds, binds and starts a grpc.aio server on a new event loop in a daemon thread; returns once it serves.

    ``add_servicers(server)`` registers the servicers (a method may be ``async def`` / an async generator: it runs on
    the loop; a plain one runs on a pool of ``max_workers`` threads). ``address`` "host:0" binds a free port,
    reported in the result. Raises RuntimeError when the address cannot be bound (naming it)."""
    prefix = f"grpc-aio-{next(_SERVERS)}"
    executor = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=prefix)
    loop = asyncio.new_event_loop()
    started: futures.Future = futures.Future()
    names = list(service_full_names)
    health_servicer = health.aio.HealthServicer()  # Check and Watch on the loop (module docstring)

    async def serve() -> None:
        server = grpc.aio.server(migration_thread_pool=executor, options=SERVER_OPTIONS)
        add_servicers(server)
        port = add_health_reflection_and_port(server, health_servicer, names, address)
        await server.start()
        started.set_result((server, port))

    def run() -> None:  # serves until ``AioRunningServer.stop`` stops the loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(serve())
            loop.run_forever()
        except BaseException as exc:  # a failure before the server started: the caller raises it
            if not started.done():
                started.set_exception(exc)
                return
            raise
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    thread = threading.Thread(target=run, name=f"{prefix}-loop", daemon=True)
    thread.start()
    server, port = started.result()
    running = AioRunningServer(server=server, loop=loop, thread=thread, port=port, health=health_servicer,
                               executor=executor, thread_prefix=prefix)
    running.set_serving(True, ["", *names])
    return running
