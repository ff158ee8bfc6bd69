"""Hypothesis state machine over CacheCore: random sequences of match-and-lock, allocate, cache, release,
evict, flush, epoch change, session change, lease expiry and op-id retries.

After every step: integrity.check is empty (counters add up, no page in two places, lock refs, evictable ==
what evict(inf) releases on a copy), every slot the tree maps holds the KV of exactly that prefix (a model
of what the worker wrote), and the model's requests equal the pool's. Every eviction receipt's freed_tokens
equals the measured change in allocatable slots.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cache_svc.core import CacheCore
from cache_svc.errors import FailedPrecondition, ResourceExhausted
from cache_svc.items import CacheItem, MatchItem, Member

TOKENS = st.lists(st.integers(0, 2), max_size=10)
NAMESPACES = st.sampled_from(["", "salt"])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class ModelReq:
    namespace: str
    seq: list[int]     # tokens at positions 0.. (the request's prompt + outputs)
    length: int        # positions with slots
    prefix: int        # positions covered by the locked tree prefix
    slots: list[int]   # the slot of each position (what the worker's slot table holds): never remapped


class CacheMachine(RuleBasedStateMachine):
    LEASE = 10.0

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.core = CacheCore(lease_seconds=self.LEASE, clock=self.clock)
        self.kv: dict[int, tuple[str, tuple[int, ...]]] = {}  # slot -> (namespace, prefix ending at it)
        self.reqs: dict[str, ModelReq] = {}
        self.n = 0
        self.epoch = 0
        self.last: tuple | None = None  # (method name, args, outcome) of the last mutating call

    # ---- helpers -------------------------------------------------------------------------------
    def op(self) -> str:
        return uuid.uuid4().hex

    @property
    def pool(self):
        return self.core.pools["p"]

    def register(self) -> None:
        self.epoch += 1
        out = self.core.register_pool(self.op(), "p", self.page_size,
                                      [Member("w0", f"e{self.epoch}", self.capacity), Member("w1", f"e{self.epoch}", self.capacity + 3)])
        assert out.flushed and out.capacity == self.capacity
        self.kv.clear()
        self.reqs.clear()

    def check_slots(self, namespace: str, tokens, slots) -> None:
        for i, s in enumerate(slots):
            assert self.kv.get(s) == (namespace, tuple(tokens[: i + 1])), f"slot {s} does not hold prefix {tokens[:i + 1]}"

    # ---- rules ---------------------------------------------------------------------------------
    @initialize(page_size=st.sampled_from([1, 2, 4]), pages=st.integers(2, 10))
    def setup(self, page_size: int, pages: int) -> None:
        self.page_size = page_size
        self.capacity = page_size * pages
        self.register()
        self.session = self.core.open_session("sched").session_id

    @rule(ns=NAMESPACES, tokens=TOKENS, cap=st.integers(0, 10))
    def match_and_lock(self, ns: str, tokens: list[int], cap: int) -> None:
        rid = f"r{self.n}"
        self.n += 1
        args = (self.op(), self.session, "p", [MatchItem(rid, ns, tuple(tokens), True, cap)])
        out = self.core.match(*args)
        (res,) = out.results
        assert res.cached_tokens % self.page_size == 0 and (cap == 0 or res.cached_tokens <= cap)
        self.check_slots(ns, tokens, res.slot_ids)
        self.reqs[rid] = ModelReq(ns, list(tokens), res.cached_tokens, res.cached_tokens, list(res.slot_ids))
        self.last = ("match", args, out)

    @rule(ns=NAMESPACES, tokens=TOKENS)
    def match_without_lock(self, ns: str, tokens: list[int]) -> None:
        before = self.pool.counters()
        (res,) = self.core.match(self.op(), self.session, "p", [MatchItem("", ns, tuple(tokens), False)]).results
        self.check_slots(ns, tokens, res.slot_ids)
        assert self.pool.counters() == before and len(self.pool.requests) == len(self.reqs)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def allocate(self, data) -> None:
        rids = data.draw(st.lists(st.sampled_from(sorted(self.reqs)), min_size=1, unique=True))
        items = [(rid, data.draw(st.integers(0, 5), label=f"n[{rid}]")) for rid in rids]
        args = (self.op(), self.session, "p", items)
        try:
            out = self.core.allocate(*args)
        except ResourceExhausted as err:
            s = err.shortfall
            c = self.pool.counters()
            assert s.available == c.available < s.asked_tokens and s.still_evictable == c.evictable == 0
            for rid in rids:
                assert self.pool.requests[(self.session, rid)].length == self.reqs[rid].length
            return
        for (rid, n), res in zip(items, out.results):
            req = self.reqs[rid]
            assert len(res.slot_ids) == n
            while len(req.seq) < req.length + n:
                req.seq.append(data.draw(st.integers(0, 2), label="new token"))
            for i, slot in enumerate(res.slot_ids):
                pos = req.length + i
                self.kv[slot] = (req.namespace, tuple(req.seq[: pos + 1]))  # the worker writes KV here
            req.length += n
            req.slots += res.slot_ids
        assert out.receipt.delivered_tokens == out.receipt.asked_tokens == sum(n for _, n in items)
        self.last = ("allocate", args, out)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), finished=st.booleans())
    def cache(self, data, finished: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        req = self.reqs[rid]
        k = data.draw(st.integers(req.prefix, req.length), label="computed")
        args = (self.op(), self.session, "p", [CacheItem(rid, tuple(req.seq[:k]), finished)])
        out = self.core.cache_requests(*args)
        (res,) = out.results
        aligned = k - k % self.page_size
        if finished:
            assert res.already_cached_tokens + res.inserted_tokens == aligned
            del self.reqs[rid]
        else:
            self.check_slots(req.namespace, req.seq, res.prefix_slot_ids)
            # never remapped: the prefix it reads is the slots it matched and wrote (the worker is not told)
            assert list(res.prefix_slot_ids) == req.slots[: len(res.prefix_slot_ids)]
            if res.inserted_tokens or res.already_cached_tokens == aligned == len(res.prefix_slot_ids):
                assert res.already_cached_tokens + res.inserted_tokens == aligned == len(res.prefix_slot_ids)
                assert res.freed_tokens == 0
                req.prefix = aligned
            else:  # the tree holds more of these tokens than its prefix: nothing changed for it
                assert res.inserted_tokens == res.freed_tokens == 0 and len(res.prefix_slot_ids) == req.prefix
        self.last = ("cache", args, out)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def release(self, data) -> None:
        rids = data.draw(st.lists(st.sampled_from(sorted(self.reqs)), min_size=1, unique=True))
        args = (self.op(), self.session, "p", rids)
        out = self.core.release_requests(*args)
        for rid in rids:
            del self.reqs[rid]
        self.last = ("release", args, out)

    @rule(n=st.integers(0, 12), everything=st.booleans())
    def evict(self, n: int, everything: bool) -> None:
        alloc = self.pool.allocator
        free0 = alloc.free_pages
        evictable0 = self.pool.counters().evictable
        if everything:
            e = self.core.flush(self.op(), "p").eviction
        else:
            e = self.core.evict(self.op(), "p", n).eviction
        p = self.page_size
        assert e.freed_tokens == (alloc.free_pages - free0) * p, "eviction receipt != change in allocatable"
        released = e.freed_tokens
        if everything or n >= evictable0:
            assert released == evictable0 and self.pool.counters().evictable == 0
        else:
            assert released >= n

    @rule(kind=st.sampled_from(["epoch", "session", "lease"]), really=st.integers(0, 3))
    def disruption(self, kind: str, really: int) -> None:
        """Epoch change, session replacement or lease expiry (one step in four draws one)."""
        if really:
            return
        {"epoch": self.epoch_change, "session": self.session_change, "lease": self.lease_expires}[kind]()

    def epoch_change(self) -> None:
        old = list(self.reqs)
        self.register()
        for rid in old[:1]:
            try:
                self.core.release_requests(self.op(), self.session, "p", [rid])
            except FailedPrecondition:
                pass  # expected: the flush dropped it
            else:
                raise AssertionError("a request survived an epoch flush")
        assert self.pool.counters().available == self.capacity

    def session_change(self) -> None:
        out = self.core.open_session("sched")
        assert out.replaced_session_id == self.session and out.released_requests == len(self.reqs)
        self.session = out.session_id
        self.reqs.clear()
        assert self.pool.counters().protected == 0 and self.pool.counters().owned == 0

    def lease_expires(self) -> None:
        self.clock.now += self.LEASE + 1
        self.core.pool_status("p")  # any call sweeps
        assert self.pool.counters().protected == 0 and self.pool.counters().owned == 0
        try:
            self.core.renew_session(self.session)
        except FailedPrecondition:
            pass
        else:
            raise AssertionError("an expired session was renewed")
        self.reqs.clear()
        self.session = self.core.open_session("sched").session_id

    @precondition(lambda self: self.last is not None)
    @rule()
    def retry_last_op(self) -> None:
        name, args, first = self.last
        before = self.pool.counters()
        try:
            again = getattr(self.core, {"match": "match", "allocate": "allocate", "cache": "cache_requests",
                                        "release": "release_requests"}[name])(*args)
        except FailedPrecondition:
            return  # the session of that op ended since; a stale session is refused, nothing changes
        assert again.receipt.replayed and again.receipt == first.receipt.__class__(**{**first.receipt.__dict__, "replayed": True})
        assert again.results == first.results if hasattr(first, "results") else True
        assert self.pool.counters() == before

    # ---- invariants ----------------------------------------------------------------------------
    @invariant()
    def integrity_holds(self) -> None:
        if not hasattr(self, "page_size"):
            return
        assert self.core.check_integrity("p") == []
        c = self.pool.counters()
        assert c.available + c.cached + c.owned == c.capacity == self.capacity

    @invariant()
    def tree_maps_prefixes_to_their_kv(self) -> None:
        if not hasattr(self, "page_size"):
            return
        tree = self.pool.tree
        for node in tree.nodes():
            key, value = tree.path_key(node)
            self.check_slots(node.namespace, key, value)

    @invariant()
    def model_requests_equal_pool_requests(self) -> None:
        if not hasattr(self, "page_size"):
            return
        assert {rid for (_, rid) in self.pool.requests} == set(self.reqs)
        for rid, m in self.reqs.items():
            r = self.pool.requests[(self.session, rid)]
            assert (r.length, r.prefix_len) == (m.length, m.prefix)
