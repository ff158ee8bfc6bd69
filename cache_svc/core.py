"""CacheCore: every pool and session behind one lock, idempotent op ids, receipts. The servicer calls this.

Each public method is one RPC. Mutating methods take ``op_id``: a retry with the same op_id and the same
arguments returns the first outcome with ``receipt.replayed = True`` and changes nothing; the same op_id
with different arguments is InvalidArgument. Expired sessions are swept at the start of every call.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Sequence, TypeVar

from cache_svc import integrity
from cache_svc.events import EventLog, PrefixEvent
from cache_svc.errors import FailedPrecondition, InvalidArgument, NotFound
from cache_svc.items import (
    AllocateOutcome, CacheItem, CacheOutcome, CacheResult, EvictOutcome, MatchItem, MatchOutcome, MatchResult, Member,
    PoolProbe, PoolStatus, RegisterOutcome, ReleaseOutcome, SessionOutcome,
)
from cache_svc.pool import Pool
from cache_svc.receipts import Receipt
from cache_svc.sessions import OpLog, Session, SessionTable

Outcome = TypeVar("Outcome")


def _weight(outcome) -> int:
    """Slot ids a stored outcome holds (its weight in the op log): match and allocate results' ``slot_ids``
    (and a match's ``allocated_slot_ids``), cache results' ``prefix_slot_ids``; 0 for the others."""
    results = outcome.results if isinstance(outcome, (MatchOutcome, AllocateOutcome, CacheOutcome)) else ()
    return sum(len(r.prefix_slot_ids if isinstance(r, CacheResult) else r.slot_ids)
               + (len(r.allocated_slot_ids) if isinstance(r, MatchResult) else 0) for r in results)


class CacheCore:
    """Pools by id, sessions, the op log. Thread safe (one lock). ``clock`` is monotonic seconds."""

    def __init__(self, lease_seconds: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.pools: dict[str, Pool] = {}
        self.sessions = SessionTable(clock, lease_seconds)
        self.ops = OpLog()
        self.lock = threading.Lock()
        # (session_id, request_id) -> why it ended (flush, release, finish); bounded, oldest dropped first
        self.dropped: dict[tuple[str, str], str] = {}
        self.events: dict[str, EventLog] = {}
        self.holders: dict[str, str] = {}  # pool_id -> session_id that registered it last (held while that session lives)

    # ---- helpers -------------------------------------------------------------------------------
    def _pool(self, pool_id: str) -> Pool:
        pool = self.pools.get(pool_id)
        if pool is None:
            raise NotFound(f"unknown pool {pool_id!r} (register it first)")
        return pool

    def _sweep(self) -> None:
        for session in self.sessions.expire():
            self._release_session(session)

    def _release_session(self, session: Session) -> int:
        released = 0
        for pool in self.pools.values():
            released += len(pool.release_session(session.session_id))
        session.requests.clear()
        return released

    def _check_requests(self, session: Session, pool_id: str, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            where = session.requests.get(rid)
            if where == pool_id:
                continue
            why = self.dropped.get((session.session_id, rid))
            if why is not None:
                raise FailedPrecondition(why)
            if where is not None:
                raise InvalidArgument(f"request {rid!r} is registered in pool {where!r}, not {pool_id!r}")
            raise NotFound(f"request {rid!r} is not registered in this session (register it with Match(lock=true) first)")

    def _recorded(self, op_id: str, fingerprint: tuple, run: Callable[[], Outcome]) -> Outcome:
        """One mutating RPC, idempotent by ``op_id``: under the lock, expired sessions are swept; a retry (same
        op_id, same ``fingerprint`` of the arguments) gets the stored outcome with ``receipt.replayed = True``
        and changes nothing; otherwise ``run()`` makes the outcome, which is stored. The same op_id with other
        arguments raises InvalidArgument (OpLog.lookup); whatever ``run`` raises is not stored."""
        with self.lock:
            self._sweep()
            stored = self.ops.lookup(op_id, fingerprint)
            if stored is not None:
                return dataclasses.replace(stored, receipt=dataclasses.replace(stored.receipt, replayed=True))
            outcome = run()
            self.ops.record(op_id, fingerprint, outcome, weight=_weight(outcome))
            return outcome

    def _session_pool(self, session_id: str, pool_id: str) -> tuple[Session, Pool]:
        """The live session and the pool of a request operation (FailedPrecondition / NotFound otherwise)."""
        return self.sessions.get(session_id), self._pool(pool_id)

    # ---- pools and sessions --------------------------------------------------------------------
    def register_pool(self, op_id: str, pool_id: str, page_size: int, members: Sequence[Member],
                      session_id: str = "") -> RegisterOutcome:
        """Creates a pool or, when page size or any member (id, epoch, capacity) changed, flushes it: every
        request in it is released (later calls naming them get FAILED_PRECONDITION) and tree and allocator
        start empty. Unchanged registration: flushed=False, nothing changes.

        ``session_id`` (the registering scheduler's session) then holds the pool. Raises FailedPrecondition,
        changing nothing, when a live session of another owner holds it (two schedulers on one pool would
        flush each other); a new session of the same owner (a scheduler restart: OpenSession replaced the old
        one) takes it over, and a session that expired or was replaced holds nothing. An empty ``session_id``
        holds nothing and is refused on a held pool. An unknown or ended ``session_id``: NotFound /
        FailedPrecondition (``SessionTable.get``)."""
        def run() -> RegisterOutcome:
            if not pool_id:
                raise InvalidArgument("pool_id must be non-empty")
            if len({m.worker_id for m in members}) != len(members):
                raise InvalidArgument("member worker ids must be distinct")
            owner = self.sessions.get(session_id).owner if session_id else ""
            holder = self.sessions.live.get(self.holders.get(pool_id, ""))
            if holder is not None and holder.owner != owner:
                raise FailedPrecondition(
                    f"pool {pool_id!r} is held by live session {holder.session_id} of owner {holder.owner!r}; "
                    f"{'owner ' + repr(owner) if owner else 'a registration without a session'} may not register "
                    f"it (give each scheduler its own pool id, or stop the other one: its session ends when its "
                    f"lease of {holder.lease_seconds:g} s runs out)")
            old = self.pools.get(pool_id)
            flushed = old is None or old.page_size != page_size or old.members != tuple(members)
            if flushed:
                log = self.events.setdefault(pool_id, EventLog(pool_id))
                new = Pool(pool_id, page_size, members, on_event=log.append)  # validates before anything is dropped
                if old is not None:
                    log.append("flushed", "", [], 0)
                before = old.counters() if old is not None else new.counters()
                if old is not None:
                    self._drop_pool_requests(old, "epoch or membership changed")
                self.pools[pool_id] = new
            if session_id:
                self.holders[pool_id] = session_id
            pool = self.pools[pool_id]
            after = pool.counters()
            return RegisterOutcome(
                Receipt(pool_id, op_id, "register", after.capacity, after.capacity,
                        before if flushed else after, after),
                flushed, pool.capacity, pool.page_size, 0,
            )

        return self._recorded(op_id, ("register", pool_id, page_size, tuple(members), session_id), run)

    def _drop_pool_requests(self, pool: Pool, why: str) -> None:
        for (sid, rid) in list(pool.requests):
            session = self.sessions.live.get(sid)
            if session is not None:
                session.requests.pop(rid, None)
            self._ended(sid, rid, f"request {rid!r} was released when pool {pool.pool_id!r} was flushed ({why}); requeue it")

    def _ended(self, session_id: str, request_id: str, why: str) -> None:
        self.dropped[(session_id, request_id)] = why
        while len(self.dropped) > 100_000:
            self.dropped.pop(next(iter(self.dropped)))

    def open_session(self, owner: str, lease_seconds: float = 0.0) -> SessionOutcome:
        """Opens a session; an older session of ``owner`` is replaced and all its requests released."""
        with self.lock:
            self._sweep()
            session, old = self.sessions.open(owner, lease_seconds)
            released = self._release_session(old) if old is not None else 0
            return SessionOutcome(session.session_id, old.session_id if old else "", released)

    def renew_session(self, session_id: str) -> float:
        """Renews the lease; returns seconds left. FailedPrecondition when expired or replaced."""
        with self.lock:
            self._sweep()
            return self.sessions.renew(session_id)

    # ---- request operations --------------------------------------------------------------------
    def match(self, op_id: str, session_id: str, pool_id: str, items: Sequence[MatchItem]) -> MatchOutcome:
        """Matches and (lock=true) locks and registers requests. Request ids are unique in a session:
        registering a live id again is FailedPrecondition; lock=true with an empty id is InvalidArgument, as is
        allocate_up_to without lock or below 0, or compute_tokens below 0. Then, for items with
        ``allocate_up_to`` (admission in one round trip), ``Pool.allocate_free``: their first chunk's slots, paid
        from free pages only, with a receipt of their own (``allocation``: before = the match receipt's after;
        replayed with it on a retried op_id)."""
        def run() -> MatchOutcome:
            session, pool = self._session_pool(session_id, pool_id)
            ids = [i.request_id for i in items if i.lock]
            if any(not rid for rid in ids):
                raise InvalidArgument("a locking match needs a request_id")
            if len(set(ids)) != len(ids):
                raise InvalidArgument("a request id appears twice in one Match")
            for rid in ids:
                if rid in session.requests:
                    raise FailedPrecondition(f"request {rid!r} is already registered in this session")
            for i in items:
                if i.allocate_up_to < 0 or (i.allocate_up_to and not i.lock):
                    raise InvalidArgument(f"request {i.request_id!r}: allocate_up_to must be >= 0 and needs lock, "
                                          f"got {i.allocate_up_to} (lock={i.lock})")
                if i.compute_tokens < 0:
                    raise InvalidArgument(f"request {i.request_id!r}: compute_tokens must be >= 0, "
                                          f"got {i.compute_tokens}")
            before = pool.counters()
            results = pool.match(session_id, items)
            for rid in ids:
                session.requests[rid] = pool_id
                self.dropped.pop((session_id, rid), None)
            locked = pool.counters()
            receipt = Receipt(pool_id, op_id, "match", sum(len(i.token_ids) for i in items),
                              sum(r.cached_tokens for r in results), before, locked)
            wanted = [(i, r) for i, r in zip(items, results) if i.allocate_up_to > 0]
            if not wanted:
                return MatchOutcome(receipt, tuple(results))
            asked = delivered = 0
            by_id = {}
            for item, result in wanted:
                n = max(0, min(item.compute_tokens - result.cached_tokens, item.allocate_up_to))
                slots = pool.allocate_free(session_id, item.request_id, n)
                asked, delivered = asked + n, delivered + len(slots)
                by_id[item.request_id] = dataclasses.replace(result, allocated_slot_ids=slots)
            allocation = Receipt(pool_id, op_id, "allocate", asked, delivered, locked, pool.counters())
            return MatchOutcome(receipt, tuple(by_id.get(r.request_id, r) for r in results), allocation)

        out = self._recorded(op_id, ("match", session_id, pool_id, tuple(items)), run)
        if out.receipt.replayed and out.allocation is not None:  # the stored answer: its allocation too
            out = dataclasses.replace(out, allocation=dataclasses.replace(out.allocation, replayed=True))
        return out

    def allocate(self, op_id: str, session_id: str, pool_id: str, items: Sequence[tuple[str, int]]) -> AllocateOutcome:
        """All-or-nothing allocation for many requests (see ``Pool.allocate``). asked/delivered are tokens."""
        def run() -> AllocateOutcome:
            session, pool = self._session_pool(session_id, pool_id)
            before = pool.counters()
            try:
                results, relief = pool.allocate(session_id, items)
            except NotFound:
                # Refine "not in this pool" into the precise cause (dropped by a flush, other pool, unknown).
                self._check_requests(session, pool_id, [rid for rid, _ in items])
                raise
            after = pool.counters()
            asked = sum(n for _, n in items)
            receipt = Receipt(pool_id, op_id, "allocate", asked, asked, before, after)
            return AllocateOutcome(receipt, tuple(results), relief)

        return self._recorded(op_id, ("allocate", session_id, pool_id, tuple(items)), run)

    def cache_requests(self, op_id: str, session_id: str, pool_id: str, items: Sequence[CacheItem]) -> CacheOutcome:
        """Inserts computed prefixes (see ``Pool.cache``); finished requests leave the session."""
        def run() -> CacheOutcome:
            session, pool = self._session_pool(session_id, pool_id)
            self._check_requests(session, pool_id, [i.request_id for i in items])
            before = pool.counters()
            results = pool.cache(session_id, items)
            for item in items:
                if item.finished:
                    del session.requests[item.request_id]
                    self._ended(session_id, item.request_id, f"request {item.request_id!r} already finished (CacheRequests)")
            receipt = Receipt(pool_id, op_id, "cache", sum(len(i.token_ids) for i in items),
                              sum(r.inserted_tokens for r in results), before, pool.counters())
            return CacheOutcome(receipt, tuple(results))

        return self._recorded(op_id, ("cache", session_id, pool_id, tuple(items)), run)

    def release_requests(self, op_id: str, session_id: str, pool_id: str, request_ids: Sequence[str]) -> ReleaseOutcome:
        """Frees the requests' uncached slots, unlocks their nodes, forgets them."""
        def run() -> ReleaseOutcome:
            session, pool = self._session_pool(session_id, pool_id)
            self._check_requests(session, pool_id, request_ids)
            before = pool.counters()
            freed = pool.release(session_id, request_ids)
            for rid in request_ids:
                del session.requests[rid]
                self._ended(session_id, rid, f"request {rid!r} was already released (ReleaseRequests)")
            receipt = Receipt(pool_id, op_id, "release", freed, freed, before, pool.counters())
            return ReleaseOutcome(receipt, freed)

        return self._recorded(op_id, ("release", session_id, pool_id, tuple(request_ids)), run)

    # ---- pool-wide operations ------------------------------------------------------------------
    def evict(self, op_id: str, pool_id: str, num_tokens: int, operation: str = "evict") -> EvictOutcome:
        """Evicts LRU unlocked leaves until ``num_tokens`` were released (flush: everything unlocked)."""
        def run() -> EvictOutcome:
            pool = self._pool(pool_id)
            if num_tokens < 0:
                raise InvalidArgument(f"num_tokens must be >= 0, got {num_tokens}")
            eviction = pool.evict(float("inf") if operation == "flush" else num_tokens)
            receipt = Receipt(pool_id, op_id, operation, eviction.asked_tokens, eviction.freed_tokens,
                              eviction.before, eviction.after)
            return EvictOutcome(receipt, eviction)

        return self._recorded(op_id, (operation, pool_id, num_tokens), run)

    def flush(self, op_id: str, pool_id: str) -> EvictOutcome:
        """Evicts every unlocked node of the pool."""
        return self.evict(op_id, pool_id, 0, operation="flush")

    def pool_status(self, pool_id: str = "") -> list[PoolStatus]:
        """Status of one pool (NotFound when unknown) or of all pools (empty id)."""
        with self.lock:
            self._sweep()
            pools = [self._pool(pool_id)] if pool_id else list(self.pools.values())
            return [self._status(p) for p in pools]

    def probe_prefix(self, namespace: str, token_ids: Sequence[int], pool_ids: Sequence[str] = ()) -> list[PoolProbe]:
        """For one prompt, per pool (``pool_ids`` in their order; empty = every pool in id order): the longest
        cached prefix in whole pages, epochs and budget (``Pool.probe``). Strictly read-only: it takes the
        core's mutex for a consistent read (no lock ref), and it does not even sweep expired sessions (a lapsed
        session's locks count as protected until the next other call sweeps them). Raises NotFound naming an
        unknown pool, InvalidArgument for a pool named twice; nothing is answered then. Empty ``token_ids``:
        0 cached in every pool (a Match of no tokens finds 0 too)."""
        if len(set(pool_ids)) != len(pool_ids):
            raise InvalidArgument(f"a pool id appears twice in one ProbePrefix: {list(pool_ids)}")
        with self.lock:
            pools = [self._pool(pid) for pid in pool_ids] if pool_ids else [self.pools[k] for k in sorted(self.pools)]
            return [pool.probe(namespace, token_ids) for pool in pools]

    def _status(self, pool: Pool) -> PoolStatus:
        c = pool.counters()
        caps = ", ".join(f"{m.worker_id}={m.capacity_tokens}" for m in pool.members)
        derivation = (
            f"fundable {c.fundable} = available {c.available} + evictable {c.evictable}; "
            f"capacity {c.capacity} = min over members ({caps}) floored to pages of {pool.page_size}; "
            f"protected {c.protected} and owned {c.owned} are not fundable"
        )
        return PoolStatus(pool.pool_id, pool.page_size, pool.members, c, len(pool.requests),
                          pool.match_query_tokens, pool.match_hit_tokens, c.fundable, derivation)

    def events_since(self, pool_id: str, sequence: int, timeout: float = 0.0) -> list[PrefixEvent]:
        """Retained events of a pool after ``sequence`` (waits up to ``timeout`` s for new ones)."""
        with self.lock:
            self._pool(pool_id)
            log = self.events[pool_id]
        return log.since(sequence, timeout)

    def check_integrity(self, pool_id: str) -> list[str]:
        """Violated invariants of the pool and of its request bookkeeping; empty when healthy."""
        with self.lock:
            self._sweep()
            pool = self._pool(pool_id)
            violations = integrity.check(pool)
            for (sid, rid) in pool.requests:
                session = self.sessions.live.get(sid)
                if session is None or session.requests.get(rid) != pool_id:
                    violations.append(f"request {rid!r} of session {sid} is in pool {pool_id!r} but not in its session")
            for session in self.sessions.live.values():
                for rid, where in session.requests.items():
                    if where == pool_id and (session.session_id, rid) not in pool.requests:
                        violations.append(f"session {session.session_id} lists request {rid!r} that pool {pool_id!r} lacks")
            return violations
