"""Arrivals admitted while a Forward runs, held once the worker has extends queued, so a trickling burst is
prefilled in full chunks (issue 15).

While decode Forward N (or an extend at the pipeline's head) runs, the loop admits arrivals into extends sent
behind it (``Scheduler._admit_until``). Sent one per wake-up, a burst that comes in over ~100 ms (a c64 wave:
the gateway reads 64 bodies one after another) became a string of small extends: H100 run 22 call 5 ran 15
extends of 1,024-8,192 tokens (4,000 on average) in 307 ms, at 197k prompt tokens/s, where its 8,192-token
extends ran at ~290k (an eager extend costs ~2 ms of its own, and the worker waited 2-7 ms between them).

``ArrivalGate.open`` admits only while fewer than ``depth`` extends in flight are unanswered (one running, one
queued behind it), or when the waiting requests' tokens fill a whole chunk. A closed gate opens again when one
of those extends is answered (its reply sets the loop's ``wake``: ``watch``; a reply that came between two
windows is caught by ``admit_first`` at the next window's start), and what came in meanwhile goes in one extend.
The held requests start no later than they would have: the worker runs extends in order, so theirs would have
waited behind the queued one anyway. A planning that admitted nothing (the pool could not
fund it) is tried again only after a new arrival or a reply, never in a loop.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable

# Unanswered extends after which arrivals wait for a reply: one on the device, one queued behind it.
QUEUED_EXTENDS = 2


class ArrivalGate:
    """Decides, at each wake-up of one ``_admit_until`` window, whether the waiting requests are planned now.

    ``queued()``: the extends in flight whose reply is not in (counted from the pipeline each time);
    ``waiting_tokens()``: the prompt tokens of the waiting requests (``RequestTable.waiting_tokens``);
    ``chunk_tokens``: the chunk budget (``SchedulerConfig.chunk_size``); ``depth``: ``QUEUED_EXTENDS``, or 0 to
    admit at every wake-up (the gate off). ``wake``: the loop's intake event, set by each watched reply."""

    def __init__(self, queued: Callable[[], int], waiting_tokens: Callable[[], int], chunk_tokens: int, depth: int,
                 wake: threading.Event) -> None:
        self._queued, self._waiting_tokens = queued, waiting_tokens
        self.chunk_tokens, self.depth, self.wake = chunk_tokens, depth, wake
        self._last_queued = queued()

    @classmethod
    def of(cls, pipeline, table, cfg, wake: threading.Event) -> "ArrivalGate":
        """The gate of the loop's ``pipeline`` (``Pipeline``: its extends in flight), ``table`` (``RequestTable``:
        the waiting requests), ``cfg`` (``SchedulerConfig``: ``chunk_size``, ``arrival_gate``) and ``wake``."""
        return cls(lambda: unanswered_extends(pipeline.inflight),
                   table.waiting_tokens, cfg.chunk_size,
                   QUEUED_EXTENDS if cfg.arrival_gate else 0, wake)

    def admit_first(self, admit_now: bool, room: bool) -> bool:
        """Whether a window of ``_admit_until`` tries the waiting requests before it waits: ``admit_now`` (the
        loop's own rule), or, with the gate on, any request waiting with ``room``: one held in an earlier window,
        whose releasing reply came between the two windows, is tried again (``open`` still checks the depth)."""
        return admit_now or (self.depth > 0 and room and self._waiting_tokens() > 0)

    def open(self, arrived: bool, room: bool) -> bool:
        """True when the waiting requests are planned now: something changed since the last look (``arrived``:
        new requests were taken; or an extend in flight was answered), ``room`` in the running set, and the worker
        is not ``depth`` extends deep or a whole chunk waits."""
        if self.depth == 0:  # the gate off: every arrival is planned at once, as before
            return arrived and room
        queued = self._queued()
        replied, self._last_queued = queued < self._last_queued, queued
        if not (arrived or replied) or not room:
            return False
        return queued < self.depth or self._waiting_tokens() >= self.chunk_tokens

    def watch(self, sent):
        """Extend ``sent`` (``Pipeline.send``'s InFlight) went out: its reply wakes the loop
        (``pending.add_done_callback``) and it counts as queued. Returns ``sent``."""
        if self.depth:  # the gate off: replies wake nothing, as before
            self._last_queued += 1
            sent.pending.add_done_callback(self.wake.set)
        return sent


def unanswered_extends(inflight: Iterable) -> int:
    """The extends among ``inflight`` (``Pipeline.inflight``: ``batch.kind``, ``pending.done()``) whose reply is not
    in."""
    return sum(1 for f in inflight if f.batch.kind == "extend" and not f.pending.done())
