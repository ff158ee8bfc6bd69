"""Thin gRPC servicer: protobuf <-> plain types, typed errors -> status codes. The logic is in CacheCore.

INVALID_ARGUMENT: malformed input; NOT_FOUND: unknown pool/session/request; FAILED_PRECONDITION: double free,
expired or replaced session, request dropped by an epoch flush, request registered twice, a pool held by a live
session of another owner (RegisterPool);
RESOURCE_EXHAUSTED: allocation unfundable after the relief ladder, with an AllocationShortfall detail
(google.rpc.Status via grpcio-status). Never INTERNAL for a client mistake.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterator

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from grpc_status import rpc_status

from cache_svc.core import CacheCore
from cache_svc.errors import CacheError, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from cache_svc.items import CacheItem, MatchItem, Member
from cache_svc.receipts import AllocationShortfall, Counters, EvictionReceipt, Receipt
from codeserve.v1 import cache_pb2, cache_pb2_grpc
from common import hop_trace
from common.proto_ints import as_tuple

SERVICE_NAME = cache_pb2.DESCRIPTOR.services_by_name["Cache"].full_name

_CODES = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
}


def counters_pb(c: Counters) -> cache_pb2.Counters:
    return cache_pb2.Counters(capacity=c.capacity, available=c.available, evictable=c.evictable,
                              protected=c.protected, owned=c.owned, cached=c.cached)


def receipt_pb(r: Receipt) -> cache_pb2.Receipt:
    return cache_pb2.Receipt(pool_id=r.pool_id, op_id=r.op_id, operation=r.operation, asked_tokens=r.asked_tokens,
                             delivered_tokens=r.delivered_tokens, before=counters_pb(r.before),
                             after=counters_pb(r.after), replayed=r.replayed)


def eviction_pb(e: EvictionReceipt | None) -> cache_pb2.EvictionReceipt | None:
    if e is None:
        return None
    return cache_pb2.EvictionReceipt(asked_tokens=e.asked_tokens, freed_tokens=e.freed_tokens,
                                     nodes_evicted=e.nodes_evicted,
                                     before=counters_pb(e.before), after=counters_pb(e.after))


def shortfall_pb(s: AllocationShortfall) -> cache_pb2.AllocationShortfall:
    return cache_pb2.AllocationShortfall(
        pool_id=s.pool_id, asked_tokens=s.asked_tokens, freed_by_eviction=s.freed_by_eviction,
        still_evictable=s.still_evictable, available=s.available,
        reason=s.reason, counters=counters_pb(s.counters))


def _rpc(method: Callable) -> Callable:
    """Maps CacheError subclasses to status codes; anything else propagates (a server bug -> UNKNOWN)."""

    @functools.wraps(method)
    def wrapper(self: "CacheServicer", request, context: grpc.ServicerContext):
        try:
            return method(self, request, context)
        except ResourceExhausted as err:
            detail = any_pb2.Any()
            detail.Pack(shortfall_pb(err.shortfall))
            context.abort_with_status(rpc_status.to_status(
                status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=str(err), details=[detail])))
        except CacheError as err:
            context.abort(_CODES[type(err)], str(err))

    return wrapper


class CacheServicer(cache_pb2_grpc.CacheServicer):
    """The Cache service over one CacheCore."""

    def __init__(self, core: CacheCore) -> None:
        self.core = core

    @_rpc
    def RegisterPool(self, request, context):
        members = [Member(m.worker_id, m.epoch, m.capacity_tokens) for m in request.members]
        out = self.core.register_pool(request.op_id, request.pool_id, request.page_size, members, request.session_id)
        return cache_pb2.RegisterPoolResponse(receipt=receipt_pb(out.receipt), flushed=out.flushed,
                                              capacity=out.capacity, page_size=out.page_size,
                                              reserved_slot=out.reserved_slot)

    @_rpc
    def OpenSession(self, request, context):
        out = self.core.open_session(request.owner, request.lease_seconds)
        return cache_pb2.OpenSessionResponse(session_id=out.session_id, replaced_session_id=out.replaced_session_id,
                                             released_requests=out.released_requests)

    @_rpc
    def RenewSession(self, request, context):
        return cache_pb2.RenewSessionResponse(lease_seconds_left=self.core.renew_session(request.session_id))

    @_rpc
    def Match(self, request, context):
        traced = [i.request_id for i in request.items if i.lock] if hop_trace.enabled() else ()  # admissions only:
        for rid in traced:  # an unlocked Match (lpm's prefix lengths) comes first and would take their marks
            hop_trace.mark(rid, "cache_in")  # (marked already when a Batch brought it)
            hop_trace.mark(rid, "match_in")
        items = [MatchItem(i.request_id, i.namespace, as_tuple(i.token_ids), i.lock, i.max_match_tokens,
                           i.allocate_up_to, i.compute_tokens) for i in request.items]
        out = self.core.match(request.op_id, request.session_id, request.pool_id, items)
        reply = cache_pb2.MatchResponse(
            receipt=receipt_pb(out.receipt),
            allocation=receipt_pb(out.allocation) if out.allocation is not None else None,
            results=[cache_pb2.MatchResult(request_id=r.request_id, cached_tokens=r.cached_tokens,
                                           slot_ids=r.slot_ids, allocated_slot_ids=r.allocated_slot_ids)
                     for r in out.results])
        for rid in traced:
            hop_trace.mark(rid, "match_out")
        return reply

    @_rpc
    def Allocate(self, request, context):
        items = [(i.request_id, i.num_tokens) for i in request.items]
        out = self.core.allocate(request.op_id, request.session_id, request.pool_id, items)
        resp = cache_pb2.AllocateResponse(receipt=receipt_pb(out.receipt), relief=eviction_pb(out.relief))
        add = resp.results.add
        for r in out.results:
            add(request_id=r.request_id, slot_ids=r.slot_ids)
        return resp

    @_rpc
    def CacheRequests(self, request, context):
        items = [CacheItem(i.request_id, as_tuple(i.token_ids), i.finished) for i in request.items]
        out = self.core.cache_requests(request.op_id, request.session_id, request.pool_id, items)
        return cache_pb2.CacheRequestsResponse(receipt=receipt_pb(out.receipt), results=[
            cache_pb2.CacheResult(request_id=r.request_id, already_cached_tokens=r.already_cached_tokens,
                                  inserted_tokens=r.inserted_tokens, freed_tokens=r.freed_tokens,
                                  prefix_slot_ids=r.prefix_slot_ids) for r in out.results])

    def Batch(self, request, context):
        """Each operation through its own RPC method, in order; the first that fails aborts the call with its
        status (``context.abort`` raises, so the rest are not applied)."""
        results = []
        if hop_trace.enabled():  # an admission Match's arrival, before the operations sent ahead of it
            for op in request.ops:
                for i in op.match.items if op.WhichOneof("op") == "match" else ():
                    if i.lock:
                        hop_trace.mark(i.request_id, "cache_in")
        for op in request.ops:
            kind = op.WhichOneof("op")
            if kind is None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Batch operation {len(results)} sets no operation")
            handler = {"cache": self.CacheRequests, "release": self.ReleaseRequests, "match": self.Match,
                       "allocate": self.Allocate}[kind]
            results.append(cache_pb2.BatchResult(**{kind: handler(getattr(op, kind), context)}))
        return cache_pb2.BatchResponse(results=results)

    @_rpc
    def ReleaseRequests(self, request, context):
        out = self.core.release_requests(request.op_id, request.session_id, request.pool_id, list(request.request_ids))
        return cache_pb2.ReleaseRequestsResponse(receipt=receipt_pb(out.receipt), freed_tokens=out.freed_tokens)

    @_rpc
    def Evict(self, request, context):
        out = self.core.evict(request.op_id, request.pool_id, request.num_tokens)
        return cache_pb2.EvictResponse(receipt=receipt_pb(out.receipt), eviction=eviction_pb(out.eviction))

    @_rpc
    def Flush(self, request, context):
        out = self.core.flush(request.op_id, request.pool_id)
        return cache_pb2.FlushResponse(receipt=receipt_pb(out.receipt), freed_tokens=out.eviction.freed_tokens)

    @_rpc
    def GetPool(self, request, context):
        pools = self.core.pool_status(request.pool_id)
        return cache_pb2.GetPoolResponse(pools=[
            cache_pb2.PoolStatus(
                pool_id=p.pool_id, page_size=p.page_size, counters=counters_pb(p.counters), requests=p.requests,
                members=[cache_pb2.PoolMember(worker_id=m.worker_id, epoch=m.epoch, capacity_tokens=m.capacity_tokens)
                         for m in p.members],
                match_queries_tokens=p.match_query_tokens, match_hit_tokens=p.match_hit_tokens,
                fundable_tokens=p.fundable, budget_derivation=p.budget_derivation)
            for p in pools])

    @_rpc
    def ProbePrefix(self, request, context):
        probes = self.core.probe_prefix(request.namespace, request.token_ids, list(request.pool_ids))
        return cache_pb2.ProbePrefixResponse(pools=[
            cache_pb2.PoolProbe(pool_id=p.pool_id, epochs=p.epochs, cached_tokens=p.cached_tokens,
                                fundable_tokens=p.fundable_tokens, capacity=p.capacity, page_size=p.page_size)
            for p in probes])

    @_rpc
    def CheckIntegrity(self, request, context):
        return cache_pb2.CheckIntegrityResponse(violations=self.core.check_integrity(request.pool_id))

    @_rpc
    def WatchEvents(self, request, context) -> Iterator[cache_pb2.PrefixEvent]:
        # Validate eagerly so an unknown pool is NOT_FOUND before the stream starts.
        self.core.events_since(request.pool_id, request.from_sequence)
        return self._stream(request, context)

    def _stream(self, request, context) -> Iterator[cache_pb2.PrefixEvent]:
        seq = request.from_sequence
        while context.is_active():
            try:
                events = self.core.events_since(request.pool_id, seq, timeout=0.5)
            except NotFound as err:
                context.abort(grpc.StatusCode.NOT_FOUND, str(err))
            for e in events:
                seq = e.sequence
                yield cache_pb2.PrefixEvent(sequence=e.sequence, pool_id=e.pool_id, kind=e.kind,
                                            namespace=e.namespace, token_ids=e.token_ids, num_tokens=e.num_tokens)
