"""check(pool) -> the list of violated invariants of one pool (empty when healthy).

Invariants:
1. available + cached + owned == capacity, cached == evictable + protected, all >= 0.
2. No page in two places (free list, tree nodes, requests); together they cover every usable page;
   the reserved page is nowhere.
3. Tree shape: no empty node except the root (no tombstones); key and value lengths equal and whole pages;
   each node's slots fill whole pages in order.
4. Locks: lock_ref(parent) >= lock_ref(child); each node's lock_ref equals the number of requests whose
   locked node is in its subtree; evictable_size / protected_size equal the sums over unlocked / locked nodes.
5. ``evictable`` equals what evict(infinity) releases on a copy of the pool, and that copy then has
   available == old available + evictable.
6. Every request's prefix slots equal the tree path of its locked node; its pages cover its positions.
"""

from __future__ import annotations

from collections import Counter as Multiset
from typing import TYPE_CHECKING

from cache_svc.allocator import RESERVED_PAGE

if TYPE_CHECKING:
    from cache_svc.pool import Pool


def check(pool: "Pool") -> list[str]:
    """Returns human-readable violations; never raises for a broken pool (that is what it reports)."""
    v: list[str] = []
    p = pool.page_size
    c = pool.counters()
    tree = pool.tree
    nodes = list(tree.nodes())

    # 1. counters
    if c.available + c.cached + c.owned != c.capacity:
        v.append(f"counters do not add up: available {c.available} + cached {c.cached} "
                 f"+ owned {c.owned} != capacity {c.capacity}")
    for name in ("available", "evictable", "protected", "owned"):
        if getattr(c, name) < 0:
            v.append(f"counter {name} is negative: {getattr(c, name)}")

    # 2. every page in exactly one place
    places: Multiset[int] = Multiset()
    where: dict[int, list[str]] = {}
    def put(page: int, place: str) -> None:
        places[page] += 1
        where.setdefault(page, []).append(place)
    for page in pool.allocator.free_page_ids():
        put(page, "free")
    for node in nodes:
        for s in node.value[::p]:
            put(s // p, f"node {node.id}")
    for req in pool.requests.values():
        for page in req.pages:
            put(page, f"request {req.request_id}")
    for page, n in places.items():
        if n > 1:
            v.append(f"page {page} is in {n} places: {', '.join(where[page])}")
    if RESERVED_PAGE in places:
        v.append(f"reserved page 0 is handed out: {', '.join(where[RESERVED_PAGE])}")
    missing = set(range(1, pool.num_pages + 1)) - set(places)
    if missing:
        v.append(f"{len(missing)} pages are nowhere (leaked), e.g. {sorted(missing)[:5]}")
    if pool.owned_pages != sum(len(r.pages) for r in pool.requests.values()):
        v.append(f"owned_pages {pool.owned_pages} != pages held by requests {sum(len(r.pages) for r in pool.requests.values())}")

    # 3. tree shape
    for node in nodes:
        if not node.value:
            v.append(f"tombstone: node {node.id} has no slots")
        if len(node.key) != len(node.value):
            v.append(f"node {node.id}: key length {len(node.key)} != value length {len(node.value)}")
        if len(node.value) % p:
            v.append(f"node {node.id}: length {len(node.value)} is not whole pages of {p}")
        for i, s in enumerate(node.value):
            if s != node.value[i - i % p] + i % p or node.value[i - i % p] % p:
                v.append(f"node {node.id}: slot {s} at offset {i} breaks page layout")
                break

    # 4. locks
    expected: Multiset[int] = Multiset()
    for req in pool.requests.values():
        n = req.node
        while n is not tree.root:
            expected[n.id] += 1
            n = n.parent
    evictable = protected = 0
    for node in nodes:
        parent = node.parent
        if parent is not tree.root and parent.lock_ref < node.lock_ref:
            v.append(f"lock_ref(parent {parent.id}) {parent.lock_ref} < lock_ref(child {node.id}) {node.lock_ref}")
        if node.lock_ref != expected[node.id]:
            v.append(f"node {node.id}: lock_ref {node.lock_ref} but {expected[node.id]} requests lock it")
        if node.lock_ref == 0:
            evictable += len(node.value)
        else:
            protected += len(node.value)
    if evictable != tree.evictable_size:
        v.append(f"evictable_size {tree.evictable_size} != unlocked tokens in the tree {evictable}")
    if protected != tree.protected_size:
        v.append(f"protected_size {tree.protected_size} != locked tokens in the tree {protected}")

    # 5. evictable == what evict(inf) would release, measured on a copy
    trial = pool.clone()
    try:
        receipt = trial.evict(float("inf"))
    except Exception as exc:  # a broken tree is what this reports; the error is the finding, not defaulted
        v.append(f"evict(inf) on a copy raised {type(exc).__name__}: {exc}")
    else:
        if receipt.freed_tokens != c.evictable:
            v.append(f"evictable reports {c.evictable} but evict(inf) released {receipt.freed_tokens}")
        if trial.counters().available != c.available + c.evictable:
            v.append(f"after evict(inf) available is {trial.counters().available}, "
                     f"not available + evictable = {c.fundable}")

    # 6. requests
    for req in pool.requests.values():
        key, value = tree.path_key(req.node)
        if value != req.prefix_slots or tuple(key) != req.prefix_tokens:
            v.append(f"request {req.request_id}: prefix does not match the tree path of its locked node")
        if req.prefix_len % p:
            v.append(f"request {req.request_id}: prefix length {req.prefix_len} is not whole pages")
        need = -(-(req.length - req.prefix_len) // p)
        if len(req.pages) != need:
            v.append(f"request {req.request_id}: owns {len(req.pages)} pages for {req.length - req.prefix_len} positions")
    return v
