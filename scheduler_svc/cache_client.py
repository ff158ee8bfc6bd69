"""Thin client of the cache service: builds op ids (one uuid per operation, reused on retries)."""

from __future__ import annotations

import uuid
from typing import Iterable

import grpc

from codeserve.v1 import cache_pb2, cache_pb2_grpc
from common.shortfall import decode_shortfall
from scheduler_svc.errors import AllocationFailed, PoolHeld, SessionLost
from scheduler_svc.rpc import call, dependency_channel


def _op() -> str:
    return uuid.uuid4().hex


def _session_or_pool_lost(err: grpc.RpcError) -> Exception | None:
    if err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
        details = (err.details() or "").lower()
        if "session" in details or "pool" in details:
            return SessionLost(err.details())
    return None


def _registration(err: grpc.RpcError) -> Exception | None:
    if err.code() == grpc.StatusCode.FAILED_PRECONDITION and "is held by" in (err.details() or ""):
        return PoolHeld(err.details())
    return _session_or_pool_lost(err)


def _allocation(err: grpc.RpcError) -> Exception | None:
    if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return AllocationFailed(err.details() or "", decode_shortfall(err))
    return _session_or_pool_lost(err)


class CacheClient:
    """One scheduler's view of one pool of the cache service at ``target``. ``session_id`` is set by
    ``open_session``. Every method raises DependencyUnavailable / DependencyError / SessionLost
    (and ``allocate`` AllocationFailed) instead of returning a default."""

    def __init__(self, target: str, pool_id: str, timeout: float = 10.0) -> None:
        self.target, self.pool_id, self.timeout = target, pool_id, timeout
        self._chan = dependency_channel(target)
        self._stub = cache_pb2_grpc.CacheStub(self._chan)
        self.session_id = ""

    def _call(self, name: str, request, on_error=_session_or_pool_lost, timeout: float | None = None):
        return call("cache", self.target, name, getattr(self._stub, name), request,
                    self.timeout if timeout is None else timeout, on_error)

    def close(self) -> None:
        self._chan.close()

    def open_session(self, owner: str, lease_seconds: float) -> cache_pb2.OpenSessionResponse:
        reply = self._call("OpenSession", cache_pb2.OpenSessionRequest(owner=owner, lease_seconds=lease_seconds))
        self.session_id = reply.session_id
        return reply

    def renew_session(self) -> cache_pb2.RenewSessionResponse:
        return self._call("RenewSession", cache_pb2.RenewSessionRequest(session_id=self.session_id))

    def register_pool(self, page_size: int, members: Iterable[cache_pb2.PoolMember]) -> cache_pb2.RegisterPoolResponse:
        """Registers this client's pool for its session (which then holds it). Raises PoolHeld when a live
        session of another owner holds the pool, SessionLost when our session ended."""
        return self._call("RegisterPool", cache_pb2.RegisterPoolRequest(
            op_id=_op(), pool_id=self.pool_id, page_size=page_size, members=list(members),
            session_id=self.session_id), on_error=_registration)

    def match(self, items: list[cache_pb2.MatchItem]) -> cache_pb2.MatchResponse:
        return self._call("Match", cache_pb2.MatchRequest(
            op_id=_op(), session_id=self.session_id, pool_id=self.pool_id, items=items))

    def allocate(self, wants: list[tuple[str, int]]) -> cache_pb2.AllocateResponse:
        """Slots for ``(request_id, num_tokens)`` pairs, all or nothing."""
        items = [cache_pb2.AllocItem(request_id=rid, num_tokens=n) for rid, n in wants]
        return self._call("Allocate", cache_pb2.AllocateRequest(
            op_id=_op(), session_id=self.session_id, pool_id=self.pool_id, items=items), on_error=_allocation)

    def cache_requests(self, items: list[cache_pb2.CacheItem]) -> cache_pb2.CacheRequestsResponse:
        return self._call("CacheRequests", cache_pb2.CacheRequestsRequest(
            op_id=_op(), session_id=self.session_id, pool_id=self.pool_id, items=items))

    def release_requests(self, request_ids: list[str]) -> cache_pb2.ReleaseRequestsResponse:
        return self._call("ReleaseRequests", cache_pb2.ReleaseRequestsRequest(
            op_id=_op(), session_id=self.session_id, pool_id=self.pool_id, request_ids=request_ids))

    def flush(self) -> cache_pb2.FlushResponse:
        return self._call("Flush", cache_pb2.FlushRequest(op_id=_op(), pool_id=self.pool_id))

    def get_pool(self, timeout: float | None = None) -> cache_pb2.PoolStatus:
        """Status of this client's pool (``timeout``: seconds, default the client's). Raises SessionLost when the
        cache does not know the pool, DependencyUnavailable / DependencyError when the call fails."""
        reply = self._call("GetPool", cache_pb2.GetPoolRequest(pool_id=self.pool_id), timeout=timeout)
        for pool in reply.pools:
            if pool.pool_id == self.pool_id:
                return pool
        raise SessionLost(f"cache at {self.target} does not know pool {self.pool_id!r}")

    def check_integrity(self) -> list[str]:
        return list(self._call("CheckIntegrity", cache_pb2.CheckIntegrityRequest(pool_id=self.pool_id)).violations)
