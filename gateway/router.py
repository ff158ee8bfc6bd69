"""Routing policies and the routing decision: which replica a Generate call goes to.

``cache_aware`` (the default) ranks the routable replicas by

    cost = uncached + w_q * queued_tokens + w_r * requests

- ``uncached`` = prompt tokens - predicted cached tokens, where predicted cached = the larger of what the cache
  service's probe found in the replica's pool (0 when its cache did not answer) and the longest common prefix with
  a prompt pending there (gateway.pending: routed, not yet prefilled), in whole pages, capped as the scheduler's
  Match is (the prompt less its last token; 0 for a request collecting prompt logprobs);
- ``queued_tokens`` = the predicted uncached tokens of the gateway's own calls there that have not started yet
  (no first message), + the prompt tokens the others' calls have waiting (the replica's last ``GetLoad``: calls not
  sent by this gateway, ``GetLoadResponse.others``), less the pending prefix this prompt shares (that prefill is
  done once for both: waiting for it is not a cost of going there);
- ``requests`` = the gateway's own calls there that have not ended, started or not (each takes a batch slot),
  + the others' live calls as of that poll. The gateway counts its own calls itself (gateway.pending) and tags
  them with its router id, so no poll can miss or double-count one.

Default weights, and why: ``w_q = 1.0``: a queued prompt token is prefilled before ours, which delays our first
token as much as one of our own uncached tokens; ``w_r = 16.0``: a request in the batch decodes one token per step
next to our prefill, and a decode slot costs about as much step time as prefilling ~16 tokens (a rough figure:
bench/ is where it is tuned). The replica of least cost wins; ties (idle replicas, distinct prompts) go to the tied
replicas in turn from a random start, so neither a burst nor a trickle of requests that each find the replicas
idle piles onto replica 0 (a coin flip per tie would spread a trickle only on average). A hot prefix is copied to a second replica by the same rule: once
its holder's queue cost exceeds the uncached tokens it saves, another replica is cheaper.

``least_load`` is the same cost without the cache term; ``round_robin`` takes the routable replicas in turn. All
three probe the cache (when the replicas have a cache address) so that each decision's predicted cached tokens are
logged and compared with the realized ones.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Sequence

from gateway.cache_probe import CacheProbe, ProbeOutcome
from gateway.pending import PendingTable
from gateway.replicas import Replica, ReplicaSet


class Policy(str, enum.Enum):
    """``--routing`` values."""

    CACHE_AWARE = "cache_aware"
    ROUND_ROBIN = "round_robin"
    LEAST_LOAD = "least_load"


@dataclass(frozen=True)
class Weights:
    """Cost weights (see the module docstring): ``queued_tokens`` = w_q (per queued prompt token), ``requests`` =
    w_r (per request held by the scheduler), both in the unit of one uncached prompt token."""

    queued_tokens: float = 1.0
    requests: float = 16.0


@dataclass(frozen=True)
class Candidate:
    """One replica's terms in a decision (token counts; ``probed`` None when its cache did not answer)."""

    replica: int
    name: str
    probed: int | None
    pending: int
    predicted_cached: int
    uncached: int
    queued_tokens: int
    requests: int
    cost: float

    def terms(self) -> dict:
        """The cost terms, for the decision's log line."""
        return {"replica": self.name, "probed": self.probed, "pending": self.pending,
                "predicted_cached": self.predicted_cached, "uncached": self.uncached,
                "queued_tokens": self.queued_tokens, "requests": self.requests, "cost": round(self.cost, 3)}


@dataclass(frozen=True)
class Decision:
    """A routing decision: ``ranking`` best first (the retry goes to the next one), ``probe_errors`` cache address
    -> why its probe failed (its replicas were routed as 0 cached)."""

    policy: Policy
    prompt_tokens: int
    ranking: tuple[Candidate, ...]
    probe_errors: dict[str, str]

    @property
    def best(self) -> Candidate:
        return self.ranking[0]


class Router:
    """Decides for one prompt at a time (``decide``); handed the replica set, the pending table, the cache probe,
    the policy, the weights and a random generator (seeded in tests)."""

    def __init__(self, replicas: ReplicaSet, pending: PendingTable, probe: CacheProbe, policy: Policy,
                 weights: Weights = Weights(), rng: random.Random | None = None) -> None:
        self.replicas, self.pending, self.probe = replicas, pending, probe
        self.policy, self.weights = policy, weights
        self.rng = rng or random.Random()
        self._turn = 0  # round robin's position
        self._tie_turn = self.rng.randrange(1 << 16)  # whose turn it is among tied replicas

    async def decide(self, namespace: str, ids: Sequence[int], uses_cache: bool = True) -> Decision:
        """Ranks the routable replicas for a prompt of token ``ids`` in ``namespace``; ``uses_cache`` False for a
        request that matches nothing at the scheduler (it collects prompt logprobs): 0 cached everywhere. Raises
        ApiError 503 (naming every replica's state) when none is routable."""
        routable = self.replicas.routable()
        if not routable:
            raise self.replicas.all_down()
        outcome = await self.probe.probe(namespace, ids, routable)
        candidates = [self._candidate(r, namespace, ids, outcome, uses_cache) for r in routable]
        if self.policy is Policy.ROUND_ROBIN:
            start = self._turn % len(candidates)
            self._turn += 1
            ranking = candidates[start:] + candidates[:start]
        else:
            self.rng.shuffle(candidates)  # the order among equal costs below the best: random (the sort is stable)
            ranking = sorted(candidates, key=lambda c: c.cost)
            tied = sorted((c for c in ranking if c.cost == ranking[0].cost), key=lambda c: c.replica)
            if len(tied) > 1:  # the best among equals: in turn, from a random start
                best = tied[self._tie_turn % len(tied)]
                self._tie_turn += 1
                ranking = [best] + [c for c in ranking if c is not best]
        return Decision(self.policy, len(ids), tuple(ranking), outcome.errors)

    def _candidate(self, r: Replica, namespace: str, ids: Sequence[int], outcome: ProbeOutcome,
                   uses_cache: bool) -> Candidate:
        probed = outcome.cached.get(r.index)
        pending = self.pending.matched_tokens(namespace, ids, r.index, r.page_size)
        # what the scheduler's Match will find: at most the prompt less its last token, in whole pages (a full hit
        # still computes one token), nothing for a request that does not use the cache
        cap = (len(ids) - 1) - (len(ids) - 1) % r.page_size if uses_cache and len(ids) >= 2 else 0
        predicted = min(max(probed or 0, pending), cap)
        uncached = len(ids) - predicted
        shared = max(0, pending - (probed or 0))
        # the gateway's own calls there, counted exactly, + the others' calls as of the last poll
        queued = max(0, r.load.others_waiting_tokens + self.pending.unstarted_tokens(r.index) - shared)
        requests = r.load.others_requests + self.pending.in_flight(r.index)
        load_cost = self.weights.queued_tokens * queued + self.weights.requests * requests
        cost = load_cost + (uncached if self.policy is Policy.CACHE_AWARE else 0)
        return Candidate(r.index, r.name, probed, pending, predicted, uncached, queued, requests, cost)
