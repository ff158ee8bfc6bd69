"""Typed errors of the cache service; the servicer maps each class to one gRPC status code."""

from __future__ import annotations

from cache_svc.receipts import AllocationShortfall


class CacheError(Exception):
    """Base class. ``str(err)`` is the reason sent to the client."""


class InvalidArgument(CacheError):
    """Malformed input (lengths that differ, slot ids out of range, unaligned lengths). -> INVALID_ARGUMENT."""


class NotFound(CacheError):
    """Unknown pool, session or request. -> NOT_FOUND."""


class FailedPrecondition(CacheError):
    """State conflict: double free, a session that expired or was replaced, a request dropped by an
    epoch flush, a request registered twice. -> FAILED_PRECONDITION."""


class ResourceExhausted(CacheError):
    """An allocation that the relief ladder could not fund. -> RESOURCE_EXHAUSTED with ``shortfall``
    packed as a google.rpc.Status detail."""

    def __init__(self, shortfall: AllocationShortfall) -> None:
        super().__init__(
            f"cannot allocate {shortfall.asked_tokens} tokens in pool {shortfall.pool_id}: {shortfall.reason}"
        )
        self.shortfall = shortfall
