"""Adaptive decode steps: how many steps the next decode Forward may run, from the arrivals the loop took and
the costs it measured (``--adaptive-steps``, on by default with ``--decode-steps K`` > 1).

A decode round of k steps keeps the worker busy T = F + k·s seconds: s the device time of one step (the
replies' ``device_seconds / steps``, worker_svc/step_clock.py) and F what a Forward costs there whatever its
steps (the layout, the plan, the read-back, the commit: ``forward_seconds - device_seconds``). The worker runs
one Forward at a time, so T is what an arrival's extend waits behind and what each running request pays per
round; the loop's own work for a round (allocate, build, send) runs while the Forward before it is at the
worker (the chain, ``scheduler.py``: ``_chain``), so it is not in T. Two costs of T, per second of decoding:

- arrivals. One that comes while a round runs has its extend sent to run after it (``scheduler.py``, ``_chain``),
  so its first token waits T/2 on average; at λ arrivals a second (a mean gap G = 1/λ) they wait λ·T/2 seconds
  a second.
- the running requests. Each of the B decoding requests spends the share F/T of its time in the fixed part,
  B·F/T request-seconds a second; weighted by ``RUN_WEIGHT`` (an arrival's wait counts more than a running
  request's: TTFT is what a user waits on, TPOT is spread over the tokens).

λ·T/2 + RUN_WEIGHT·B·F/T is least at T* = sqrt(2·RUN_WEIGHT·B·F·G), so

    k = clamp(round((T* - F) / s), 1, K)

Frequent arrivals, few short requests and a small fixed cost give few steps (16 decoding, 200 arrivals/s on
the simulated worker: 2 ms steps, F ~ 0.3 ms: 1-2); a larger fixed cost keeps more (an editor's 20 typists on
the H200, a tiny model: ~0.8 ms of device time a step, F ~ 2 ms estimated from run 8's first calls; 2.6-2.8 steps
a Forward where the first form of this rule, which took F as a fixed share of s, gave 1.9; TTFT p50 21.3-23.7 ms
against 25.0-28.2 with K = 8 in three alternated runs each, but 30% fewer completions finished before the next
keystroke: bench/README.md run 8), but only up to F = RUN_WEIGHT·B·G/2: past it T* - F falls again (no round is
shorter than F), and from F = 2·RUN_WEIGHT·B·G on T* <= F: 1 step. B·G is the time a request stays in the
running set (Little's law), so long requests keep K. RUN_WEIGHT = 1/8 was chosen on the simulated worker
(bench/results/cpu-adaptive-steps/fixed-cost: 1/8, 1/4, 1/2 at 16 and 64 decoding under 200 arrivals/s), where
it gives about the steps and the TTFT the first form gave there (whose share had been chosen for the best TTFT
p50 / p90).

λ is counted over a sliding window of the last K rounds of K steps (``window_s = K·(F + K·s)``): n arrivals in
it give G = window_s / (n - 1) (a lone arrival says nothing of a stream: a request alone keeps K), or the time
since the last arrival when that is longer: a burst (64 closed-loop clients answered in one Forward come back
together) says nothing of what follows it, so steps grow back as soon as the silence after it outlasts the
burst's gap, and K once the window holds fewer than two arrivals. s and F are exponentially weighted means over
the decode replies; before any reply, K.

``budget_steps`` is the pure rule; ``StepBudget`` keeps the window and the costs (loop thread only) and takes the
time as an argument (``clock`` is only where the loop reads it), so both are deterministic given their inputs.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable

RUN_WEIGHT = 1 / 8  # a running request's second in the fixed part of a round, against an arrival's second of wait
COST_EWMA = 0.25  # weight of the newest decode reply in the measured step and fixed costs


def budget_steps(arrivals: int, window_s: float, since_last_s: float, step_s: float, fixed_s: float, batch: int,
                 max_steps: int, run_weight: float = RUN_WEIGHT) -> int:
    """Decode steps (1..``max_steps``) for the next Forward of ``batch`` decoding requests, after ``arrivals``
    arrivals in the last ``window_s`` seconds, the last of them ``since_last_s`` seconds ago, at ``step_s``
    device seconds a step and ``fixed_s`` seconds a round besides: ``max_steps`` when fewer than two arrived,
    nothing was measured (``step_s`` <= 0) or nothing decodes; otherwise
    clamp(round((sqrt(2 · run_weight · batch · fixed_s · G) - fixed_s) / step_s), 1, max_steps) with
    G = max(window_s / (arrivals - 1), since_last_s) (the module's docstring derives it; halves round up).
    Raises ValueError for a negative count, window, time, cost or batch."""
    if min(arrivals, window_s, since_last_s, fixed_s, batch) < 0:
        raise ValueError(f"arrivals, window, time since the last, fixed cost and batch must be >= 0 (got {arrivals}, "
                         f"{window_s}, {since_last_s}, {fixed_s}, {batch})")
    if max_steps <= 1 or arrivals < 2 or step_s <= 0 or batch == 0:
        return max(max_steps, 1)
    gap = max(window_s / (arrivals - 1), since_last_s)
    best_round_s = math.sqrt(2.0 * run_weight * batch * fixed_s * gap)
    return max(1, min(max_steps, math.floor((best_round_s - fixed_s) / step_s + 0.5)))


def steps_run(entries, results) -> int:
    """The steps the worker ran for a decode Forward: the most ``steps`` of an entry (``batch.Entry``) whose result
    (the reply's ForwardResult, in entry order) was not skipped (a skipped item, a request stopped in the Forward
    before, runs none); 0 when all were."""
    return max((e.steps for e, r in zip(entries, results, strict=True) if not r.skipped), default=0)


class StepBudget:
    """The loop's measurements for ``budget_steps``: arrival times (a window of the last K rounds of K steps),
    the device time of a step and the fixed cost of a round. Times are ``clock()`` seconds (``time.monotonic``
    unless a test gives another), passed in by the caller; ``run_weight``: the rule's RUN_WEIGHT (arrival_sim's
    ``--run-weight`` sweeps it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock, self.run_weight = clock, RUN_WEIGHT
        self.step_s = 0.0  # measured device seconds per decode step (0: none measured yet)
        self.fixed_s = 0.0  # measured seconds of a decode Forward at the worker besides its steps
        self._arrivals: deque[tuple[float, int]] = deque()  # (time, how many arrived then), oldest first
        self._in_window = 0  # sum of the counts in _arrivals

    def arrived(self, now: float, n: int) -> None:
        """``n`` requests were taken from the intake at ``now``."""
        if n > 0:
            self._arrivals.append((now, n))
            self._in_window += n

    def took(self, n: int) -> int:
        """``n`` requests were taken from the intake now (``clock()``); returns ``n``."""
        self.arrived(self.clock(), n)
        return n

    def measured(self, steps: int, reply) -> None:
        """A decode Forward of ``steps`` steps answered ``reply`` (its ForwardResponse; ``device_seconds`` 0: not
        measured, ignored): s from ``device_seconds``, F from ``forward_seconds - device_seconds``."""
        if steps > 0 and reply.device_seconds > 0:
            per_step = reply.device_seconds / steps
            fixed = max(reply.forward_seconds - reply.device_seconds, 0.0)
            if self.step_s == 0:
                self.step_s, self.fixed_s = per_step, fixed
            else:
                self.step_s += COST_EWMA * (per_step - self.step_s)
                self.fixed_s += COST_EWMA * (fixed - self.fixed_s)

    def steps(self, now: float, batch: int, max_steps: int) -> int:
        """Steps for a decode Forward of ``batch`` requests planned at ``now`` (1..``max_steps``)."""
        if max_steps <= 1:
            return max(max_steps, 1)
        window_s = max_steps * (self.fixed_s + max_steps * self.step_s)
        while self._arrivals and self._arrivals[0][0] <= now - window_s:
            self._in_window -= self._arrivals.popleft()[1]
        since_last = now - self._arrivals[-1][0] if self._arrivals else window_s
        return budget_steps(self._in_window, window_s, max(since_last, 0.0), self.step_s, self.fixed_s, batch,
                            max_steps, self.run_weight)
