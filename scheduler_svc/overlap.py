"""Overlapped decode (SGLang's overlap scheduler, over our services): during steady decode the loop
allocates decode Forward N+1 while the worker computes N and sends it before N's reply is processed, then
processes N's reply (detokenize, stream) while the worker computes N+1.

N+1 holds the same running requests, with slots allocated ahead from the cache; each item's input is the
token the worker sampled last for it (``input_from_last_sample``, unknown to the scheduler yet) at the
predicted position ``start + steps`` of its N entry, and the Forward carries ``after_seq = N.seq`` so the
worker runs it only after N. A request predicted to reach max_new_tokens (already capped by the context
limit) in N is left out of N+1; one that ends at a stop token in N is in N+1 and the worker skips it.

While N runs the loop waits for N's reply or an arrival. A request that arrives with room is admitted at once
(Match, Allocate while N runs) and its extend is sent to run right after N (``after_seq = N.seq``; a later
arrival's extend after that one), so its first token waits for the rest of N, not for N+1's K steps.

When N+1 is sent (``--overlap-mode``, ``overlap_mode.OVERLAP_MODES``):

- ``queued`` (default): at once, so it waits at the worker behind N and starts the moment N ends: the reply
  of N and the send and parsing of N+1 are hidden. Arrivals' extends carry ``before_seq = N+1``: one that
  reaches the worker before N+1 has started makes N+1 wait for it too (``worker_svc/ordering.py``), and it
  is queued here before N+1, so its reply is processed as it comes. An extend that reaches the worker after
  N+1 started waits for N+1's steps.
- ``just-in-time``: when N's reply is in, after the last extend. Every arrival admitted before N's reply
  goes ahead of N+1; the cost is that N's reply and N+1's send and parsing are not hidden (one local gRPC
  round trip and the worker's parsing per Forward, with the GPU idle).

Measured on the simulated worker (``tests/scheduler/arrival_sim.py``, real loop and cache, 2.8 ms a decode
step, K = 8, 64 requests decoding, 1,024-token probes arriving one at a time): steady decode 21,750 tokens/s
queued against 16,600-17,700 just-in-time (bound 22,860), probe TTFT p50 31-34 ms against 30-32 ms. On the
H200 (bench/results/h200-run3, -run4) queueing N+1 without the insertion gave c64 12,147 tokens/s against
11,166 just-in-time.

Chaining happens only in steady decode (``can_chain``); otherwise the loop drains (waits for and processes
the in-flight replies, in order) and takes the synchronous path (extend, admission, retract, aborts).
Requests that finish while N is processed but are in a Forward still in flight stream their end at once and
are released at the cache and the worker after the last in-flight Forward that holds them was processed
(their results there are dropped): ``Scheduler._zombies``.

``Pipeline`` is the Scheduler's part that owns the Forwards in flight: it sends them, chains the next one in
steady decode, drains them, and drops them after a failure or a worker stall (they become the scheduler's
stale Forwards, answered before any new Forward is sent). It runs on the loop thread and works on the
scheduler's state.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from scheduler_svc.batch import Batch, Entry, slots_by_request
from scheduler_svc.errors import AllocationFailed
from scheduler_svc.multistep import multistep_eligible
from scheduler_svc.request import Req, State
from scheduler_svc.worker_client import PendingForward

if TYPE_CHECKING:
    from scheduler_svc.scheduler import Scheduler


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


class Pipeline:
    """The Forwards in flight of one Scheduler (``sched``): sent and not yet processed, processed in order.
    Loop thread only. ``len()`` is their number; a Pipeline is true while any is in flight."""

    def __init__(self, sched: "Scheduler") -> None:
        self.s = sched
        self.inflight: deque[InFlight] = deque()

    def __len__(self) -> int:
        return len(self.inflight)

    def request_ids(self) -> set[str]:
        """Ids of the requests in some Forward in flight."""
        return {e.req.rid for sent in self.inflight for e in sent.batch.entries}

    def holds(self, pending: PendingForward) -> bool:
        """True when ``pending`` is the reply of a Forward in flight."""
        return any(pending is sent.pending for sent in self.inflight)

    def chainable(self) -> bool:
        """One Forward in flight and steady decode (``can_chain``): the next round chains instead of draining."""
        s = self.s
        return len(self.inflight) == 1 and can_chain(self.inflight[0].batch, s.running, len(s.waiting),
                                                     s.cfg.max_running_requests)

    def send(self, batch: Batch, after_seq: int = 0, before_seq: int = 0) -> InFlight:
        """Sends ``batch`` without waiting (to run after Forward ``after_seq``, 0: at once; and ahead of Forward
        ``before_seq`` if that one has not started, 0: none) and queues it: last, or (``before_seq``) just
        before that Forward, so its reply is processed when it comes, not after that Forward's. (Replies are
        processed in queue order; the two hold different requests, so either order is correct.)"""
        s = self.s
        seq = s.next_seq()
        sent = InFlight(batch, s.worker.send(s.worker.prepare(s._items(batch), seq, after_seq, before_seq)), seq)
        at = next((i for i, f in enumerate(self.inflight) if f.seq == before_seq), len(self.inflight))
        self.inflight.insert(at, sent)
        return sent

    def chain(self) -> None:
        """Steady decode: allocate Forward N+1 while N runs (``queued``: send it at once, after N); until N's
        reply is in, each arrival is admitted at once and its extend sent to run after N (and after the extends
        sent before it; ``queued``: ahead of N+1); then (``just-in-time``) N+1 is sent after N or the last
        extend, and N is processed. An Allocate failure sends no N+1 (the next round drains and the synchronous
        path retracts)."""
        s = self.s
        t0 = time.perf_counter()
        cur = self.inflight[0]
        queued = s.cfg.overlap_mode == "queued"
        plan = continuation(cur.batch, s.cfg.decode_steps)
        nxt = None
        if plan:
            try:
                reply = s.cache.allocate([(e.req.rid, k) for e, k in plan])
            except AllocationFailed as exc:
                s.log.info("overlap_allocation_failed", error=str(exc), running=len(plan))
                reply = None
            if reply is not None:
                nxt = continuation_batch(plan, slots_by_request(reply, [(e.req, k) for e, k in plan]))
                # built now, while N runs: only the send waits for N's reply (just-in-time)
                nxt_request = s.worker.prepare(s._items(nxt), s.next_seq(), after_seq=cur.seq)
                for _ in range(max(k for _, k in plan)):
                    s.ratio.on_decode_step()
                s.stats["decode_alloc_seconds"] += time.perf_counter() - t0
        t1 = time.perf_counter()
        try:
            ahead_of = 0  # queued: extends run ahead of N+1 when they reach the worker before it started
            if nxt is not None and queued:
                self._send_chained(nxt, nxt_request)
                ahead_of = nxt_request.seq
            extend_after = cur.seq  # extends run after N and after each other
            while wait_reply_or_arrival(cur.pending, s.intake.wake, self.admissible_arrival):
                extend = s._extend_batch(new_only=True)  # admitted ones are in an extend already sent
                s._publish()
                if extend is not None:
                    extend_after = self.send(extend, after_seq=extend_after, before_seq=ahead_of).seq
                    s.stats["extends_ahead"] += 1
            if nxt is not None and not queued:
                nxt_request.after_seq = extend_after
                self._send_chained(nxt, nxt_request)
            reply = cur.pending.result()
        except BaseException:
            self.drop()  # N failed: what follows it at the worker is aborted there (resync requeues)
            raise
        self.inflight.popleft()
        t2 = time.perf_counter()
        s._process(cur.batch, reply)
        s._decode_stats(cur.batch, reply, wall=time.perf_counter() - t0, rpc=t2 - t1, process=time.perf_counter() - t2)

    def _send_chained(self, batch: Batch, request) -> None:
        """Sends the prepared continuation Forward ``request`` of ``batch`` and queues it."""
        s = self.s
        self.inflight.append(InFlight(batch, s.worker.send(request), request.seq))
        s.stats["decode_chained"] += 1

    def admissible_arrival(self) -> bool:
        """Takes new requests; True when some arrived now and the running set has room (admission may still
        defer them; requests that waited before are tried again only with a new arrival). Raises WorkerStalled
        when the worker has stopped answering health checks."""
        s = self.s
        if s.worker_stalled():
            raise s._stall_error()
        return bool(s._intake()) and len(s.running) < s.cfg.max_running_requests

    def drain(self) -> None:
        """Waits for the in-flight Forwards and processes them in order (nothing new is sent)."""
        s = self.s
        while self.inflight:
            t0 = time.perf_counter()
            cur = self.inflight[0]
            reply = s._reply(cur.pending)
            self.inflight.popleft()
            t1 = time.perf_counter()
            s._process(cur.batch, reply)
            s._publish()
            if cur.batch.kind == "decode":
                s._decode_stats(cur.batch, reply, wall=time.perf_counter() - t0, rpc=t1 - t0,
                                process=time.perf_counter() - t1)

    def drop(self) -> None:
        """After a dependency error or a stall: the in-flight Forwards become stale (the resync waits for their
        answers before it sends a new Forward; their requests are requeued or failed) and finished-but-unreleased
        requests go to the orphans (the new session frees their slots)."""
        s = self.s
        s._stale += [sent.pending for sent in self.inflight]
        self.inflight.clear()
        for req in s._zombies:
            s._orphans.append(req.rid)
            s._forget(req)
        s._zombies = []
