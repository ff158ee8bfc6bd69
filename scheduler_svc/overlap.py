"""Overlapped decode (SGLang's overlap scheduler, over our services): during steady decode the loop sends
decode Forward N+1 before it processes Forward N's reply, so the worker computes N+1 while the loop
allocates, detokenizes and streams N's tokens.

N+1 holds the same running requests, with slots allocated ahead from the cache; each item's input is the
token the worker sampled last for it (``input_from_last_sample``, unknown to the scheduler yet) at the
predicted position ``start + steps`` of its N entry, and the Forward carries ``after_seq = N.seq`` so the
worker runs it only after N. A request predicted to reach max_new_tokens (already capped by the context
limit) in N is left out of N+1; one that ends at a stop token in N is in N+1 and the worker skips it.

Chaining happens only in steady decode (``can_chain``); otherwise the loop drains (waits for and processes
the in-flight reply) and takes the synchronous path (extend, admission, retract, aborts). Requests that
finish while N is processed but are in N+1 stream their end at once and are released at the cache and the
worker after N+1's reply is processed (their N+1 results are dropped): ``Scheduler._zombies``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

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
    """True in steady decode: the in-flight batch is decode, no running request is in PREFILL or has an
    abort pending, and no admission is possible (``waiting`` requests, none or no room)."""
    if inflight.kind != "decode":
        return False
    if waiting and len(running) < max_running:
        return False
    return not any(r.state == State.PREFILL or r.abort_requested for r in running)


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
