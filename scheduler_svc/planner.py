"""Batch planning: which requests run in the next Forward and at which slots (extend, decode, admission,
retract), on the request table, the cache client and the config.

An extend batch takes continuing prefill chunks first, then admits waiting requests in policy order while the
chunk budget, ``max_running_requests`` and the KV budget (the cache's receipts minus what running requests
still need, charged through a per-round ``Ledger``) allow. A decode batch allocates 1 slot (or K for multi-step
decode) per decoding request in one ``Cache.Allocate``; when the pool cannot fund it, multi-step falls back to
one step, then the request that loses least is retracted (its written prefix cached, the request put first in
line) until the rest fit. K is ``cfg.decode_steps``, or fewer while arrivals come (``step_budget.py``, with
``cfg.adaptive_steps``). The extend ahead is the one sent behind an extend in flight whose prefill continues
(``extend_ahead``, ``scheduler_svc/chunk_ahead.py``). A continuation is the decode batch chained behind one in
flight (overlap: its
entries start where the in-flight ones end). Every decision is taken on the cache's receipts
(``AllocationFailed`` carries the shortfall), never on what was asked for.

Loop thread only. Moves requests only through the table's transitions (``scheduler_svc/requests.py``).
"""

from __future__ import annotations

import time
from typing import Sequence

from codeserve.v1 import cache_pb2
from common import hop_trace
from scheduler_svc.admission import Ledger, NewTokenRatio, reserved_for_running
from scheduler_svc.admission_match import locked_from, match_item, match_key
from scheduler_svc.batch import Batch, Entry, slots_by_request
from scheduler_svc.chain import continuation, continuation_batch
from scheduler_svc.chunk_ahead import chunks_ahead, riders_ahead
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.errors import AllocationFailed
from scheduler_svc.multistep import multistep_eligible, steps_for
from scheduler_svc.policy import order_waiting, retract_victim
from scheduler_svc.prefix_stats import count_admission
from scheduler_svc.request import Req, State
from scheduler_svc.requests import RequestTable
from scheduler_svc.stats import Stats
from scheduler_svc.step_budget import StepBudget

ADMIT_GROUP = 8  # waiting requests whose prefixes one admission Match locks at once


class Planner:
    """Plans extend and decode batches. ``cfg`` may be replaced between rounds (the loop's ``cfg`` setter).
    ``budget``: the loop's measurements for the decode steps a Forward may run under arrivals, asked with
    ``cfg.adaptive_steps`` (``step_budget.py``; None: a new one that hears of no arrival, always K). ``early``: the
    EarlyMatch whose receipts admission uses for the requests that carry one (None: every Match is the loop's)."""

    def __init__(self, table: RequestTable, cache, cfg: SchedulerConfig, ratio: NewTokenRatio, stats: Stats,
                 log, budget: StepBudget | None = None, early=None) -> None:
        self.table, self.cache, self.cfg, self.ratio, self.stats, self.log = table, cache, cfg, ratio, stats, log
        self.early = early
        self._preallocated: dict[str, tuple[int, ...]] = {}  # admitted this round, slots from their Match
        self.budget = budget if budget is not None else StepBudget()

    # ---- extend --------------------------------------------------------------------------------------------
    def extend(self, new_only: bool = False) -> Batch | None:
        """Continuing prefill chunks, then admissions, within the chunk budget; None when there is nothing to
        run or the pool cannot fund it (new admissions requeued, then continuing chunks retracted).
        ``new_only``: admissions only (while Forwards are in flight, a request in PREFILL may have its chunk in
        one of them). With ``cfg.mixed_chunk`` (and not ``new_only``: no Forward is in flight then) every
        decoding request rides in the batch as a one-step decode entry, allocated in the same Allocate; when
        the pool cannot fund them too, the batch is planned without them (they decode in the next round)."""
        budget = self.cfg.chunk_size
        plan: list[tuple[Req, int]] = []
        for req in self.table.running:
            if req.state == State.PREFILL and budget > 0 and not new_only:
                n = min(req.pending_tokens, budget)
                plan.append((req, n))
                budget -= n
        continuing = list(plan)
        plan += self._admit(budget) if budget > 0 and self.table.waiting else []
        if not plan:
            return None
        try:
            slots = self._relieved(lambda: self._allocate(plan))
        except AllocationFailed as exc:
            # New admissions go back first (released: nothing of theirs was written); continuing chunks retry.
            self.log.warning("extend_allocation_failed", error=str(exc), requests=len(plan), continuing=len(continuing))
            for req, _ in reversed(plan[len(continuing):]):
                self._retract(req, cache_prefix=False)
            plan = continuing
            try:
                slots = self._allocate(plan) if plan else None
            except AllocationFailed as again:
                self.log.warning("extend_allocation_failed", error=str(again), requests=len(plan), continuing=len(plan))
                for req, _ in reversed(plan):
                    self._retract(req, cache_prefix=True)
                slots = None
            if slots is None:
                return None
        extend = tuple(Entry(r, start=r.kv_len, n=n, slot_ids=slots[r.rid],
                             sample=n == r.pending_tokens and r.remaining_new_tokens > 0) for r, n in plan)
        return Batch("extend", extend + (self._riders() if self.cfg.mixed_chunk and not new_only else ()))

    def extend_ahead(self, inflight: Batch) -> Batch | None:
        """The extend to send behind ``inflight`` (chunked prefill pipelined, ``scheduler_svc/chunk_ahead.py``):
        the prefill chunks that follow, at their predicted starts, then admissions, within the chunk budget, in
        one Allocate; with ``cfg.mixed_chunk`` the decoding requests ride (``chunk_ahead.riders_ahead``, their own
        Allocate). None when the pool cannot fund the chunks (new admissions requeued first): nothing running is
        retracted here (a chunk of it is in flight); the loop waits for ``inflight`` and the synchronous path
        plans the next round."""
        chunks = chunks_ahead(inflight, self.table.running, self.cfg.chunk_size)
        budget = self.cfg.chunk_size - sum(n for _, _, n, _ in chunks)
        admitted = self._admit(budget) if budget > 0 and self.table.waiting else []
        plan = [(r, n) for r, _, n, _ in chunks] + admitted
        if not plan:
            return None
        try:
            slots = self._allocate(plan)
        except AllocationFailed as exc:  # new admissions go back (nothing of theirs written); the chunks alone?
            self.log.info("ahead_allocation_failed", error=str(exc), requests=len(plan), continuing=len(chunks))
            for req, _ in reversed(admitted):
                self._retract(req, cache_prefix=False)
            plan = plan[:len(chunks)]
            try:
                slots = self._allocate(plan) if admitted and plan else None
            except AllocationFailed as again:
                self.log.info("ahead_allocation_failed", error=str(again), requests=len(plan), continuing=len(plan))
                slots = None
            if slots is None:
                return None
        starts = {r.rid: (s, behind) for r, s, _, behind in chunks}
        entries = []
        for req, n in plan:
            start, behind = starts.get(req.rid, (req.kv_len, False))
            total = len(req.prompt_ids) + len(req.output_ids)
            entries.append(Entry(req, start=start, n=n, slot_ids=slots[req.rid], behind=behind,
                                 sample=start + n == total and req.remaining_new_tokens > 0))
        riders = self._riders_ahead(inflight) if self.cfg.mixed_chunk else ()
        return Batch("extend", tuple(entries) + riders)

    def _allocate(self, plan: list[tuple[Req, int]]) -> dict[str, tuple[int, ...]]:
        """Slots per request id for ``plan`` (request, tokens): an admission whose slots its Match allocated
        (``_lock_prefixes``) takes those, the rest come from one Allocate (none when nothing is left). Raises
        AllocationFailed (the preallocated stay with their requests: a retract releases them) or RuntimeError for
        a receipt that delivered other counts."""
        pre = {r.rid: self._preallocated[r.rid] for r, _ in plan if r.rid in self._preallocated}
        rest = [(r, n) for r, n in plan if r.rid not in pre]
        slots = slots_by_request(self.cache.allocate([(r.rid, n) for r, n in rest]), rest) if rest else {}
        for rid in pre:
            del self._preallocated[rid]
        self.stats.add("admissions_allocated_by_match", len(pre))
        return {**slots, **pre}

    def _relieved(self, allocate):
        """``allocate()``, once more after ``_let_go_early`` when the pool cannot fund it (waiting requests' early
        first chunks go before anything running is retracted or failed). Raises AllocationFailed."""
        try:
            return allocate()
        except AllocationFailed:
            if not self._let_go_early():
                raise
        return allocate()

    def _riders_ahead(self, inflight: Batch) -> tuple[Entry, ...]:
        """The decode riders of the extend behind ``inflight`` (``chunk_ahead.riders_ahead``), their slots
        allocated now; none when the pool cannot fund them."""
        plan = riders_ahead(inflight, self.table.running)
        if not plan:
            return ()
        try:
            reply = self.cache.allocate([(r.rid, 1) for r, _, _ in plan])
        except AllocationFailed as exc:
            self.log.info("mixed_decode_allocation_failed", error=str(exc), decoding=len(plan))
            return ()
        slots = slots_by_request(reply, [(r, 1) for r, _, _ in plan])
        return tuple(Entry(r, start=s, n=1, slot_ids=slots[r.rid], sample=True, from_last=last) for r, s, last in plan)

    def _riders(self) -> tuple[Entry, ...]:
        """One-step decode entries for the decoding requests (their slots allocated now), to ride in an extend
        batch; none when none decodes or the pool cannot fund them (nothing is retracted for a rider)."""
        decoding = [r for r in self.table.running if r.state == State.DECODE]
        if not decoding:
            return ()
        try:
            reply = self.cache.allocate([(r.rid, 1) for r in decoding])
        except AllocationFailed as exc:
            self.log.info("mixed_decode_allocation_failed", error=str(exc), decoding=len(decoding))
            return ()
        slots = slots_by_request(reply, [(r, 1) for r in decoding])
        return tuple(Entry(r, start=r.kv_len, n=1, slot_ids=slots[r.rid], sample=True) for r in decoding)

    def _admit(self, budget: int) -> list[tuple[Req, int]]:
        """Admits waiting requests in policy order while they fit (count, chunk budget, KV budget).

        Their prefixes are locked up to ``ADMIT_GROUP`` at a time in one ``Match`` (one RPC per group, not per
        request: under keystroke-rate traffic several arrivals wait each round), and each is judged on the
        counters after that lock. When one does not fit while later candidates of its group are locked, their
        locks (which keep their prefixes from being evictable) are let go first and it is judged again on the
        release's counters, so a group never keeps its own head out. Candidates left locked when the round
        stops (budget, room, a deferral) are unlocked in one ReleaseRequests.

        A group of one (one arrival waits, the common case at keystroke rate) is admitted in one round trip: its
        Match also allocates its first chunk from free pages (``MatchItem.allocate_up_to`` = the budget; the
        decision is still made on the counters after the lock, before that allocation); a deferred or refused
        request's release frees them, an admitted one's are used by ``_allocate``."""
        table, cfg = self.table, self.cfg
        self._preallocated = {}
        ledger = Ledger(reserved_for_running(table.running, self.ratio.value))
        pool_idle = not table.running
        out: list[tuple[Req, int]] = []
        queue = order_waiting(table.waiting, cfg.policy, self._prefix_lengths)
        locked: dict[str, tuple[int, Sequence[int]]] = {}  # the group's candidates not reached: queue[at:at + len]
        counters = None
        at = 0
        while at < len(queue) and budget > 0 and len(table.running) < cfg.max_running_requests:
            req = queue[at]
            early = None
            if req.rid not in locked:
                early = self._early_locked(req, budget)
                if early is not None:
                    locked, counters, allocated = early
                else:
                    room = cfg.max_running_requests - len(table.running)
                    group = queue[at:at + min(ADMIT_GROUP, room)]
                    group = group[:next((i for i, r in enumerate(group) if r.early is not None), len(group))]
                    locked, counters, allocated = self._lock_prefixes(group, budget)
            cached, slot_ids = locked.pop(req.rid)
            extend = len(req.all_ids) - cached
            decision = ledger.decide(counters, extend, req.remaining_new_tokens, self.ratio.value, pool_idle)
            if early is not None and not decision.admit:  # an early receipt only says yes (early_match.py)
                table.unlock([req])
                early = None
                locked, counters, allocated = self._lock_prefixes([req], budget)
                cached, slot_ids = locked.pop(req.rid)
                extend = len(req.all_ids) - cached
                decision = ledger.decide(counters, extend, req.remaining_new_tokens, self.ratio.value, pool_idle)
            self.stats.add("admissions_early_matched", int(early is not None and decision.admit))
            behind = self.early.settle(queue[at + 1 + len(locked):]) if not decision.admit and self.early else []
            if not decision.admit and (locked or behind):  # the later candidates' locks may be what keeps it out
                # the rest of its group, and the requests behind it that an early Match registered
                counters = table.unlock(queue[at + 1:at + 1 + len(locked)] + behind)
                locked = {}
                decision = ledger.decide(counters, extend, req.remaining_new_tokens, self.ratio.value, pool_idle)
            at += 1
            if not decision.admit and pool_idle and ledger.admitted == 0:
                table.refuse(req, f"request {req.rid} needs {extend} KV slots now but an idle pool funds only "
                                  f"{decision.fundable} (capacity {counters.capacity})")
                continue
            if not decision.admit:
                table.unlock([req])
                self.log.debug("admission_deferred", rid=req.rid, cost=decision.cost, fundable=decision.fundable,
                               reserved=decision.reserved, charged=decision.charged)
                break
            ledger.charge(decision)
            count_admission(self.stats, req, cached)  # prefix-cache counters: the first admission only
            table.admit(req, cached, slot_ids)
            hop_trace.mark(req.rid, "admitted")
            n = min(extend, budget)
            if allocated.get(req.rid):
                if len(allocated[req.rid]) != n:
                    raise RuntimeError(f"Match receipt allocated {len(allocated[req.rid])} slots to {req.rid}, "
                                       f"its first chunk is {n} tokens")
                self._preallocated[req.rid] = allocated[req.rid]
            budget -= n
            out.append((req, n))
            self.log.info("admitted", rid=req.rid, tokens=len(req.all_ids), cached=cached, chunk=n,
                          fundable=decision.fundable, reserved=decision.reserved, charged=decision.charged)
        if locked:  # the rest of the last group, locked but not reached
            table.unlock(queue[at:at + len(locked)])
        return out

    def _lock_prefixes(self, reqs: list[Req], budget: int) -> tuple[dict[str, tuple[int, Sequence[int]]],
                                                                   cache_pb2.Counters, dict[str, tuple[int, ...]]]:
        """One Match with lock for ``reqs``, which also registers them at the cache (a full hit still recomputes
        >= 1 token: max_match_tokens = len - 1); a lone request's Match also allocates its first chunk (up to
        ``budget`` tokens) from free pages. Returns ({rid: (cached tokens, their slots)}, the counters after the
        locks, {rid: slots allocated}). Requests collecting prompt logprobs, and 1-token prompts, match nothing
        (empty key). Raises RuntimeError for a receipt without counters or a result that contradicts its item."""
        totals = [len(r.prompt_ids) + len(r.output_ids) for r in reqs]
        keys = [match_key(r) for r in reqs]
        up_to = budget if len(reqs) == 1 else 0
        if hop_trace.enabled():
            for r in reqs:
                hop_trace.mark(r.rid, "match_sent")
        reply = self.cache.match([match_item(r, key, lock=True, max_match_tokens=max(key - 1, 0),
                                             allocate_up_to=up_to, compute_tokens=n)
                                  for r, key, n in zip(reqs, keys, totals)])
        if hop_trace.enabled():
            for r in reqs:
                hop_trace.mark(r.rid, "match_back")
        return locked_from(reqs, keys, reply)

    def _early_locked(self, req: Req, budget: int):
        """``EarlyMatch.locked`` (None without early Matches)."""
        return self.early.locked(req, budget, self.table.unlock) if self.early is not None else None

    def _let_go_early(self) -> bool:
        """``EarlyMatch.let_go`` of the waiting requests (False without early Matches)."""
        return self.early is not None and self.early.let_go(list(self.table.waiting), self.table.unlock, self.log)

    def _prefix_lengths(self, reqs: list[Req]) -> list[int]:
        reply = self.cache.match([match_item(r, len(r.prompt_ids) + len(r.output_ids), lock=False) for r in reqs])
        by_id = {r.request_id: r.cached_tokens for r in reply.results}
        return [by_id[r.rid] for r in reqs]

    # ---- decode ----------------------------------------------------------------------------------------------
    def decode(self) -> Batch | None:
        """One decode step (or up to K, multi-step: ``_max_steps``) for every decoding request; None when none
        decodes. Retracts (or, alone, fails) requests until the pool funds the rest."""
        table = self.table
        decoding = [r for r in table.running if r.state == State.DECODE]
        admitting = table.waiting and len(table.running) < self.cfg.max_running_requests
        # one step while requests wait with room, or when one request needs per-step host work (the worker
        # takes a multi-step batch only of multi-step eligible items)
        budget = (None if admitting or not all(multistep_eligible(r) for r in decoding)
                  else self._max_steps(len(decoding)))
        max_steps = budget or 1
        while decoding:
            plan = [(r, steps_for(r, max_steps)) for r in decoding]
            t0 = time.perf_counter()
            try:
                reply = self._relieved(lambda: self.cache.allocate([(r.rid, k) for r, k in plan]))
            except AllocationFailed as exc:
                if max_steps > 1:  # fund one step for everyone before retracting anyone
                    self.log.info("multistep_allocation_failed", error=str(exc), running=len(decoding))
                    max_steps = 1
                    continue
                self.log.warning("decode_allocation_failed", error=str(exc), running=len(decoding))
                victim = retract_victim(decoding)
                decoding.remove(victim)
                if len(table.running) == 1:
                    table.fail_running(victim, f"KV pool too small for request {victim.rid} alone: {exc}")
                    continue
                self._retract(victim, cache_prefix=True)
                continue
            slots = slots_by_request(reply, plan)
            self._funded(max(k for _, k in plan), time.perf_counter() - t0)
            cut = budget is not None and budget < self.cfg.decode_steps
            self.stats.decode_planned(max(k for _, k in plan), cut=cut)
            return Batch("decode", tuple(Entry(r, start=r.kv_len, n=1, slot_ids=slots[r.rid], sample=True, steps=k)
                                         for r, k in plan))
        return None

    def continuation(self, *inflight: Batch, unapplied: Sequence[Batch] = (),
                     stopped: frozenset[str] | set[str] = frozenset()) -> Batch | None:
        """The decode batch to chain behind the Forwards ``inflight`` (overlap: the one in flight; or an extend and
        the decode whose reply is in but not applied, ``chain.chain_past``), its slots allocated now while they
        run; None when no request continues or the pool cannot fund it (nothing is retracted here: the next round
        drains, and the synchronous path retracts). A request is in at most one of ``inflight``. ``unapplied``:
        decode Forwards ahead of ``inflight`` whose replies are not applied (``chain.chain_ahead``): their tokens
        count against each request's budget, and their requests are not at a first decode; ``stopped``: ids of
        requests the first of them stopped (``chain.stopped_in``), left out."""
        t0 = time.perf_counter()
        entries = [e for b in inflight for e in b.entries]
        ahead: dict[str, int] = {}
        for e in (e for b in unapplied for e in b.entries):
            ahead[e.req.rid] = ahead.get(e.req.rid, 0) + e.steps
        held = {e.req.rid for e in entries} | set(ahead)
        fresh = [r for r in self.table.running if r.state == State.DECODE and r.rid not in held]  # first decode
        # the worker takes a multi-step batch only of eligible items
        eligible = all(multistep_eligible(r) for r in [*fresh, *(e.req for e in entries)])
        max_steps = self._max_steps(len(entries) + len(fresh)) if eligible else 1
        plan = [p for b in inflight for p in continuation(b, max_steps, ahead, stopped)]
        first = [(r, steps_for(r, max_steps)) for r in fresh]
        if not plan and not first:
            return None
        asked = [(e.req, k) for e, k in plan] + first
        try:
            reply = self._relieved(lambda: self.cache.allocate([(r.rid, k) for r, k in asked]))
        except AllocationFailed as exc:
            self.log.info("overlap_allocation_failed", error=str(exc), running=len(asked))
            return None
        batch = continuation_batch(plan, first, slots_by_request(reply, asked))
        self.stats.add("decode_after_extend", int(any(b.kind == "extend" for b in inflight)))
        steps = max(k for _, k in asked)
        self._funded(steps, time.perf_counter() - t0)
        self.stats.decode_planned(steps, cut=eligible and max_steps < self.cfg.decode_steps)
        return batch

    def _max_steps(self, batch: int) -> int:
        """The most decode steps a Forward of ``batch`` requests may run now: ``cfg.decode_steps``, or fewer
        while arrivals come (``StepBudget.steps``, with ``cfg.adaptive_steps``)."""
        if not self.cfg.adaptive_steps:
            return self.cfg.decode_steps
        return self.budget.steps(self.budget.clock(), batch, self.cfg.decode_steps)

    def _funded(self, steps: int, seconds: float) -> None:
        """A decode batch of up to ``steps`` steps was allocated in ``seconds``: the new-token ratio decays once
        per step, and the allocation time is recorded."""
        for _ in range(steps):
            self.ratio.on_decode_step()
        self.stats.decode_allocated(seconds)

    def _retract(self, req: Req, cache_prefix: bool) -> None:
        """Retract (``RequestTable.retract``); a retract raises the new-token ratio."""
        self.table.retract(req, cache_prefix)
        self.ratio.on_retract()
        self.stats.add("retractions")
        self.log.info("retracted", rid=req.rid, output_tokens=len(req.output_ids), ratio=round(self.ratio.value, 3))
