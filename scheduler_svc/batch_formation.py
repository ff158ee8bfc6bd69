"""Batch formation of the scheduling loop: which requests run in the next Forward and at which slots.

An extend batch takes continuing prefill chunks first, then admits waiting requests in policy order while the
chunk budget, ``max_running_requests`` and the KV budget (the cache's receipts minus what running requests
still need, charged through a per-round ``Ledger``) allow. A decode batch allocates 1 slot (or K for multi-step
decode) per decoding request in one ``Cache.Allocate``; when the pool cannot fund it, multi-step falls back to
one step, then the request that loses least is retracted (its written prefix cached, the request put first in
line) until the rest fit. Every decision is taken on the cache's receipts (``AllocationFailed`` carries the
shortfall), never on what was asked for.

``BatchFormation`` is a mixin of ``scheduler_svc.scheduler.Scheduler``: it runs on the loop thread and uses the
Scheduler's state (``running``, ``waiting``, ``cache``, ``worker``, ``cfg``, ``ratio``, ``stats``, ``log``).
"""

from __future__ import annotations

import time

import grpc

from codeserve.v1 import cache_pb2
from scheduler_svc.admission import Ledger, reserved_for_running
from scheduler_svc.batch import Batch, Entry, slots_by_request
from scheduler_svc.errors import AllocationFailed
from scheduler_svc.multistep import multistep_eligible, steps_for
from scheduler_svc.policy import order_waiting, retract_victim
from scheduler_svc.prefix_stats import count_admission
from scheduler_svc.request import Req, State


class BatchFormation:
    """Extend and decode batch building, admission and retract (a mixin of Scheduler; loop thread only)."""

    # ---- extend ----------------------------------------------------------------------------------------
    def _extend_batch(self, new_only: bool = False) -> Batch | None:
        """Continuing prefill chunks, then admissions, within the chunk budget. ``new_only``: admissions only
        (while Forwards are in flight, a request in PREFILL may have its chunk in one of them)."""
        budget = self.cfg.chunk_size
        plan: list[tuple[Req, int]] = []
        for req in self.running:
            if req.state == State.PREFILL and budget > 0 and not new_only:
                n = min(req.pending_tokens, budget)
                plan.append((req, n))
                budget -= n
        continuing = list(plan)
        plan += self._admit(budget) if budget > 0 and self.waiting else []
        if not plan:
            return None
        try:
            reply = self.cache.allocate([(r.rid, n) for r, n in plan])
        except AllocationFailed as exc:
            # New admissions go back first (released: nothing of theirs was written); continuing chunks retry.
            self.log.warning("extend_allocation_failed", error=str(exc), requests=len(plan), continuing=len(continuing))
            for req, _ in reversed(plan[len(continuing):]):
                self._requeue(req, cache_prefix=False)
            plan = continuing
            try:
                reply = self.cache.allocate([(r.rid, n) for r, n in plan]) if plan else None
            except AllocationFailed as again:
                self.log.warning("extend_allocation_failed", error=str(again), requests=len(plan), continuing=len(plan))
                for req, _ in reversed(plan):
                    self._requeue(req, cache_prefix=True)
                reply = None
            if reply is None:
                return None
        slots = slots_by_request(reply, plan)
        return Batch("extend", tuple(
            Entry(r, r.kv_len, n, slots[r.rid], sample=n == r.pending_tokens and r.remaining_new_tokens > 0)
            for r, n in plan))

    def _admit(self, budget: int) -> list[tuple[Req, int]]:
        """Admits waiting requests in policy order while they fit (count, chunk budget, KV budget)."""
        ledger = Ledger(reserved_for_running(self.running, self.ratio.value))
        pool_idle = not self.running
        out: list[tuple[Req, int]] = []
        for req in order_waiting(self.waiting, self.cfg.policy, self._prefix_lengths):
            if budget <= 0 or len(self.running) >= self.cfg.max_running_requests:
                break
            cached, slot_ids, counters = self._lock_prefix(req)
            extend = len(req.all_ids) - cached
            decision = ledger.decide(counters, extend, req.remaining_new_tokens, self.ratio.value, pool_idle)
            if not decision.admit and pool_idle and ledger.admitted == 0:
                self.cache.release_requests([req.rid])
                self.waiting.remove(req)
                req.stream.fail(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"request {req.rid} needs {extend} KV slots now but an idle pool funds only "
                                f"{decision.fundable} (capacity {counters.capacity})")
                self._forget(req)
                continue
            if not decision.admit:
                self.cache.release_requests([req.rid])
                self.log.debug("admission_deferred", rid=req.rid, cost=decision.cost, fundable=decision.fundable,
                               reserved=decision.reserved, charged=decision.charged)
                break
            ledger.charge(decision)
            count_admission(self.stats, req, cached)  # prefix-cache counters: the first admission only
            req.admitted(cached, slot_ids)
            self.waiting.remove(req)
            self.running.append(req)
            n = min(extend, budget)
            budget -= n
            out.append((req, n))
            self.log.info("admitted", rid=req.rid, tokens=len(req.all_ids), cached=cached, chunk=n,
                          fundable=decision.fundable, reserved=decision.reserved, charged=decision.charged)
        return out

    def _lock_prefix(self, req: Req) -> tuple[int, list[int], cache_pb2.Counters]:
        """Match with lock, which also registers the request at the cache (a full hit still recomputes
        >= 1 token: max_match_tokens = len - 1). Returns (cached tokens, their slots, counters after the
        lock). Requests collecting prompt logprobs, and 1-token prompts, match nothing (empty key)."""
        ids = req.all_ids
        key = [] if req.wants_prompt_logprobs or len(ids) < 2 else ids
        reply = self.cache.match([cache_pb2.MatchItem(request_id=req.rid, namespace=req.params.namespace,
                                                      token_ids=key, lock=True, max_match_tokens=max(len(key) - 1, 0))])
        if not reply.receipt.HasField("after"):
            raise RuntimeError(f"Match receipt without counters for {req.rid}: no budget is not a budget of 0")
        result = {r.request_id: r for r in reply.results}[req.rid]
        if len(result.slot_ids) != result.cached_tokens or result.cached_tokens >= max(len(key), 1):
            raise RuntimeError(f"Match receipt for {req.rid}: {result.cached_tokens} cached tokens, "
                               f"{len(result.slot_ids)} slots, key of {len(key)} tokens")
        return result.cached_tokens, list(result.slot_ids), reply.receipt.after

    def _prefix_lengths(self, reqs: list[Req]) -> list[int]:
        reply = self.cache.match([cache_pb2.MatchItem(request_id=r.rid, namespace=r.params.namespace,
                                                      token_ids=r.all_ids, lock=False) for r in reqs])
        by_id = {r.request_id: r.cached_tokens for r in reply.results}
        return [by_id[r.rid] for r in reqs]

    # ---- decode ----------------------------------------------------------------------------------------
    def _decode_batch(self) -> Batch | None:
        decoding = [r for r in self.running if r.state == State.DECODE]
        admitting = self.waiting and len(self.running) < self.cfg.max_running_requests
        # one step while requests wait with room, or when one request needs per-step host work (the worker
        # takes a multi-step batch only of multi-step eligible items)
        max_steps = 1 if admitting or not all(multistep_eligible(r) for r in decoding) else self.cfg.decode_steps
        self._alloc_s = 0.0
        while decoding:
            plan = [(r, steps_for(r, max_steps)) for r in decoding]
            t0 = time.perf_counter()
            try:
                reply = self.cache.allocate([(r.rid, k) for r, k in plan])
            except AllocationFailed as exc:
                if max_steps > 1:  # fund one step for everyone before retracting anyone
                    self.log.info("multistep_allocation_failed", error=str(exc), running=len(decoding))
                    max_steps = 1
                    continue
                self.log.warning("decode_allocation_failed", error=str(exc), running=len(decoding))
                victim = retract_victim(decoding)
                decoding.remove(victim)
                if len(self.running) == 1:
                    self._release(victim)
                    victim.stream.fail(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                       f"KV pool too small for request {victim.rid} alone: {exc}")
                    self._forget(victim)
                    continue
                self._requeue(victim, cache_prefix=True)
                continue
            slots = slots_by_request(reply, plan)
            self._alloc_s = time.perf_counter() - t0
            self.stats["decode_alloc_seconds"] += self._alloc_s
            for _ in range(max(k for _, k in plan)):
                self.ratio.on_decode_step()
            return Batch("decode", tuple(Entry(r, r.kv_len, 1, slots[r.rid], True, steps=k) for r, k in plan))
        return None

    def _requeue(self, req: Req, cache_prefix: bool) -> None:
        """Retract: cache its written prefix (or release it), drop it at the worker, put it first in line."""
        if cache_prefix and req.kv_len > 0:
            self.cache.cache_requests([cache_pb2.CacheItem(request_id=req.rid, token_ids=req.all_ids[:req.kv_len],
                                                           finished=True)])
        else:
            self.cache.release_requests([req.rid])
        if req.worker_knows:
            self.worker.release([req.rid])
        self.running.remove(req)
        req.requeued()
        self.waiting.appendleft(req)
        self.ratio.on_retract()
        self.stats["retractions"] += 1
        self.log.info("retracted", rid=req.rid, output_tokens=len(req.output_ids), ratio=round(self.ratio.value, 3))

    def _release(self, req: Req) -> None:
        self.cache.release_requests([req.rid])
        if req.worker_knows:
            self.worker.release([req.rid])
        self.running.remove(req)
