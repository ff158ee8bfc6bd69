"""Thin client of the cache service: builds op ids (one uuid per operation, reused on retries), and carries the
mutations the loop does not wait on (``defer_cache``, ``defer_release``) ahead of its next call, in one
``Cache.Batch``: caching a finished or aborted request and making a prompt visible at prefill then cost no round
trip of their own (before, up to two of the four or five a keystroke's round made)."""

from __future__ import annotations

import threading
import uuid
from typing import Iterable

import grpc

from codeserve.v1 import cache_pb2, cache_pb2_grpc
from common.poller_keeper import PollerKeeper
from common.shortfall import decode_shortfall
from scheduler_svc.errors import AllocationFailed, PoolHeld, SessionLost
from scheduler_svc.rpc import call, dependency_channel, mapped_error


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
        self._keeper = PollerKeeper(self._chan)  # early Matches are sent with .future(): no thread started per call
        self._stub = cache_pb2_grpc.CacheStub(self._chan)
        self.session_id = ""
        self.pool_session = ""  # the session whose RegisterPool was answered ("" from OpenSession until then)
        self._deferred: list[cache_pb2.BatchOp] = []  # sent ahead of the next request operation
        # held while deferred operations are queued or sent: a Flush from another thread (the FlushCache RPC) then
        # goes after everything deferred before it, so it evicts what requests answered before it cached
        self._order = threading.Lock()

    def _call(self, name: str, request, on_error=_session_or_pool_lost, timeout: float | None = None):
        return call("cache", self.target, name, getattr(self._stub, name), request,
                    self.timeout if timeout is None else timeout, on_error)

    def close(self) -> None:
        self._keeper.close()
        self._chan.close()

    def open_session(self, owner: str, lease_seconds: float) -> cache_pb2.OpenSessionResponse:
        """A new session: the old one's requests are released there, so what was deferred for them is dropped."""
        self.pool_session = ""
        reply = self._call("OpenSession", cache_pb2.OpenSessionRequest(owner=owner, lease_seconds=lease_seconds))
        self.session_id = reply.session_id
        with self._order:
            self._deferred = []
        return reply

    # ---- deferred mutations ------------------------------------------------------------------------------
    def defer_cache(self, items: list[cache_pb2.CacheItem]) -> None:
        """``cache_requests(items)``, sent ahead of the next request operation (or ``flush_deferred``); its errors
        are raised by that call. For callers that use no field of the reply."""
        if items:
            with self._order:
                self._deferred.append(cache_pb2.BatchOp(cache=self._cache_request(items)))

    def defer_release(self, request_ids: list[str]) -> None:
        """``release_requests(request_ids)``, deferred as ``defer_cache`` is."""
        if request_ids:
            with self._order:
                self._deferred.append(cache_pb2.BatchOp(release=self._release_request(request_ids)))

    def ending(self, request_id: str) -> bool:
        """True while a deferred operation (sent or not yet answered) ends ``request_id`` (a finished cache item, a
        release): the cache still holds it, so an early Match (``match_early``) must not register that id again.
        Any thread: reads the list the loop replaces when the operations are done (the loop defers an end before
        the intake forgets the request; requests forgotten without one, ``fail_all``, ``lose_finishing``, are freed
        by the resync that follows)."""
        for op in self._deferred:
            if op.HasField("release") and request_id in op.release.request_ids:
                return True
            if op.HasField("cache") and any(i.finished and i.request_id == request_id for i in op.cache.items):
                return True
        return False

    @property
    def deferred_ends(self) -> int:
        """Requests that deferred operations end (finished cache items, releases): the cache still holds them."""
        return sum(len(o.release.request_ids) if o.HasField("release") else sum(i.finished for i in o.cache.items)
                   for o in self._deferred)

    def flush_deferred(self) -> None:
        """Sends what is deferred now, nothing when nothing is (the loop goes idle, or waits for a Forward with
        nothing to admit)."""
        with self._order:
            self._send_deferred()

    def _send_deferred(self) -> None:
        if self._deferred:
            self._call("Batch", cache_pb2.BatchRequest(ops=self._deferred))
            self._deferred = []

    def _mutate(self, kind: str, name: str, request, on_error=_session_or_pool_lost):
        """Request operation ``name`` (BatchOp field ``kind``), after the deferred ones in one Batch when there
        are any (loop thread; under ``_order``, which a Flush from another thread waits for). They are done once the call returns or fails with AllocationFailed (the Batch stops at the
        first failure, and only Allocate fails so); other failures keep them: the resync's new session drops
        them."""
        with self._order:
            if not self._deferred:
                return self._call(name, request, on_error)
            ops = [*self._deferred, cache_pb2.BatchOp(**{kind: request})]
            try:
                reply = self._call("Batch", cache_pb2.BatchRequest(ops=ops), on_error)
            except AllocationFailed:
                self._deferred = []
                raise
            self._deferred = []
            return getattr(reply.results[-1], kind)

    def renew_session(self) -> cache_pb2.RenewSessionResponse:
        return self._call("RenewSession", cache_pb2.RenewSessionRequest(session_id=self.session_id))

    def register_pool(self, page_size: int, members: Iterable[cache_pb2.PoolMember]) -> cache_pb2.RegisterPoolResponse:
        """Registers this client's pool for its session (which then holds it). Raises PoolHeld when a live
        session of another owner holds the pool, SessionLost when our session ended."""
        reply = self._call("RegisterPool", cache_pb2.RegisterPoolRequest(
            op_id=_op(), pool_id=self.pool_id, page_size=page_size, members=list(members),
            session_id=self.session_id), on_error=_registration)
        self.pool_session = self.session_id  # a flush by this registration is behind: early Matches may go
        return reply

    # ---- request operations (each after what is deferred) ----------------------------------------------------
    def match(self, items: list[cache_pb2.MatchItem]) -> cache_pb2.MatchResponse:
        return self._mutate("match", "Match", cache_pb2.MatchRequest(
            op_id=_op(), session_id=self.session_id, pool_id=self.pool_id, items=items))

    def early_request(self) -> cache_pb2.MatchRequest | None:
        """An empty MatchRequest (a new op id; the caller adds its items) in the session whose pool registration was
        answered, for ``match_early``; None before that registration (a resync's RegisterPool may flush the pool).
        Any thread."""
        session_id = self.pool_session
        if not session_id:
            return None
        return cache_pb2.MatchRequest(op_id=_op(), session_id=session_id, pool_id=self.pool_id)

    def match_early(self, request: cache_pb2.MatchRequest) -> grpc.Future:
        """Sends ``request`` (from ``early_request``) now from any thread, not waited for and ahead of nothing
        deferred (``early_match.py``): its future, which ``match_result`` waits for. The caller keeps ids in
        ``ending`` out of it."""
        return self._stub.Match.future(request, timeout=self.timeout)

    def match_result(self, request: cache_pb2.MatchRequest, future: grpc.Future) -> cache_pb2.MatchResponse:
        """The reply of a ``match_early`` future (waits for it); on UNAVAILABLE ``request`` is sent again as the
        loop's calls are (the same op id: the cache answers a Match it ran with its first receipt). Raises what
        ``match`` would: DependencyUnavailable, SessionLost, DependencyError."""
        try:
            return future.result()
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                return self._call("Match", request)
            raise mapped_error("cache", self.target, "Match", err, _session_or_pool_lost) from err

    def allocate(self, wants: list[tuple[str, int]]) -> cache_pb2.AllocateResponse:
        """Slots for ``(request_id, num_tokens)`` pairs, all or nothing."""
        items = [cache_pb2.AllocItem(request_id=rid, num_tokens=n) for rid, n in wants]
        return self._mutate("allocate", "Allocate", cache_pb2.AllocateRequest(
            op_id=_op(), session_id=self.session_id, pool_id=self.pool_id, items=items), on_error=_allocation)

    def cache_requests(self, items: list[cache_pb2.CacheItem]) -> cache_pb2.CacheRequestsResponse:
        return self._mutate("cache", "CacheRequests", self._cache_request(items))

    def release_requests(self, request_ids: list[str]) -> cache_pb2.ReleaseRequestsResponse:
        return self._mutate("release", "ReleaseRequests", self._release_request(request_ids))

    def _cache_request(self, items: list[cache_pb2.CacheItem]) -> cache_pb2.CacheRequestsRequest:
        return cache_pb2.CacheRequestsRequest(op_id=_op(), session_id=self.session_id, pool_id=self.pool_id,
                                              items=items)

    def _release_request(self, request_ids: list[str]) -> cache_pb2.ReleaseRequestsRequest:
        return cache_pb2.ReleaseRequestsRequest(op_id=_op(), session_id=self.session_id, pool_id=self.pool_id,
                                                request_ids=request_ids)

    def flush(self) -> cache_pb2.FlushResponse:
        """Evicts every unlocked prefix of the pool, after what is deferred (any thread: the FlushCache RPC's), so a
        request answered before the flush has its insert flushed too."""
        with self._order:
            self._send_deferred()
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
