"""Starts a gRPC server with the standard health service (grpc.health.v1) and server reflection."""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass
from typing import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass
class RunningServer:
    """A started server: the grpc.Server, the port it bound, and its health servicer.

    ``health.set("", SERVING)`` is done by ``start``; call ``set_serving(False)`` when draining.
    """

    server: grpc.Server
    port: int
    health: health.HealthServicer

    def set_serving(self, serving: bool, service_names: Iterable[str] = ("",)) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in service_names:
            self.health.set(name, status)


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
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    add_servicers(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = list(service_full_names)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise RuntimeError(f"cannot bind gRPC address {address}: {exc} (is another process holding it?)") from exc
    if port == 0:
        raise RuntimeError(f"cannot bind gRPC address {address} (is another process holding it?)")
    server.start()
    running = RunningServer(server=server, port=port, health=health_servicer)
    running.set_serving(True, ["", *names])
    return running


def channel(target: str) -> grpc.Channel:
    """An insecure client channel with the project's message size limits."""
    return grpc.insecure_channel(
        target,
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ],
    )
