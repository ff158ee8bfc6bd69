"""Async client of the scheduler's gRPC API (grpc.aio), with gRPC errors mapped to ApiError.

The channel is created lazily on first use so that it binds to the event loop that serves HTTP.
"""

from __future__ import annotations

import weakref

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from codeserve.v1 import scheduler_pb2, scheduler_pb2_grpc
from common.grpc_server import MAX_MESSAGE_BYTES
from gateway.errors import ApiError, from_grpc


class SchedulerClient:
    """Talks to one scheduler at ``target`` ("host:port").

    Unary methods raise ApiError (mapped from the gRPC status, see gateway.errors) on failure.
    ``start_generate`` returns the raw grpc.aio call; gateway.generation wraps it. ``down`` is the reason the
    scheduler is considered unreachable (set by gateway.readiness.SchedulerWatch; None = reachable);
    ``streams`` are the generations in flight (gateway.generation.GenerationStream registers itself).
    """

    def __init__(self, target: str, retry_after_s: int = 1, unary_timeout_s: float = 5.0) -> None:
        self.target = target
        self._retry_after_s = retry_after_s
        self._unary_timeout_s = unary_timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: scheduler_pb2_grpc.SchedulerStub | None = None
        self.down: str | None = None
        self.streams: weakref.WeakSet = weakref.WeakSet()

    def _scheduler(self) -> scheduler_pb2_grpc.SchedulerStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                self.target,
                options=[
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    # Reconnect within a second of the scheduler coming (back) up, instead of gRPC's
                    # default exponential backoff of up to 120 s during which every request fails.
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ],
            )
            self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        return self._stub

    def error(self, exc: grpc.aio.AioRpcError) -> ApiError:
        """The ApiError for a failed call (Retry-After uses this client's setting; transport failures name
        this client's target)."""
        return from_grpc(exc.code(), exc.details(), self._retry_after_s, self.target)

    def start_generate(
        self, request: scheduler_pb2.GenerateRequest, timeout_s: float | None = None
    ) -> grpc.aio.UnaryStreamCall:
        """Starts a server-streaming Generate call (never waiting for a connection: wait_for_ready=False).
        Cancelling the returned call aborts the request at the scheduler. Raises ApiError 503 at once while
        the scheduler is known to be unreachable (``down``)."""
        self._refuse_if_down()
        return self._scheduler().Generate(request, timeout=timeout_s, wait_for_ready=False)

    def _refuse_if_down(self) -> None:
        """Raises ApiError 503 naming why while the scheduler is known to be unreachable (``down``)."""
        if self.down is not None:
            raise ApiError(503, self.down, "service_unavailable", retry_after_s=self._retry_after_s)

    async def _unary(self, method: str, request):
        """One unary call with the unary deadline. Raises ApiError, 503 at once while the scheduler is known to be
        unreachable (``down``: was a wait for the whole deadline, so /metrics and /server_info took 5 s a scrape
        while a scheduler was frozen, a fresh helper's finding; the health probe, which lifts ``down``, is not one)."""
        self._refuse_if_down()
        try:
            return await getattr(self._scheduler(), method)(request, timeout=self._unary_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self.error(exc) from exc

    async def get_load(self, request_metrics: bool = False, router_id: str = "") -> scheduler_pb2.GetLoadResponse:
        """Queue lengths, pool counters and totals (and the request metrics' text when ``request_metrics``; the
        load of the calls router ``router_id`` did not send, ``others``, when given). Raises ApiError."""
        return await self._unary("GetLoad", scheduler_pb2.GetLoadRequest(request_metrics=request_metrics,
                                                                         router_id=router_id))

    async def server_info(self) -> scheduler_pb2.ServerInfoResponse:
        """Model facts and limits. Raises ApiError."""
        return await self._unary("ServerInfo", scheduler_pb2.ServerInfoRequest())

    async def flush_cache(self) -> scheduler_pb2.FlushCacheResponse:
        """Evicts every unlocked cached prefix. Raises ApiError."""
        return await self._unary("FlushCache", scheduler_pb2.FlushCacheRequest())

    async def abort(self, request_id: str, sibling_failed: bool = False) -> scheduler_pb2.AbortResponse:
        """Aborts one request by id (``sibling_failed``: because another call of its HTTP request failed).
        Raises ApiError."""
        return await self._unary("Abort", scheduler_pb2.AbortRequest(request_id=request_id,
                                                                     sibling_failed=sibling_failed))

    async def probe(self, timeout_s: float) -> int:
        """grpc.health.v1 Check("") with a deadline of ``timeout_s``; returns the ServingStatus value.
        Raises grpc.aio.AioRpcError (UNAVAILABLE / DEADLINE_EXCEEDED when the scheduler does not answer)."""
        self._scheduler()
        reply = await health_pb2_grpc.HealthStub(self._channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                                      timeout=timeout_s, wait_for_ready=False)
        return reply.status

    async def health_status(self) -> int:
        """grpc.health.v1 status of the scheduler (a HealthCheckResponse.ServingStatus value).
        Raises ApiError when the check fails."""
        self._scheduler()
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=self._unary_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self.error(exc) from exc
        return reply.status

    async def close(self) -> None:
        """Closes the channel (in-flight calls are cancelled)."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None
