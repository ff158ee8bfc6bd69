"""One KV pool: radix tree + page allocator + request ownership + the one allocation routine.

Every path that needs slots (extend, decode, paged or not) goes through ``Pool.allocate``, whose relief
ladder is: evict and check the receipt (what became allocatable), retry; then raise ``ResourceExhausted``
with an ``AllocationShortfall``.
Not thread safe: the caller (``CacheCore``) serialises access.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from cache_svc.allocator import PageAllocator
from cache_svc.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from cache_svc.radix_tree import RadixTree, TreeNode
from cache_svc.receipts import AllocationShortfall, Counters, EvictionReceipt
from cache_svc.items import AllocResult, CacheItem, CacheResult, MatchItem, MatchResult, Member, PoolProbe

RequestKey = tuple[str, str]  # (session_id, request_id)


@dataclass(slots=True)
class RequestState:
    """What the pool knows about one request: its locked node (root when none), the prefix that node
    ends (whole pages), the pages it owns (position order, starting at ``prefix_len``) and how many
    positions have slots (``length``: prefix + allocated tokens)."""

    session_id: str
    request_id: str
    namespace: str
    node: TreeNode
    prefix_tokens: tuple[int, ...]
    prefix_slots: list[int]
    pages: list[int] = field(default_factory=list)
    length: int = 0

    @property
    def prefix_len(self) -> int:
        return len(self.prefix_slots)


class Pool:
    """A KV pool backed by a worker group. Capacity = min over members, floored to whole pages."""

    def __init__(
        self, pool_id: str, page_size: int, members: Sequence[Member],
        on_event: Callable[[str, str, Sequence[int], int], None] | None = None,
    ) -> None:
        """``on_event(kind, namespace, token_ids, num_tokens)`` is told of every prefix "stored" or
        "removed" (token_ids: the full prefix from the root; num_tokens: the node's own length)."""
        if page_size < 1:
            raise InvalidArgument(f"page_size must be >= 1, got {page_size}")
        if not members:
            raise InvalidArgument(f"pool {pool_id!r} needs at least one member")
        for m in members:
            if m.capacity_tokens < page_size:
                raise InvalidArgument(
                    f"member {m.worker_id!r} reports capacity {m.capacity_tokens} < page_size {page_size}"
                )
        self.on_event = on_event
        self.pool_id = pool_id
        self.page_size = page_size
        self.members = tuple(members)
        self.num_pages = min(m.capacity_tokens for m in members) // page_size
        self.tree = RadixTree(page_size)
        self.allocator = PageAllocator(self.num_pages, page_size)
        self.requests: dict[RequestKey, RequestState] = {}
        self.owned_pages = 0
        self.match_query_tokens = 0
        self.match_hit_tokens = 0

    # ---- counters ------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.num_pages * self.page_size

    def counters(self) -> Counters:
        """O(1) snapshot of the pool counters (tokens)."""
        p = self.page_size
        return Counters(
            capacity=self.num_pages * p,
            available=self.allocator.free_pages * p,
            evictable=self.tree.evictable_size,
            protected=self.tree.protected_size,
            owned=self.owned_pages * p,
        )

    # ---- requests ------------------------------------------------------------------------------
    def request(self, session_id: str, request_id: str) -> RequestState:
        """Raises NotFound when the request is not registered in this pool for this session."""
        req = self.requests.get((session_id, request_id))
        if req is None:
            raise NotFound(
                f"request {request_id!r} is not registered in pool {self.pool_id!r} for this session "
                "(register it with Match(lock=true) first)"
            )
        return req

    def slots_of(self, req: RequestState, start: int, end: int) -> list[int]:
        """Slot ids of positions [start, end) of an owned range (start >= prefix_len, end <= length)."""
        p, base = self.page_size, req.prefix_len
        if p == 1:
            return req.pages[start - base : end - base]
        return [req.pages[(i - base) // p] * p + (i - base) % p for i in range(start, end)]

    def _free_pages(self, pages: list[int]) -> None:
        self.allocator.free(pages)
        self.owned_pages -= len(pages)

    def _release_slots(self, slots: list[int]) -> None:
        """Tree -> allocator (eviction): every page-start slot names one page."""
        p = self.page_size
        self.allocator.free(list(slots) if p == 1 else [s // p for s in slots[::p]])

    # ---- match ---------------------------------------------------------------------------------
    def match(self, session_id: str, items: Sequence[MatchItem]) -> list[MatchResult]:
        """Longest cached prefix per item (whole pages, capped by max_match_tokens when > 0); items with
        ``lock`` lock it and register the request (the caller checked the id is new in the session)."""
        for item in items:
            if item.max_match_tokens < 0:
                raise InvalidArgument(f"max_match_tokens must be >= 0, got {item.max_match_tokens}")
            if item.lock and (session_id, item.request_id) in self.requests:
                raise FailedPrecondition(f"request {item.request_id!r} is already registered in pool {self.pool_id!r}")
        results = []
        for item in items:
            key = item.token_ids[: item.max_match_tokens] if item.max_match_tokens > 0 else item.token_ids
            slots, node = self.tree.match(item.namespace, key)
            if item.lock:
                self.tree.lock(node)
                self.requests[(session_id, item.request_id)] = RequestState(
                    session_id, item.request_id, item.namespace, node,
                    tuple(item.token_ids[: len(slots)]), slots, [], len(slots),
                )
                self.match_query_tokens += len(item.token_ids)
                self.match_hit_tokens += len(slots)
            results.append(MatchResult(item.request_id, len(slots), tuple(slots)))
        return results

    def probe(self, namespace: str, token_ids: Sequence[int]) -> PoolProbe:
        """Read-only: the longest cached prefix of ``token_ids`` (whole pages, as ``match`` finds it without a
        cap), the members' epochs and the budget. Changes nothing: no lock ref, no split, no access time, no
        match statistics. Empty ``token_ids``: 0 cached."""
        c = self.counters()
        return PoolProbe(self.pool_id, tuple(m.epoch for m in self.members), self.tree.peek(namespace, token_ids),
                         c.fundable, c.capacity, self.page_size)

    # ---- the one allocation routine ------------------------------------------------------------
    def pages_needed(self, req: RequestState, num_tokens: int) -> int:
        """New pages ``num_tokens`` more positions need: the partial last page is filled first."""
        room = len(req.pages) * self.page_size - (req.length - req.prefix_len)
        return -(-max(0, num_tokens - room) // self.page_size)

    def allocate(self, session_id: str, items: Sequence[tuple[str, int]]) -> tuple[list[AllocResult], EvictionReceipt | None]:
        """Allocates ``num_tokens`` new positions for each (request_id, num_tokens), all or nothing.

        Returns (slot ids per request in item order, the relief ladder's receipt or None when not needed).
        Raises InvalidArgument (negative count, duplicate id), NotFound (unknown request), ResourceExhausted
        (after the relief ladder; no request changed, but relief evictions stay done and are reported).
        """
        p = self.page_size
        plan: list[tuple[RequestState, int, int]] = []
        seen: set[str] = set()
        need = 0
        for request_id, n in items:
            if n < 0:
                raise InvalidArgument(f"request {request_id!r}: num_tokens must be >= 0, got {n}")
            if request_id in seen:
                raise InvalidArgument(f"request {request_id!r} appears twice in one Allocate")
            seen.add(request_id)
            req = self.request(session_id, request_id)
            k = n if p == 1 else self.pages_needed(req, n)
            plan.append((req, n, k))
            need += k
        relief = None
        if need > self.allocator.free_pages:
            relief, freed_by_eviction = self._relieve(need)
            if need > self.allocator.free_pages:
                raise ResourceExhausted(self._shortfall(need, freed_by_eviction, relief))
        pages = self.allocator.allocate(need)
        assert pages is not None, "free_pages promised more than allocate paid"
        self.owned_pages += need
        results = []
        offset = 0
        for req, n, k in plan:
            new = pages[offset : offset + k]
            offset += k
            req.pages.extend(new)
            start = req.length
            req.length += n
            slots = tuple(new) if p == 1 else tuple(self.slots_of(req, start, req.length))
            results.append(AllocResult(req.request_id, slots))
        return results, relief

    def allocate_free(self, session_id: str, request_id: str, n: int) -> tuple[int, ...]:
        """``n`` new positions for one registered request when the free pages pay them (no eviction: the caller
        may still decide not to admit it); their slot ids, or () when ``n`` is 0 or the free pages are short."""
        if n <= 0:
            return ()
        req = self.request(session_id, request_id)
        need = n if self.page_size == 1 else self.pages_needed(req, n)
        if need > self.allocator.free_pages:
            return ()
        results, relief = self.allocate(session_id, [(request_id, n)])
        assert relief is None, "free pages paid it: no relief"
        return results[0].slot_ids

    def _relieve(self, need_pages: int) -> tuple[EvictionReceipt, int]:
        """Relief ladder: evict what is short and check what became allocatable. Returns (receipt, tokens
        eviction made allocatable)."""
        p = self.page_size
        before = self.counters()
        short = need_pages - self.allocator.free_pages
        nodes = self._evict_nodes(short * p) if short > 0 else 0
        after = self.counters()
        receipt = EvictionReceipt(
            asked_tokens=max(0, short) * p,
            freed_tokens=after.available - before.available,
            nodes_evicted=nodes,
            before=before,
            after=after,
        )
        return receipt, receipt.freed_tokens

    def _shortfall(self, need_pages: int, freed: int, relief: EvictionReceipt) -> AllocationShortfall:
        c = self.counters()
        asked = need_pages * self.page_size
        reason = (
            f"needed {asked} tokens ({need_pages} pages of {self.page_size}); "
            f"eviction freed {freed} (asked {relief.asked_tokens}); now available {c.available}; "
            f"the rest is protected by locks ({c.protected}) or owned by running requests ({c.owned})"
        )
        if c.evictable > 0:
            reason += f"; {c.evictable} tokens are still reported evictable but eviction could not free them"
        return AllocationShortfall(self.pool_id, asked, freed, c.evictable, c.available, reason, c)

    # ---- cache / release -----------------------------------------------------------------------
    def cache(self, session_id: str, items: Sequence[CacheItem]) -> list[CacheResult]:
        """Inserts each request's computed prefix (whole pages of ``token_ids``) and frees its duplicate slots.

        finished: unlock and free everything else the request owns, forget it. Not finished (a running request
        whose prompt should be visible to probes while it decodes): never remaps, because the worker keeps the
        request's slot table and is not told. When the tree holds no more of these tokens than the request's
        locked prefix, its written whole pages move into the tree (they are the slots it reads already), the new
        node is locked, the old one unlocked, the uncached tail (partial page and beyond) stays owned. When the
        tree holds more (another request inserted the same tokens since this one matched), nothing changes for
        it: its own slots stay its K/V, inserted_tokens is 0, already_cached_tokens says what the tree holds, and
        its tokens are inserted when it finishes. Either way ``prefix_slot_ids`` are the slots the request
        already reads its prefix from (its matched prefix and the slots it wrote).
        Raises NotFound, InvalidArgument (more tokens than slots, fewer than the prefix, prefix mismatch,
        duplicate ids); validation happens before any change.
        """
        seen: set[str] = set()
        plan = []
        for item in items:
            if item.request_id in seen:
                raise InvalidArgument(f"request {item.request_id!r} appears twice in one CacheRequests")
            seen.add(item.request_id)
            req = self.request(session_id, item.request_id)
            n = len(item.token_ids)
            if n > req.length:
                raise InvalidArgument(f"request {item.request_id!r}: {n} token ids but only {req.length} slots allocated")
            if n < req.prefix_len or tuple(item.token_ids[: req.prefix_len]) != req.prefix_tokens:
                raise InvalidArgument(
                    f"request {item.request_id!r}: token_ids do not start with its matched prefix of {req.prefix_len} tokens"
                )
            plan.append((req, item))
        results = []
        p = self.page_size
        for req, item in plan:
            aligned = len(item.token_ids) - len(item.token_ids) % p
            key = tuple(item.token_ids[:aligned])
            at = (req.node, req.prefix_len)  # its locked prefix, checked above: the walks start below it
            if not item.finished:
                held = self.tree.peek(req.namespace, key, at)
                if held > req.prefix_len:  # inserting would free its duplicates and remap it: keep its slots
                    results.append(CacheResult(req.request_id, held, 0, 0, tuple(req.prefix_slots)))
                    continue
            slots = req.prefix_slots + self.slots_of(req, req.prefix_len, aligned)
            already, node = self.tree.insert(req.namespace, key, slots, at)
            if self.on_event is not None and aligned > already:
                self.on_event("stored", req.namespace, key, aligned - already)
            assert already >= req.prefix_len, "a locked prefix vanished from the tree"
            assert item.finished or already == req.prefix_len, "a running request's insert would remap its slots"
            first_tree = (already - req.prefix_len) // p
            moved = (aligned - req.prefix_len) // p
            dup = req.pages[:first_tree]
            rest = req.pages[moved:]
            self._free_pages(dup)
            self.owned_pages -= moved - first_tree  # those pages now belong to the tree
            freed = len(dup) * p
            if item.finished:
                self.tree.unlock(req.node)
                self._free_pages(rest)
                freed += len(rest) * p
                del self.requests[(session_id, req.request_id)]
                prefix: tuple[int, ...] = ()
            else:
                self.tree.lock(node)
                self.tree.unlock(req.node)
                req.node = node
                req.prefix_tokens = key
                req.prefix_slots = slots  # already == prefix_len: the path to ``node`` holds exactly these
                req.pages = rest
                prefix = tuple(req.prefix_slots)
            results.append(CacheResult(req.request_id, already, aligned - already, freed, prefix))
        return results

    def release(self, session_id: str, request_ids: Sequence[str]) -> int:
        """Frees each request's uncached slots and unlocks its node; returns tokens freed (whole pages).
        Raises InvalidArgument (duplicate ids) or NotFound before changing anything."""
        if len(set(request_ids)) != len(request_ids):
            raise InvalidArgument("a request id appears twice in one ReleaseRequests")
        reqs = [self.request(session_id, rid) for rid in request_ids]
        return sum(self._drop(req) for req in reqs)

    def release_session(self, session_id: str) -> list[str]:
        """Releases every request of a session; returns their ids."""
        reqs = [r for r in self.requests.values() if r.session_id == session_id]
        for req in reqs:
            self._drop(req)
        return [r.request_id for r in reqs]

    def _drop(self, req: RequestState) -> int:
        self.tree.unlock(req.node)
        freed = len(req.pages) * self.page_size
        self._free_pages(req.pages)
        del self.requests[(req.session_id, req.request_id)]
        return freed

    # ---- eviction --------------------------------------------------------------------------
    def evict(self, num_tokens: float) -> EvictionReceipt:
        """Evicts LRU unlocked leaves until ``num_tokens`` were released from the tree (or none is left).
        ``freed_tokens`` counts the slots that became allocatable."""
        if num_tokens < 0:
            raise InvalidArgument(f"cannot evict {num_tokens} tokens")
        before = self.counters()
        nodes = self._evict_nodes(num_tokens)
        after = self.counters()
        asked = num_tokens if num_tokens != float("inf") else before.evictable
        return EvictionReceipt(
            asked_tokens=int(asked),
            freed_tokens=after.available - before.available,
            nodes_evicted=nodes,
            before=before,
            after=after,
        )

    def _evict_nodes(self, num_tokens: float) -> int:
        _, nodes, removed = self.tree.evict(num_tokens, self._release_slots)
        if self.on_event is not None:
            for node in removed:
                self.on_event("removed", node.namespace, self.tree.path_key(node)[0], len(node.key))
        return nodes

    def clone(self) -> "Pool":
        """An independent deep copy (tree, allocator, requests) for what-if checks."""
        other = Pool(self.pool_id, self.page_size, self.members)
        other.tree, mapping = self.tree.clone()
        other.allocator = self.allocator.clone()
        other.owned_pages = self.owned_pages
        other.match_query_tokens = self.match_query_tokens
        other.match_hit_tokens = self.match_hit_tokens
        for key, req in self.requests.items():
            other.requests[key] = RequestState(
                req.session_id, req.request_id, req.namespace, mapping[req.node.id],
                req.prefix_tokens, list(req.prefix_slots), list(req.pages), req.length,
            )
        return other
