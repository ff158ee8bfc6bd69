"""The request table: the one owner of where each request stands, the transitions between those places, and
the only code that releases a request at the cache and at the worker.

At the worker a request that ends or is retracted is not released by a Release round trip in the round: its id
goes to ``releases`` (``worker_releases.WorkerReleases``) and rides on the next Forward the loop builds
(``release_request_ids``, dropped when that Forward starts running at the worker, after the Forwards it
follows). With no Forward to send the loop calls ``flush_releases`` (one Release RPC); a resync releases
whatever is still outstanding (``worker_held_ids``, ``resynced``).

Where a request stands (``Stance``), and the method that moves it:

    (intake inbox) --take_new--> WAITING --admit--> PREFILLING --prefill_done--> DECODING
    DECODING  --cache_prefilled (its written prompt inserted in the tree, its lock moved; same slots)--> DECODING
    WAITING   --unlock (admission deferred: its lock let go, it stays)--> WAITING
    WAITING   --refuse (an idle pool cannot fund it) / abort--> gone (stream failed or ended)
    PREFILLING, DECODING --retract--> WAITING (first in line; its written prefix cached or released)
    PREFILLING, DECODING --fail_running / abort--> gone
    PREFILLING, DECODING --finish--> gone (cached and released now) or FINISHING (its end streamed; it is in a
                                     Forward still in flight: released by a later ``finish``)
    FINISHING --lose_finishing (the Forwards in flight were dropped)--> ORPHANED
    a release that fails --> ORPHANED (answered and forgotten; its slots are freed by the resync's new session
                             and it is released at the worker by ``resynced``)
    everything --fail_all--> gone (running ones ORPHANED); running --resynced--> WAITING

A request's phase (``Req.state``: WAITING, PREFILL, DECODE) is written here only; FINISHED is derived from
its finish reason, which its output stream sets (``scheduler_svc/output.py``). Counts are derived from the
containers: ``held`` (requests whose slots are not yet released) and the ``snapshot`` that ``GetLoad`` and the
queue bound read, published by ``publish`` (other threads read it; the loop publishes after every change).
Loop thread only, except ``snapshot``.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from typing import Callable, Collection, Sequence

import grpc

from common import hop_trace

from codeserve.v1 import cache_pb2
from scheduler_svc.intake import Intake
from scheduler_svc.request import Finish, Req, State
from scheduler_svc.worker_releases import WorkerReleases

_ADMISSIONS = itertools.count(1)  # admission order, across tables (larger = more recent)


def written_item(req: Req, finished: bool) -> cache_pb2.CacheItem:
    """The CacheItem of ``req``'s written tokens (``all_ids[:kv_len]``), its ids copied through ``Req.extend_ids``."""
    item = cache_pb2.CacheItem(request_id=req.rid, finished=finished)
    req.extend_ids(item.token_ids, 0, req.kv_len)
    return item


class Stance(enum.Enum):
    """Where a request stands in the table (``RequestTable.where``)."""

    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHING = "finishing"   # finished, its end streamed, still inside a Forward in flight
    ORPHANED = "orphaned"     # finished or failed, its release not done (the resync's new session does it)


class RequestTable:
    """Every request the loop holds: ``waiting`` (deque, queue order), ``running`` (admitted: prefilling or
    decoding), ``finishing`` (finished, inside a Forward in flight), ``orphans`` (request ids whose release
    failed or was cut short), ``releases`` (ids to release at the worker on the next Forward). ``cache`` and
    ``worker`` are the clients releases go to (the worker's Release RPC only in ``flush_releases`` and
    ``resynced``); ``intake`` is told when a request ends (``forget``). Methods that call the cache or the worker
    raise their clients' errors."""

    def __init__(self, cache, worker, intake: Intake, log, early=None) -> None:
        self.cache, self.worker, self.intake, self.log = cache, worker, intake, log
        self.early = early  # EarlyMatch: a waiting request it registered is released when aborted
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.finishing: list[Req] = []
        self.orphans: list[str] = []
        self.releases = WorkerReleases()
        self.aborting: list[Req] = []  # flagged (``Intake.take_aborts``), not yet freed: running ones wait for ``abort()``
        self.prefilled: list[Req] = []  # prefill completed in the Forwards being applied: ``cache_prefilled`` inserts them
        self.snapshot = (0, 0, 0)  # (held, waiting, waiting tokens) as of the last ``publish``

    # ---- derived -------------------------------------------------------------------------------------------
    def held(self) -> int:
        """Requests whose slots are not yet released: running, finishing, orphaned, and ended ones whose release
        is deferred at the cache client (sent with its next call; 0: the pool is settled)."""
        return len(self.running) + len(self.finishing) + len(self.orphans) + self.cache.deferred_ends

    def publish(self) -> None:
        """Publishes (held, waiting, waiting tokens) for other threads (``GetLoad``, the queue bound)."""
        self.snapshot = (self.held(), len(self.waiting), self.waiting_tokens())

    def waiting_tokens(self) -> int:
        """The tokens of the waiting requests' prompts (with the output of a retracted one: what its prefill
        recomputes)."""
        return sum(len(r.prompt_ids) + len(r.output_ids) for r in self.waiting)

    def where(self, req: Req) -> Stance | None:
        """Where ``req`` stands; None when the table does not hold it (not taken yet, or gone)."""
        if req in self.finishing:
            return Stance.FINISHING
        if req.rid in self.orphans:
            return Stance.ORPHANED
        if req in self.running:
            return Stance.PREFILLING if req.phase == State.PREFILL else Stance.DECODING
        if req in self.waiting:
            return Stance.WAITING
        return None

    def worker_held_ids(self) -> list[str]:
        """Ids the worker may hold a slot table for: orphans, releases not known to be done (pending, or carried
        by a Forward not answered OK) and running requests it knows."""
        return self.orphans + self.releases.outstanding() + [r.rid for r in self.running if r.worker_knows]

    # ---- intake and admission -------------------------------------------------------------------------------
    def take_new(self) -> int:
        """Moves new requests from the intake to the end of the waiting queue (publishing at once: the queue bound
        reads inbox + snapshot, and they left the inbox); returns how many."""
        taken = self.intake.take()
        if taken:
            self.waiting.extend(taken)
            if hop_trace.enabled():
                for req in taken:
                    hop_trace.mark(req.rid, "taken")
            self.publish()
        return len(taken)

    def admit(self, req: Req, cached_tokens: int, prefix_slot_ids: Sequence[int]) -> None:
        """WAITING -> PREFILLING with a locked prefix of ``cached_tokens`` tokens at ``prefix_slot_ids`` (kept as
        given: the Match reply's repeated field, which the first ForwardItem copies in C; never changed here)."""
        self.waiting.remove(req)
        if req.cached_tokens < 0:
            req.cached_tokens = cached_tokens
        req.kv_len = cached_tokens
        req.prefix_slot_ids = prefix_slot_ids
        req.worker_knows = False
        req.phase = State.PREFILL
        req.admission = next(_ADMISSIONS)
        self.running.append(req)

    def unlock(self, reqs: list[Req]) -> cache_pb2.Counters:
        """Admission deferred: lets go of the prefix locks their Match took (and their registrations), in one
        ReleaseRequests; they stay WAITING. Returns the pool's counters after the release (its receipt)."""
        reply = self.cache.release_requests([r.rid for r in reqs])
        if not reply.receipt.HasField("after"):
            raise RuntimeError(f"ReleaseRequests receipt without counters for {[r.rid for r in reqs]}")
        return reply.receipt.after

    def refuse(self, req: Req, message: str) -> None:
        """WAITING -> gone: releases its lock and fails its stream with RESOURCE_EXHAUSTED and ``message``."""
        self.cache.release_requests([req.rid])
        self.waiting.remove(req)
        req.stream.fail(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        self.intake.forget(req)

    # ---- running ---------------------------------------------------------------------------------------------
    def prefill_done(self, req: Req) -> None:
        """PREFILLING -> DECODING (its first token was sampled); ``cache_prefilled`` inserts its written prompt."""
        req.phase = State.DECODE
        self.prefilled.append(req)

    def cache_prefilled(self) -> int:
        """Makes the prompts whose prefill completed in the Forwards just applied visible to probes (a router's
        ProbePrefix) while they decode: one CacheRequests (finished=false) for all of them, deferred to the loop's
        next cache call (its Allocate for the next decode step, or an admission's Match), inserting each one's
        written tokens (``all_ids[:kv_len]``: its prompt, and on a recompute its output so far). The cache never
        remaps a running request (``Pool.cache``), so the worker's slot table for it stays right. Skipped: one
        that finished or has an abort pending in the same reply (its finish or abort caches it) and one no
        longer running. Returns how many were deferred."""
        reqs, self.prefilled = self.prefilled, []
        running = {id(r) for r in self.running}
        items, seen = [], set()
        for req in reqs:
            if (req.state == State.DECODE and not req.abort_requested and id(req) in running and req.kv_len > 0
                    and req.rid not in seen):
                seen.add(req.rid)
                items.append(written_item(req, finished=False))
        self.cache.defer_cache(items)  # sent with the loop's next cache call
        return len(items)

    def retract(self, req: Req, cache_prefix: bool) -> None:
        """Running -> WAITING, first in line: caches its written prefix (``cache_prefix``, when any was written)
        or releases it, drops it at the worker, and resets it for a recompute (its output so far is kept)."""
        if cache_prefix and req.kv_len > 0:
            self.cache.cache_requests([written_item(req, finished=True)])
        else:
            self.cache.release_requests([req.rid])
        if req.worker_knows:
            self.releases.add([req.rid])
        self.running.remove(req)
        self._requeue(req)
        self.waiting.appendleft(req)

    def fail_running(self, req: Req, message: str) -> None:
        """Running -> gone: releases it (cache, worker) and fails its stream with RESOURCE_EXHAUSTED."""
        self.cache.release_requests([req.rid])
        if req.worker_knows:
            self.releases.add([req.rid])
        self.running.remove(req)
        req.stream.fail(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        self.intake.forget(req)

    def abort(self, held: Collection[str] = ()) -> None:
        """Ends every request with an abort pending (finish "abort"): the waiting ones, and the running ones that
        no Forward in flight holds (``held``: the ids of the requests in some Forward in flight; those stay pending
        until their Forwards are applied). A running one caches what its applied Forwards wrote
        (``all_ids[:kv_len]``, as a retract does: none of its Forwards is in flight, so those K/V are written) and
        releases the rest: an editor aborts most completions mid-prefill, and the next keystroke's prompt shares
        that file prefix."""
        # O(1) per abort: only the requests flagged since the last look (no scan of the queues for flags), and
        # one pass over each queue per round that has aborts (not a remove per abort)
        self.aborting = self.intake.take_aborts(self.aborting)
        if not self.aborting:
            return
        live = (State.PREFILL, State.DECODE)
        waiting_aborted = [r for r in self.aborting if r.state == State.WAITING]
        registered = self.early.settle(waiting_aborted) if waiting_aborted and self.early is not None else []
        if registered:  # by an early Match: released now (not deferred: a waiting request never counts as held).
            # First: when it raises, every flagged request is still pending for the round after the resync
            self.cache.release_requests([r.rid for r in registered])
        running_aborted = [r for r in self.aborting if r.state in live and r.rid not in held]
        self.aborting = [r for r in self.aborting if r.state in live and r.rid in held]
        if running_aborted:
            written = [r for r in running_aborted if r.kv_len > 0]
            # deferred: sent ahead of the next admission's Match (or the next Allocate), whose counters then show it
            self.cache.defer_cache([written_item(r, finished=True) for r in written])
            self.cache.defer_release([r.rid for r in running_aborted if r.kv_len == 0])
            self.releases.add([r.rid for r in running_aborted if r.worker_knows])
        gone = {id(r) for r in waiting_aborted + running_aborted}
        if waiting_aborted:
            kept = [r for r in self.waiting if id(r) not in gone]
            self.waiting.clear()
            self.waiting.extend(kept)
        if running_aborted:
            self.running[:] = [r for r in self.running if id(r) not in gone]
        for req in waiting_aborted + running_aborted:
            req.stream.finish_without_token(Finish.ABORT)
            req.stream.close()
            self.intake.forget(req)
            self.log.info("aborted", rid=req.rid, reason=req.abort_reason, output_tokens=len(req.output_ids))

    def finish(self, finished: list[Req], in_flight: Callable[[], set[str]]) -> None:
        """Running requests that ``finished`` in the Forward just applied, and the finishing ones: those in no
        Forward still in flight (``in_flight()``: their ids) are cached (their written tokens inserted in the tree)
        and released, neither with a call of its own: at the cache deferred to the cache client's next call
        (``defer_cache``), at the worker queued in ``releases`` for the next Forward; they are answered and
        forgotten now. A finished one still in flight streams its end now and becomes FINISHING. A failure of the
        call that carries the deferred cache insert raises there (the loop resyncs; the new session frees the
        slots)."""
        if not finished and not self.finishing:
            return
        ids = in_flight()
        release = [r for r in finished + self.finishing if r.rid not in ids]
        self.finishing = [r for r in self.finishing if r.rid in ids]
        for req in finished:
            self.running.remove(req)
            if req.rid in ids:
                req.stream.close()
                self.finishing.append(req)
        if not release:
            return
        self.cache.defer_cache([written_item(r, finished=True) for r in release])
        self.releases.add([r.rid for r in release])
        self._deliver(release)

    def _deliver(self, finished: list[Req]) -> None:
        for req in finished:
            if req.stream.has_final:
                req.stream.close()
            self.intake.forget(req)
            self.log.info("finished", rid=req.rid, reason=req.finish.value, prompt_tokens=len(req.prompt_ids),
                          cached_tokens=req.cached_tokens, output_tokens=len(req.output_ids),
                          retractions=req.retractions)

    # ---- failures ---------------------------------------------------------------------------------------------
    def lose_finishing(self) -> None:
        """The Forwards in flight were dropped (a failure or a stall): FINISHING -> ORPHANED (forgotten; the new
        session frees their slots)."""
        for req in self.finishing:
            self.orphans.append(req.rid)
            self.intake.forget(req)
        self.finishing = []

    def fail_all(self, code: grpc.StatusCode, message: str) -> None:
        """Every request held or new ends: an unfinished one fails with ``code`` and ``message``; one that finished
        and was not yet answered is answered (only its release was cut short). Running ones become ORPHANED
        (a first chunk in a stale Forward may still register one at the worker)."""
        self.orphans += [r.rid for r in self.running]
        for req in list(self.waiting) + self.running + self.intake.take():
            if req.stream.has_final:
                req.stream.close()
            elif req.state != State.FINISHED:
                req.stream.fail(code, message)
            self.intake.forget(req)
        self.waiting.clear()
        self.running = []
        self.prefilled = []
        self.publish()

    def flush_releases(self) -> int:
        """The loop has nothing to run (no cache call and no Forward to carry what waits): sends the cache
        client's deferred operations (``flush_deferred``: the pool settles) and releases the pending ``releases``
        with one Release RPC (an idle worker holds no ended request's state). Returns how many worker ids were
        sent; raises the clients' errors (what was not sent stays; the resync releases it)."""
        self.cache.flush_deferred()
        ids = list(self.releases.pending)
        if ids:
            self.worker.release(ids)
            self.releases.flushed(ids)
        return len(ids)

    def resynced(self, worker_ids: list[str]) -> int:
        """After a new session (which freed every slot and lock of the old one): releases ``worker_ids`` (from
        ``worker_held_ids`` before the reconnect: the pending and carried ``releases`` among them) at the worker,
        clears the orphans and the releases, and requeues every running request first in line (recomputed; its
        output so far is kept), except one that finished before the outage, which is answered now. Returns how
        many were running. A restarted worker (new epoch) never saw these ids: it ignores them."""
        self.worker.release(worker_ids)
        self.releases.clear()
        self.orphans = []
        self.prefilled = []
        running = len(self.running)
        for req in reversed(self.running):
            if req.stream.has_final:
                req.stream.close()
                self.intake.forget(req)
                continue
            self._requeue(req)
            self.waiting.appendleft(req)
        self.running = []
        self.publish()
        return running

    @staticmethod
    def _requeue(req: Req) -> None:
        """Resets ``req`` for the waiting queue: nothing of it is in the pool any more."""
        req.kv_len = 0
        req.prefix_slot_ids = []
        req.worker_knows = False
        req.phase = State.WAITING
        req.retractions += 1
        if req.wants_prompt_logprobs:  # partially collected: start over with the full prompt
            req.prompt_logprobs.clear()
            req.prompt_top_logprobs.clear()
