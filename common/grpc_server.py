"""Starts a gRPC server with the standard health service (grpc.health.v1) and server reflection."""

from __future__ import annotations

import itertools
import sys
import threading
import time
import traceback
from concurrent import futures
from dataclasses import dataclass
from typing import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_SERVERS = itertools.count()  # numbers each server's handler threads (their name prefix)


@dataclass
class RunningServer:
    """A started server: the grpc.Server, the port it bound, and its health servicer.

    ``health.set("", SERVING)`` is done by ``start``; call ``set_serving(False)`` when draining.
    """

    server: grpc.Server
    port: int
    health: health.HealthServicer
    executor: futures.ThreadPoolExecutor | None = None  # runs the handlers
    thread_prefix: str = ""  # its threads' names start with this + "_"

    def set_serving(self, serving: bool, service_names: Iterable[str] = ("",)) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in service_names:
            self.health.set(name, status)


SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]


def add_health_reflection_and_port(server, health_servicer, names: list[str], address: str) -> int:
    """Registers ``health_servicer`` (grpc.health.v1) and server reflection for ``names`` (plus health and
    reflection) on ``server`` (a grpc.Server or a grpc.aio.Server) and binds ``address``; returns the port. Raises
    RuntimeError when the address cannot be bound (naming it)."""
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise RuntimeError(f"cannot bind gRPC address {address}: {exc} (is another process holding it?)") from exc
    if port == 0:
        raise RuntimeError(f"cannot bind gRPC address {address} (is another process holding it?)")
    return port


def start(
    add_servicers: Callable[[grpc.Server], None],
    service_full_names: Iterable[str],
    address: str = "127.0.0.1:0",
    max_workers: int = 32,
) -> RunningServer:
    """Builds, binds and starts a server.

    ``add_servicers(server)`` registers the service's servicers; ``service_full_names`` are their
    full names (e.g. ``codeserve.v1.Cache``) for health and reflection. ``address`` "host:0" binds a
    free port, reported in the result. Raises RuntimeError when the address cannot be bound (naming it).
    """
    prefix = f"grpc-server-{next(_SERVERS)}"
    executor = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=prefix)
    server = grpc.server(executor, options=SERVER_OPTIONS)
    add_servicers(server)
    health_servicer = health.HealthServicer()
    names = list(service_full_names)
    port = add_health_reflection_and_port(server, health_servicer, names, address)
    server.start()
    running = RunningServer(server=server, port=port, health=health_servicer, executor=executor, thread_prefix=prefix)
    running.set_serving(True, ["", *names])
    return running


def lingering_threads(running: RunningServer, seconds: float) -> dict[str, str]:
    """After ``running.server.stop``: lets the server's handler threads go (idle ones exit at once) and waits up
    to ``seconds`` for them. Returns name -> stack of those still alive (a handler that never returned): they
    are not daemons, so they would keep the process from exiting after its drain."""
    executor = running.executor
    if executor is None:
        return {}
    executor.shutdown(wait=False, cancel_futures=True)
    prefix = running.thread_prefix + "_"
    mine = [t for t in threading.enumerate() if t.name.startswith(prefix)]
    deadline = time.monotonic() + seconds
    for t in mine:
        t.join(max(0.0, deadline - time.monotonic()))
    frames = sys._current_frames()
    return {t.name: "".join(traceback.format_stack(frames[t.ident]))
            for t in mine if t.is_alive() and t.ident in frames}


def channel(target: str) -> grpc.Channel:
    """An insecure client channel with the project's message size limits."""
    return grpc.insecure_channel(
        target,
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ],
    )
