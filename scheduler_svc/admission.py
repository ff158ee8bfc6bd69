"""Admission arithmetic on the cache service's counters (receipts), as in SGLang's PrefillAdder.

fundable = available + evictable (what an allocation with the cache's relief ladder can pay).
Running requests still need their unwritten prompt tokens plus their remaining new tokens, the latter
estimated with a decaying new-token ratio (most requests stop well before max_new_tokens). A request is
admitted when its cost fits in ``fundable - reserved(running) - charged(this round)``. The check is made
on the counters of the Match receipt *after* its prefix was locked (a locked prefix stops being
evictable). Every admission of the round is charged to a ledger, reset at the next round (lessons 1, 2).

"No counters" (the cache did not answer) is not a budget of 0: ``Ledger`` cannot be built without
counters, and the loop does not admit until it has them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Protocol

# A long max_new_tokens is clipped in the estimate (SGLang's CLIP_MAX_NEW_TOKENS_ESTIMATION).
CLIP_MAX_NEW_TOKENS = 4096


class CountersLike(Protocol):
    available: int
    evictable: int
    capacity: int


class RunningLike(Protocol):
    pending_tokens: int
    remaining_new_tokens: int


def fundable(c: CountersLike) -> int:
    """Tokens an allocation can be paid with now: available + evictable."""
    return int(c.available) + int(c.evictable)


class NewTokenRatio:
    """Fraction of a request's remaining max_new_tokens that admission reserves.

    Starts at ``init``; every decode step lowers it by ``decay`` down to ``floor`` (it is retired by
    decay, lessons 4); a retract raises it to ``max(init, 1.5 * ratio)`` capped at 1.
    """

    def __init__(self, init: float = 0.7, floor: float = 0.1, decay_steps: int = 600) -> None:
        if not 0 < floor <= init <= 1:
            raise ValueError(f"need 0 < floor <= init <= 1, got floor={floor} init={init}")
        self.init, self.floor = init, floor
        self.decay = (init - floor) / decay_steps
        self.value = init

    def on_decode_step(self) -> None:
        self.value = max(self.floor, self.value - self.decay)

    def on_retract(self) -> None:
        self.value = min(1.0, max(self.init, 1.5 * self.value))


def future_tokens(pending_tokens: int, remaining_new_tokens: int, ratio: float) -> int:
    """Slots a request will still take: its unwritten tokens plus ceil(ratio * clipped remaining new tokens)."""
    return pending_tokens + math.ceil(min(max(remaining_new_tokens, 0), CLIP_MAX_NEW_TOKENS) * ratio)


def reserved_for_running(running: Iterable[RunningLike], ratio: float) -> int:
    """Sum of ``future_tokens`` of running requests (tokens)."""
    return sum(future_tokens(r.pending_tokens, r.remaining_new_tokens, ratio) for r in running)


@dataclass(frozen=True)
class Decision:
    """An admission answer with the numbers it was derived from (all tokens)."""

    admit: bool
    cost: int          # what had to fit now
    estimate: int      # what is charged to the round (extend + decode estimate)
    fundable: int
    reserved: int
    charged: int

    @property
    def remaining(self) -> int:
        return self.fundable - self.reserved - self.charged


class Ledger:
    """Charges of one scheduling round. ``reserved`` is what requests running before the round still need."""

    def __init__(self, reserved: int) -> None:
        self.reserved = reserved
        self.charged = 0
        self.admitted = 0

    def decide(self, counters: CountersLike, extend_tokens: int, remaining_new_tokens: int, ratio: float,
               pool_idle: bool) -> Decision:
        """Whether a request fits, judged on ``counters`` read after its prefix was locked.

        ``extend_tokens``: tokens it will write now (prompt minus the locked prefix). When the pool is
        otherwise idle (nothing running, nothing admitted this round), only the extend itself must fit:
        the decode estimate must not keep a lone request out forever; a retract handles the rest.
        """
        estimate = future_tokens(extend_tokens, remaining_new_tokens, ratio)
        lone = pool_idle and self.admitted == 0
        cost = extend_tokens if lone else estimate
        fund = fundable(counters)
        admit = cost <= fund - self.reserved - self.charged
        return Decision(admit, cost, estimate, fund, self.reserved, self.charged)

    def charge(self, decision: Decision) -> None:
        """Records an admitted request: its estimate is charged against the rest of the round."""
        if not decision.admit:
            raise ValueError("cannot charge a refused admission")
        self.charged += decision.estimate
        self.admitted += 1
