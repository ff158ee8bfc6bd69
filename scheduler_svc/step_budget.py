"""Adaptive decode steps: how many steps the next decode Forward may run, from the arrivals the loop took and
the step time it measured (``--adaptive-steps``, on by default with ``--decode-steps K`` > 1).

An arrival that comes while decode Forward N runs has its extend sent to run right after N (``scheduler.py``,
``_chain``), so its first token waits for the rest of N: k·s / 2 on average for a Forward of k steps of s
seconds (and one that comes while the loop drains waits for the whole Forward queued behind N). With arrivals
at rate λ (a mean gap G = 1/λ), a Forward of k steps sees λ·k·s arrivals, each waiting k·s / 2 on average:
arrivals wait λ·(k·s)² / 2 seconds in all behind one Forward. Fewer steps cost the running requests: every
Forward has a fixed cost (the worker's per-Forward host work and read-back, the loop's allocate / build /
apply; on the H200 at 64 requests one step per Forward took 8.33 ms a token against 3.14 with 8,
bench/README.md run 3), paid by each of the B decoding requests. The rule bounds the arrivals' wait behind one
Forward by a share ``WAIT_SHARE`` of what one step of the running batch is worth (B request-steps, B·s
request-seconds):

    λ·(k·s)² / 2 <= WAIT_SHARE · B · s   <=>   k <= sqrt(2 · WAIT_SHARE · B · G / s)

so k = clamp(round(sqrt(2 · WAIT_SHARE · B · G / s)), 1, K). By Little's law B·G is the mean time L a
request stays in the running set: with WAIT_SHARE = 1/32, k = round(sqrt(L / (16 s))). Frequent arrivals among
few short-lived requests get few steps (an editor's 20 typists, each aborting its last completion: ~200
arrivals/s, L ~ 0.1 s, s = 1.75 ms: 2 steps; 16 requests and 200 probes/s on the simulated worker: 2); a batch
of long requests whose arrivals only replace the ones that finish keeps most of K (c64 on the H200: B = 64, ~47
evenly spread arrivals/s, L ~ 1.4 s, s = 2.8 ms: 6; a burst of them leaves K); no arrival in the window, K.
WAIT_SHARE was chosen on the simulated worker (bench/results/cpu-adaptive-steps): 1/16 first; 1/32 once the
chain went on through admissions (``chain.can_chain``), where it gave a lower TTFT p50/p90 and more decode
tokens/s than before that change at 16 and at 64 decoding under 200 arrivals/s.

λ is counted over a sliding window of the last K² steps (``window_s = K² · s``): n arrivals in it give
G = window_s / (n - 1) (a lone arrival says nothing of a stream: a request alone keeps K; two arrivals give
k = K·sqrt(B/8), so a batch of 8 or more keeps K too), or the time since the last arrival when that is longer:
a burst (64 closed-loop clients answered in one Forward come back together) says nothing of what follows it,
so steps grow back as soon as the silence after it outlasts the burst's gap (for B = 64 and s = 2.3 ms, K after
~16 ms), and K within K² steps of the last arrival at the latest. In a steady Poisson stream the time since the
last arrival passes G a third of the time, which lengthens G by ~1.4x on average (k by ~1.2x). s is an
exponentially weighted mean of the decode replies' ``forward_seconds / steps`` (the worker's own time, waits
excluded); before any reply, K.

``budget_steps`` is the pure rule; ``StepBudget`` keeps the window and the step time (loop thread only) and
takes the time as an argument (``clock`` is only where the loop reads it), so both are deterministic given
their inputs.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable

WAIT_SHARE = 1 / 32  # arrivals' expected wait behind one Forward, as a share of one step of the running batch
STEP_EWMA = 0.25  # weight of the newest decode reply in the measured step time


def budget_steps(arrivals: int, window_s: float, since_last_s: float, step_s: float, batch: int, max_steps: int,
                 wait_share: float = WAIT_SHARE) -> int:
    """Decode steps (1..``max_steps``) for the next Forward of ``batch`` decoding requests, after ``arrivals``
    arrivals in the last ``window_s`` seconds, the last of them ``since_last_s`` seconds ago, at ``step_s``
    seconds a step: ``max_steps`` when fewer than two arrived, nothing was measured (``step_s`` <= 0) or
    nothing decodes; otherwise clamp(round(sqrt(2 · wait_share · batch · G / step_s)), 1, max_steps) with
    G = max(window_s / (arrivals - 1), since_last_s) (the module's docstring derives it; halves round up).
    Raises ValueError for a negative count, window, time or batch."""
    if arrivals < 0 or window_s < 0 or since_last_s < 0 or batch < 0:
        raise ValueError(f"arrivals, window, time since the last and batch must be >= 0 (got {arrivals}, {window_s}, "
                         f"{since_last_s}, {batch})")
    if max_steps <= 1 or arrivals < 2 or step_s <= 0 or batch == 0:
        return max(max_steps, 1)
    gap = max(window_s / (arrivals - 1), since_last_s)
    return max(1, min(max_steps, math.floor(math.sqrt(2.0 * wait_share * batch * gap / step_s) + 0.5)))


class StepBudget:
    """The loop's measurements for ``budget_steps``: arrival times (a window of the last K² steps) and the
    step time. Times are ``clock()`` seconds (``time.monotonic`` unless a test gives another), passed in by
    the caller; ``wait_share``: the rule's WAIT_SHARE (arrival_sim's ``--wait-share`` sweeps it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock, self.wait_share = clock, WAIT_SHARE
        self.step_s = 0.0  # measured seconds per decode step (0: none measured yet)
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

    def measured(self, steps: int, forward_seconds: float) -> None:
        """A decode Forward of ``steps`` steps ran ``forward_seconds`` at the worker (its reply)."""
        if steps > 0 and forward_seconds > 0:
            per_step = forward_seconds / steps
            self.step_s = per_step if self.step_s == 0 else self.step_s + STEP_EWMA * (per_step - self.step_s)

    def steps(self, now: float, batch: int, max_steps: int) -> int:
        """Steps for a decode Forward of ``batch`` requests planned at ``now`` (1..``max_steps``)."""
        if max_steps <= 1:
            return max(max_steps, 1)
        window_s = max_steps * max_steps * self.step_s
        while self._arrivals and self._arrivals[0][0] <= now - window_s:
            self._in_window -= self._arrivals.popleft()[1]
        since_last = now - self._arrivals[-1][0] if self._arrivals else window_s
        return budget_steps(self._in_window, window_s, max(since_last, 0.0), self.step_s, batch, max_steps,
                            self.wait_share)
