"""The gateway's view of whether the scheduler answers: a background probe of its grpc.health.v1 with a short
deadline. A frozen (SIGSTOP) or dead scheduler is noticed within ``probe_interval_s + probe_timeout_s``; from
then on new generations fail fast with 503 + Retry-After and the ones in flight end with a 503 error instead of
hanging; the first probe that answers again lifts it (R1, lessons §3)."""

from __future__ import annotations

import asyncio
import time

import grpc
import structlog
from grpc_health.v1 import health_pb2

from gateway.errors import ApiError
from gateway.scheduler_client import SchedulerClient

log = structlog.get_logger()
UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class SchedulerWatch:
    """Probes ``client``'s scheduler every ``interval_s`` seconds (deadline ``timeout_s``) and sets
    ``client.down`` to the reason while it does not answer (None once it answers, SERVING or not: a
    NOT_SERVING scheduler still answers, and refuses or queues work itself). On the transition to down, every
    generation in flight is abandoned with a 503."""

    def __init__(self, client: SchedulerClient, interval_s: float, timeout_s: float, retry_after_s: int) -> None:
        self.client, self.interval_s, self.timeout_s, self.retry_after_s = client, interval_s, timeout_s, retry_after_s
        self.last_status: int | None = None  # the last HealthCheckResponse.ServingStatus seen
        self.last_answer_at = time.monotonic()

    async def probe_once(self) -> None:
        """One probe; updates ``client.down`` and ``last_status``."""
        try:
            self.last_status = await self.client.probe(self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in UNREACHABLE:  # it answered (with an error): reachable, but say so
                log.error("scheduler_health_error", scheduler=self.client.target, code=exc.code().name,
                          details=exc.details())
                self.last_status = None
                self._up()
                return
            self._down(f"the scheduler at {self.client.target} did not answer a health check within "
                       f"{self.timeout_s} s ({exc.code().name}); last answer "
                       f"{time.monotonic() - self.last_answer_at:.1f} s ago")
            return
        self._up()

    def _up(self) -> None:
        self.last_answer_at = time.monotonic()
        if self.client.down is not None:
            log.warning("scheduler_reachable", scheduler=self.client.target, status=self.last_status)
            self.client.down = None

    def _down(self, reason: str) -> None:
        first = self.client.down is None
        self.client.down = reason
        if first:
            streams = list(self.client.streams)
            log.error("scheduler_unreachable", scheduler=self.client.target, reason=reason, abandoned=len(streams))
            for stream in streams:
                stream.abandon(ApiError(503, reason, "service_unavailable", retry_after_s=self.retry_after_s))

    async def run(self) -> None:
        """Probes until cancelled. An unexpected error is logged (the gateway then no longer notices a frozen
        scheduler, so it must be seen) and re-raised."""
        try:
            while True:
                started = time.monotonic()
                await self.probe_once()
                await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("scheduler_watch_failed", scheduler=self.client.target)
            raise


async def not_serving_reason(client: SchedulerClient, status: int) -> str:
    """Why a scheduler whose health is ``status`` (not SERVING) does not serve: the status name, then its GetLoad's
    ``unhealthy_reason`` (a frozen worker, no progress, stopping) when it gives one; when GetLoad itself fails, that
    failure is named instead. For /ready, with one scheduler and with replicas."""
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    try:
        why = (await client.get_load()).unhealthy_reason
    except ApiError as exc:
        return f"{name} (its reason could not be read: GetLoad answered {exc.status} {exc.message})"
    return f"{name}: {why}" if why else name
