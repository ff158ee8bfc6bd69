"""Overlapped decode (SGLang's overlap scheduler, over our services): during steady decode the loop
allocates decode Forward N+1 while the worker computes N, sends N+1 the moment N's reply is in, and
then processes N's reply (detokenize, stream) while the worker computes N+1.

N+1 holds the same running requests, with slots allocated ahead from the cache; each item's input is the
token the worker sampled last for it (``input_from_last_sample``, unknown to the scheduler yet) at the
predicted position ``start + steps`` of its N entry, and the Forward carries ``after_seq = N.seq`` so the
worker runs it only after N. A request predicted to reach max_new_tokens (already capped by the context
limit) in N is left out of N+1; one that ends at a stop token in N is in N+1 and the worker skips it.

N+1 is sent just in time, not queued behind N: while N runs nothing waits at the worker, so a request that
arrives meanwhile is admitted at once (Match, Allocate while N runs) and its extend is sent to run right
after N (``after_seq = N.seq``; a later arrival's extend after that one), and N+1 goes after the last extend
when N's reply is in. A first token waits for the rest of N (and earlier arrivals' extends) only, never for
a K-step Forward queued behind N. The cost: the reply of N and the send of N+1 are not hidden
(one local gRPC round trip per Forward).

Chaining happens only in steady decode (``can_chain``); otherwise the loop drains (waits for and processes
the in-flight replies, in order) and takes the synchronous path (extend, admission, retract, aborts).
Requests that finish while N is processed but are in a Forward still in flight stream their end at once and
are released at the cache and the worker after the last in-flight Forward that holds them was processed
(their results there are dropped): ``Scheduler._zombies``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from scheduler_svc.batch import Batch, Entry
from scheduler_svc.multistep import multistep_eligible
from scheduler_svc.request import Req, State
from scheduler_svc.worker_client import PendingForward


@dataclass(frozen=True)
class InFlight:
    """A decode Forward sent and not yet processed: its batch, the pending reply, its seq."""

    batch: Batch
    pending: PendingForward
    seq: int


def can_chain(inflight: Batch, running: Sequence[Req], waiting: int, max_running: int) -> bool:
    """True in steady decode: the in-flight batch is decode and holds every running request (one admitted
    while it ran is not in it: its first decode takes the synchronous path), no running request is in
    PREFILL or has an abort pending, and no admission is possible (``waiting`` requests, none or no room)."""
    if inflight.kind != "decode":
        return False
    if waiting and len(running) < max_running:
        return False
    held = {e.req.rid for e in inflight.entries}
    return not any(r.state == State.PREFILL or r.abort_requested or r.rid not in held for r in running)


def wait_reply_or_arrival(pending: PendingForward, wake: threading.Event, arrived: Callable[[], bool]) -> bool:
    """Waits until ``pending``'s reply is in (False) or ``arrived()`` says a request can be admitted (True),
    whichever comes first. ``wake`` is the intake's event (set on every submit and abort); the reply sets it
    too. ``arrived`` runs on this thread after each wake-up."""
    pending.add_done_callback(wake.set)
    while True:
        wake.clear()  # state is read after clearing: a set that comes later wakes the next wait
        if arrived():
            return True
        if pending.done():
            return False
        wake.wait(1.0)  # the reply, a submit or an abort sets it; 1 s only bounds a lost wake-up


def next_steps(req: Req, after: int, max_steps: int) -> int:
    """Decode steps of ``req`` in the next Forward when ``after`` new tokens remain after the in-flight
    one (``after`` > 0): at most ``max_steps`` and ``after``; 1 when it is not multi-step eligible."""
    if max_steps <= 1 or not multistep_eligible(req):
        return 1
    return max(1, min(max_steps, after))


def continuation(inflight: Batch, max_steps: int) -> list[tuple[Entry, int]]:
    """(in-flight entry, decode steps) for each request that continues in the next Forward (one step each
    when any of them is not multi-step eligible): not finished
    (a request finished while an earlier Forward was processed is in ``inflight`` only to be dropped), no
    abort pending, and tokens left after the in-flight entry's (it yields exactly ``steps`` tokens unless
    the request ends at a stop token, which the worker then knows)."""
    if not all(multistep_eligible(e.req) for e in inflight.entries):
        max_steps = 1  # the worker takes a multi-step batch only of eligible items
    plan = []
    for e in inflight.entries:
        req = e.req
        if req.state != State.DECODE or req.abort_requested:
            continue
        after = req.remaining_new_tokens - e.steps
        if after > 0:
            plan.append((e, next_steps(req, after, max_steps)))
    return plan


def continuation_batch(plan: list[tuple[Entry, int]], slots: dict[str, tuple[int, ...]]) -> Batch:
    """The next decode Batch: per request one ``from_last`` entry at ``start + steps`` of its in-flight
    entry, with ``slots[rid]`` (as many as its steps)."""
    return Batch("decode", tuple(Entry(e.req, e.start + e.steps, 1, slots[e.req.rid], True, steps=k, from_last=True)
                                 for e, k in plan))
