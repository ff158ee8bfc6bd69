"""Typed errors of the scheduler's dependencies (the cache and worker services)."""

from __future__ import annotations

import grpc

from codeserve.v1 import cache_pb2


class DependencyUnavailable(RuntimeError):
    """A service could not be reached after retries (UNAVAILABLE / DEADLINE_EXCEEDED). Names it and its target."""

    def __init__(self, service: str, target: str, cause: str) -> None:
        super().__init__(f"{service} service at {target} unavailable: {cause}")
        self.service, self.target, self.cause = service, target, cause


class DependencyError(RuntimeError):
    """A service answered an RPC with an error status that the scheduler does not handle as a state change."""

    def __init__(self, service: str, rpc: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{service}.{rpc} failed: {code.name}: {details}")
        self.service, self.rpc, self.code, self.details = service, rpc, code, details


class AllocationFailed(RuntimeError):
    """Cache.Allocate answered RESOURCE_EXHAUSTED after its relief ladder; ``shortfall`` is the decoded
    AllocationShortfall detail (None when the status carried none)."""

    def __init__(self, details: str, shortfall: cache_pb2.AllocationShortfall | None) -> None:
        msg = f"allocation failed: {details}"
        if shortfall is not None:
            msg += (f" (asked={shortfall.asked_tokens} freed_by_eviction={shortfall.freed_by_eviction}"
                    f" still_evictable={shortfall.still_evictable}"
                    f" available={shortfall.available}: {shortfall.reason})")
        super().__init__(msg)
        self.shortfall = shortfall


class SessionLost(RuntimeError):
    """The cache no longer knows our session (expired, replaced, or the cache restarted)."""


class PoolHeld(RuntimeError):
    """Cache.RegisterPool answered FAILED_PRECONDITION: a live session of another owner holds the pool (another
    scheduler serves it). Not an outage to retry: retrying would fight that scheduler for the pool. The message
    is the cache's, naming the pool and the owner."""


class WorkerEpochChanged(RuntimeError):
    """The worker restarted (Forward answered FAILED_PRECONDITION): its KV pool is empty."""


class WorkerStalled(RuntimeError):
    """The worker has not answered health checks for longer than the stall timeout (frozen: SIGSTOP, wedged);
    the message names the worker and the seconds (``liveness.WorkerLiveness``)."""
