"""Plain input and result types of the cache (frozen dataclasses); the servicer converts protobuf to these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class Member:
    """A worker (tensor-parallel rank) backing a pool: id, boot epoch, usable KV slots it reported."""

    worker_id: str
    epoch: str
    capacity_tokens: int


@dataclass(frozen=True)
class MatchItem:
    """Match ``token_ids`` in ``namespace``; ``lock`` registers ``request_id`` and locks the match;
    ``max_match_tokens`` caps the matched length (0 = no cap)."""

    request_id: str
    namespace: str
    token_ids: tuple[int, ...]
    lock: bool
    max_match_tokens: int = 0
    allocate_up_to: int = 0  # lock only: allocate min(compute_tokens - cached, this) slots when free (0: none)
    compute_tokens: int = 0


@dataclass(frozen=True)
class MatchResult:
    """cached_tokens (whole pages) and the slot ids holding them (length cached_tokens)."""

    request_id: str
    cached_tokens: int
    slot_ids: tuple[int, ...]
    allocated_slot_ids: tuple[int, ...] = ()  # MatchItem.allocate_up_to: the new slots (empty: none allocated)


class AllocResult(NamedTuple):
    """Slot ids for the request's next positions, in position order. (A NamedTuple: immutable, and cheap to
    build 256 times per decode step.)"""

    request_id: str
    slot_ids: tuple[int, ...]


@dataclass(frozen=True)
class CacheItem:
    """The request's computed tokens (prompt + output whose KV was written); finished releases it."""

    request_id: str
    token_ids: tuple[int, ...]
    finished: bool


@dataclass(frozen=True)
class CacheResult:
    """already_cached_tokens: part of the inserted prefix that was in the tree (its duplicates were freed);
    inserted_tokens: newly stored; freed_tokens: slots returned to the pool (whole pages);
    prefix_slot_ids: (not finished) the slots the request reads its prefix from now."""

    request_id: str
    already_cached_tokens: int
    inserted_tokens: int
    freed_tokens: int
    prefix_slot_ids: tuple[int, ...]


@dataclass(frozen=True)
class PoolProbe:
    """One pool's answer to a read-only probe: ``cached_tokens`` (whole pages, what a Match of the same tokens
    would find uncapped), the members' epochs in member order, ``fundable_tokens`` (available + evictable),
    ``capacity`` (tokens) and ``page_size``."""

    pool_id: str
    epochs: tuple[str, ...]
    cached_tokens: int
    fundable_tokens: int
    capacity: int
    page_size: int


# ---- outcomes of CacheCore operations ------------------------------------------------------------
from cache_svc.receipts import Counters, EvictionReceipt, Receipt  # noqa: E402


@dataclass(frozen=True)
class RegisterOutcome:
    receipt: Receipt
    flushed: bool
    capacity: int
    page_size: int
    reserved_slot: int


@dataclass(frozen=True)
class SessionOutcome:
    session_id: str
    replaced_session_id: str
    released_requests: int


@dataclass(frozen=True)
class MatchOutcome:
    receipt: Receipt
    results: tuple[MatchResult, ...]
    allocation: Receipt | None = None  # items with allocate_up_to; before = the match receipt's after


@dataclass(frozen=True)
class AllocateOutcome:
    receipt: Receipt
    results: tuple[AllocResult, ...]
    relief: EvictionReceipt | None


@dataclass(frozen=True)
class CacheOutcome:
    receipt: Receipt
    results: tuple[CacheResult, ...]


@dataclass(frozen=True)
class ReleaseOutcome:
    receipt: Receipt
    freed_tokens: int


@dataclass(frozen=True)
class EvictOutcome:
    receipt: Receipt
    eviction: EvictionReceipt


@dataclass(frozen=True)
class PoolStatus:
    """Read-only view of a pool. ``fundable`` = available + evictable is the admission budget of
    the group (capacity is already the minimum over members); ``budget_derivation`` says how."""

    pool_id: str
    page_size: int
    members: tuple[Member, ...]
    counters: Counters
    requests: int
    match_query_tokens: int
    match_hit_tokens: int
    fundable: int
    budget_derivation: str
