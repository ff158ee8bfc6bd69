"""The scheduling loop. One thread runs it; each round (``Scheduler.step``) is: take new requests, end aborted
ones, plan a batch (extend first, decode otherwise; ``planner.py``), send it to the worker, apply the reply
(``results.py``), and cache and release finished requests (``requests.py``, the request table, the one owner of
where each request stands). Failures and the way back are ``recovery.py``'s.

Overlapped decode (``overlap``, default; SGLang's overlap scheduler over our services, ``_chain``): in steady decode
the loop allocates decode Forward N+1 while the worker computes N, sends it, then applies N's reply (detokenize,
stream) while the worker computes N+1. N+1 holds the same running requests, slots allocated ahead; each item's input
is the token the worker sampled last for it (``input_from_last_sample``) at the predicted position ``start + steps``
of its N entry, and ``after_seq = N.seq`` makes the worker run it after N. A request predicted to reach
max_new_tokens (capped by the context limit) in N is left out of N+1; one that ends at a stop token in N is in N+1
and the worker skips it. N's stream messages are handed to their streams once N+2 is sent (``outbox.py``).

While N runs the loop waits for N's reply or an arrival. An arrival with room is admitted at once (Match, Allocate),
its extend sent to run after N (``after_seq``), ahead of N+1 if N+1 has not started at the worker (``before_seq``;
``--overlap-mode queued``, the default, sends N+1 at once; ``just-in-time`` after N's reply and the last extend). The
decode after such extends is sent behind the last one (``chain.chain_past``). ``--chain-depth 2``: N+2 is sent once
N's reply is in, before N is applied (``chain.chain_ahead``). Chaining happens in steady decode (``chain.py``), else
the loop drains. A request finishing in N but in a Forward still in flight streams its end at once, released after
that one (FINISHING). Chunked prefill pipelined: ``chunk_ahead.py``. Worker releases ride on the next ForwardRequest,
or a Release. Steps: ``step_budget.py``; all of it: docs/scheduler.md.
"""

from __future__ import annotations

import threading
import time

import grpc

from scheduler_svc.admission import NewTokenRatio
from scheduler_svc import results
from scheduler_svc.arrival_gate import ArrivalGate
from scheduler_svc.batch import Batch, forward_items
from scheduler_svc.cache_client import CacheClient
from scheduler_svc.chunk_ahead import can_send_ahead
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.early_match import EarlyMatch
from scheduler_svc.errors import DependencyUnavailable, PoolHeld, SessionLost, WorkerEpochChanged, WorkerStalled
from scheduler_svc.intake import Intake
from scheduler_svc.liveness import WorkerLiveness
from scheduler_svc.outbox import Outbox
from scheduler_svc.pipeline import Pipeline
from scheduler_svc.chain import admits_first, can_chain, chain_ahead, chain_past, chained_pair, wait_reply_or_arrival
from scheduler_svc.planner import Planner
from scheduler_svc.recovery import Recovery
from scheduler_svc.request import Req
from scheduler_svc.requests import RequestTable
from scheduler_svc.stats import Stats
from scheduler_svc.step_budget import StepBudget, steps_run
from scheduler_svc.worker_client import WorkerClient

__all__ = ["Scheduler", "SchedulerConfig"]


class Scheduler:
    """Waiting queue, admission on cache receipts, continuous batching with chunked prefill, retract.

    Built of plain parts, each handed what it uses: ``table`` (RequestTable: where each request stands, the only
    releases), ``planner`` (the next batch), ``pipeline`` (the Forwards in flight), ``recovery`` (connection,
    failures, resync), ``outbox`` (stream messages held while the next Forward is built), ``stats`` (counters).

    Thread-safe: ``submit``, ``abort``, ``queue_lengths``, ``progress_ok``, ``unhealthy_reason``, ``outage_reason``,
    ``stop``; the rest runs on the loop thread (``run``). Requests' ``out`` get GenerateResponses, then a StreamEnd.
    """

    def __init__(self, cache: CacheClient, worker: WorkerClient, cfg: SchedulerConfig, log,
                 liveness: WorkerLiveness | None = None) -> None:
        """``liveness``: the worker's health-check monitor (None: no stall detection, only the Forward deadline)."""
        self.cache, self.worker, self.log = cache, worker, log
        self.intake = Intake(cfg.max_queued_requests)
        self._stop = threading.Event()
        self._stats = Stats()
        self.ratio = NewTokenRatio()
        self.early = EarlyMatch(cache, settings=lambda: self.cfg, waiting=lambda: self.table.snapshot[1])
        self.table = RequestTable(cache, worker, self.intake, log, early=self.early)
        self.pipeline = Pipeline(worker, self.table.releases)
        self.outbox = Outbox()  # stream messages of a chained decode held until the next Forward is sent (outbox.py)
        self.budget = StepBudget()  # decode steps under arrivals (used with cfg.adaptive_steps)
        self.planner = Planner(self.table, cache, cfg, self.ratio, self._stats, log, self.budget, self.early)
        self.recovery = Recovery(cache, worker, cfg, log, liveness, self.table, self.pipeline, self._stop)
        self._cfg = cfg

    cfg = property(lambda self: self._cfg)

    @cfg.setter
    def cfg(self, cfg: SchedulerConfig) -> None:
        """Replaces the settings of the loop and its parts (before ``run``: e.g. decode steps once the device is known)."""
        self._cfg = self.planner.cfg = self.recovery.cfg = cfg

    # ---- read-only views ----------------------------------------------------------------------------------
    @property
    def info(self):
        """The worker's WorkerInfo (None before ``connect``)."""
        return self.recovery.info

    @property
    def capacity(self) -> int:
        """The pool's capacity in tokens, as registered (0 before ``connect``)."""
        return self.recovery.capacity

    @property
    def stats(self) -> dict:
        """The loop's counters (``scheduler_svc/stats.py``), cumulative."""
        return self._stats.counts

    def metrics_text(self) -> str:
        """The loop's Prometheus metrics as text (``Stats.render_metrics``: decode steps per Forward)."""
        return self._stats.render_metrics()

    last_batch_at = property(lambda self: self._stats.last_batch_at)  # time.monotonic() of the last Forward
    running = property(lambda self: self.table.running)  # list[Req]
    waiting = property(lambda self: self.table.waiting)

    # ---- thread-safe API -------------------------------------------------------------------------------
    def submit(self, req: Req) -> None:
        """Queues a validated request. Raises QueueFull, SchedulerStopped, ValueError (id in use), WorkerStalled
        (the worker does not answer health checks: fail fast, never queue behind a frozen worker)."""
        if self.worker_stalled():
            raise self.recovery.stall_error()
        self.early.submit(req, lambda on_accept: self.intake.submit(req, self.table.snapshot[1], on_accept))

    def worker_stalled(self) -> bool:
        """True when the worker has not answered health checks past the stall timeout (False without liveness)."""
        return self.recovery.worker_stalled()

    def abort(self, rid: str, reason: str = "aborted by client") -> bool:
        """Flags a live request for abort; the loop frees it within one step. False when unknown."""
        return self.intake.abort(rid, reason)

    @property
    def stopped_reason(self) -> str:
        return self.intake.stopped_reason

    def progress_ok(self) -> bool:
        """False when the loop stopped, the worker is stalled, or work waits or runs and no batch completed within
        progress_timeout."""
        return not self.unhealthy_reason()

    def unhealthy_reason(self) -> str:
        """Why ``progress_ok`` is False ("" when it is True)."""
        if self.stopped_reason:
            return self.stopped_reason
        if self.worker_stalled():
            return str(self.recovery.stall_error())
        since = time.monotonic() - max(self.last_batch_at, self.intake.busy_since)
        if self.intake.busy() and since > self.cfg.progress_timeout:
            return f"no batch completed for {since:.0f} s (progress timeout {self.cfg.progress_timeout:g} s) while work waits or runs"
        return ""

    def outage_reason(self) -> str:
        """Why no batch can run now though health may be SERVING ("" when one can): ``Recovery.outage_reason``."""
        return self.recovery.outage_reason()

    def queue_lengths(self) -> tuple[int, int, int]:
        """(running, waiting, waiting prompt tokens), new requests not yet taken by the loop included. Running counts
        every request whose slots are not yet released (``RequestTable.held``): idle means the pool is settled."""
        running, waiting, tokens = self.table.snapshot
        new, new_tokens = self.intake.inbox_stats()
        return running, waiting + new, tokens + new_tokens

    def load_of_others(self, router_id: str) -> tuple[int, int, int]:
        """(live, waiting, waiting tokens) of the calls not sent by router ``router_id`` (``Intake.load_of_others``)."""
        return self.intake.load_of_others(router_id)

    def stop(self, reason: str) -> None:
        self.intake.stop(reason)
        self._stop.set()

    def connect(self) -> None:
        """Opens the cache session and registers the pool (``Recovery.connect``)."""
        self.recovery.connect()

    # ---- the loop --------------------------------------------------------------------------------------
    def run(self) -> None:
        """Runs until ``stop``. Dependency outages: back off and resync; after outage_timeout s, waiting and running
        requests fail with UNAVAILABLE naming the service. A stalled worker: every request fails with UNAVAILABLE at
        once; the loop resyncs when it answers again. Any other exception fails every request with INTERNAL, stops
        the loop and is re-raised. The pool held by another owner's session (``PoolHeld``, at a resync): the loop
        stops (NOT_SERVING, the process exits), every request fails with UNAVAILABLE naming the pool and that owner;
        no retry (it would fight the other scheduler for the pool). Held stream messages go out before any failure."""
        rec = self.recovery
        try:
            while not self._stop.is_set():
                try:
                    if rec.worker_stalled():
                        rec.on_worker_stalled(rec.stall_error(), self.intake.wake)
                        continue
                    rec.note_worker_refusal()
                    if rec.needs_resync:
                        self.outbox.release()  # (a stall or outage fails streams: OutputStream.fail releases first)
                        rec.resync()
                    with self.outbox.released_on_error():
                        worked = self.step()
                    rec.up()
                except WorkerStalled as exc:
                    rec.on_worker_stalled(exc, self.intake.wake)
                    continue
                except (DependencyUnavailable, SessionLost, WorkerEpochChanged) as exc:
                    rec.on_dependency_error(exc)
                    continue
                except PoolHeld as exc:  # another owner's scheduler took the pool while we were away: stop, no retry
                    self.stop(f"cannot serve: {exc}")
                    self.log.error("pool_held", error=str(exc))
                    break
                if not worked:
                    self.intake.wake.wait(0.2)
                    self.intake.wake.clear()
        except BaseException as exc:
            self.stop(f"scheduler loop failed: {type(exc).__name__}: {exc}")
            self.log.exception("loop_failed")
            rec.fail_all(grpc.StatusCode.INTERNAL, self.stopped_reason)
            raise
        self.outbox.release()
        rec.fail_all(grpc.StatusCode.UNAVAILABLE, f"scheduler stopped: {self.stopped_reason}")

    def step(self) -> bool:
        """One round: intake; with a Forward in flight, chain the next one in steady decode, send the extend behind
        an extend (chunked prefill pipelined), or drain; aborts; plan a batch; send it (overlapped decode, an extend
        with more behind it) or run it and apply its reply. Returns False when there was nothing to run."""
        table = self.table
        self.budget.took(table.take_new())  # arrivals, for the decode steps
        self.recovery.renew_session()
        drained = False
        if self.pipeline:
            table.abort(held=self.pipeline.request_ids())  # aborts no Forward in flight holds end now: a waiting
            # request aborted before this round is not admitted by the drain below
            if len(self.pipeline) > 1 and self.pipeline.head().batch.kind == "extend":
                self.outbox.release()
                self._drain_extends()  # arrivals' extends sent ahead of a decode Forward: theirs first
                table.abort(held=self.pipeline.request_ids())  # and those that came while it drained
            if ((len(self.pipeline) == 1 or chained_pair(self.pipeline))
                    and can_chain(self.pipeline.head().batch, table.running, len(table.waiting), self.cfg)):
                self._chain()  # releases the outbox once its Forward is sent
                table.abort(held=self.pipeline.request_ids())
                table.publish()
                return True
            self.outbox.release()
            if self.cfg.chunk_pipeline and len(self.pipeline) == 1 and self._ahead(self.pipeline.head().batch):
                self._chunk_ahead()
                table.abort(held=self.pipeline.request_ids())
                table.publish()
                return True
            self._drain()
            drained = True
        self.outbox.release()
        table.abort()
        t0 = time.perf_counter()
        batch = self.planner.extend() or self.planner.decode()
        if batch is None:  # idle: no cache call and no Forward to carry what is deferred
            flushed = table.flush_releases()
            table.publish()  # after the cache's deferred releases: an idle scheduler's pool is settled
            return flushed > 0 or drained
        table.publish()
        if batch.kind == "decode" and self.cfg.overlap:
            self.pipeline.send(batch, self.pipeline.prepare(self._items(batch)))
            self._stats.decode_sent(time.perf_counter() - t0)
            return True
        if (self.cfg.chunk_pipeline and self._ahead(batch)) or can_chain(batch, table.running, len(table.waiting), self.cfg):
            self.pipeline.send(batch, self.pipeline.prepare(self._items(batch)))
            return True
        t1 = time.perf_counter()
        request = self.pipeline.prepare(self._items(batch))
        reply = self.recovery.reply(self.worker.send(request))
        t2 = time.perf_counter()
        self._apply(batch, reply, request.seq, t0, t1, t2)
        return True

    # ---- Forwards ----------------------------------------------------------------------------------------
    def _items(self, batch: Batch) -> list:
        return forward_items(batch, self.recovery.info.eos_token_id)

    def _apply(self, batch: Batch, reply, seq: int, t0: float, t1: float, t2: float) -> None:
        """Applies ``reply`` (of Forward ``seq``, answered OK: the worker releases it carried are done) to the table
        and releases what finished, its stream messages sent together at its end (``Outbox.batched``); a decode
        round's timing (``t0`` round start, ``t1`` .. ``t2`` waiting for the reply) is recorded."""
        with self.outbox.batched():
            self.table.releases.answered(seq)
            finished = results.apply(batch, reply, self.table, self._stats)
            self.table.finish(finished, self.pipeline.request_ids)
            self._stats.add("prompts_cached_at_prefill", self.table.cache_prefilled())
            self.table.publish()
            if batch.kind == "decode":  # the share of a decode step spent outside the worker's forward
                self.budget.measured(steps_run(batch.entries, reply.results), reply)
                now = time.perf_counter()
                self._stats.decode_applied(batch, reply.forward_seconds, wall=now - t0, rpc=t2 - t1, process=now - t2)

    def _drain(self) -> None:
        """Applies the in-flight Forwards in order."""
        while self.pipeline:
            t0 = time.perf_counter()
            reply = self.recovery.reply(self.pipeline.head().pending)
            cur = self.pipeline.pop()
            self._apply(cur.batch, reply, cur.seq, t0, t0, time.perf_counter())

    def _drain_extends(self) -> None:
        """Applies the extends in flight ahead of the decode Forward at the pipeline's tail, admitting while each runs
        (``_admit_until``: after the last extend, ahead of that decode): first the requests already waiting (they do
        not wait for this extend's reply unless two extends are queued, ``arrival_gate.py``), then arrivals."""
        admit_now = admits_first(len(self.table.waiting), len(self.table.running), self.cfg)
        past = None  # the decode the next one was chained past, its reply in (``chain.chain_past``)
        with self.recovery.dropping_in_flight():
            while len(self.pipeline) > 1 and self.pipeline.head().batch.kind == "extend":
                head, tail = self.pipeline.head(), self.pipeline.inflight[-1]
                if tail.batch.kind == "decode":
                    past = past or chain_past(self.pipeline, self.planner, self.table, self.cfg, self._items, self._stats)
                    last = next(f.seq for f in reversed(self.pipeline.inflight) if f.batch.kind == "extend")
                    self._admit_until(head.pending, last, self.pipeline.inflight[-1].seq, admit_now)
                    admit_now = False
                t0 = time.perf_counter()
                reply = self.recovery.reply(head.pending)
                self._apply(self.pipeline.pop().batch, reply, head.seq, t0, t0, time.perf_counter())
                if past is not None and self.pipeline and self.pipeline.head() is past:  # it ran first: applied now
                    t0 = time.perf_counter()
                    self._apply(self.pipeline.pop().batch, self.recovery.reply(past.pending), past.seq, t0, t0, t0)

    def _admit_until(self, pending, extend_after: int, ahead_of: int, admit_now: bool) -> int:
        """Until ``pending``'s reply is in, admits arrivals (first the waiting, with ``admit_now``) as ``ArrivalGate`` lets
        them, each extend after the previous one (first: ``extend_after``), ahead of ``ahead_of`` (0: none); returns the
        last seq. While nothing arrives, the cache operations deferred so far go out (``CacheClient.flush_deferred``)."""
        gate = ArrivalGate.of(self.pipeline, self.table, self.cfg, self.intake.wake)
        admit_now = gate.admit_first(admit_now, len(self.table.running) < self.cfg.max_running_requests)
        while (admit_now and gate.open(True, True)) or wait_reply_or_arrival(
                pending, self.intake.wake, lambda: self._admissible_arrival(gate), self.cache.flush_deferred):
            admit_now = False
            self.table.abort(held=self.pipeline.request_ids())  # one aborted while the gate held it: not prefilled
            extend = self.planner.extend(new_only=True)  # admitted ones are in an extend already sent
            self.table.publish()
            if extend is not None:
                request = self.pipeline.prepare(self._items(extend), after_seq=extend_after, before_seq=ahead_of)
                extend_after = gate.watch(self.pipeline.send(extend, request)).seq
                self._stats.add("extends_ahead")
        return extend_after

    def _chain(self) -> None:
        """Steady decode, or N an extend ending every prefill (``can_chain``): allocate N+1 while N runs (``queued``: send it
        now; the outbox goes out); until N's reply, arrivals are admitted, each extend after N (``queued``: ahead of N+1;
        not behind an extend: a burst waits for one extend next round); (``just-in-time``) N+1 sent; N applied. Chain
        depth 2: N+1 may be in flight already (``chained_pair``: nothing is built), and N+2 goes once N's reply is in,
        before N is applied (``chain_ahead``; then N's messages are not held)."""
        t0 = time.perf_counter()
        cur, queued = self.pipeline.head(), self.cfg.overlap_mode == "queued"
        sent = self.pipeline.inflight[-1] if chained_pair(self.pipeline) else None
        nxt = None if sent else self.planner.continuation(cur.batch)
        # built now, while N runs: only the send waits for N's reply (just-in-time)
        nxt_request = self.pipeline.prepare(self._items(nxt), after_seq=cur.seq) if nxt is not None else None
        if nxt is None or not queued:  # the messages held since the last round wait for N+1's build (queued: send)
            self.outbox.release()
        t1 = time.perf_counter()
        with self.recovery.dropping_in_flight():  # N failed: what follows it at the worker is aborted there
            ahead_of = sent.seq if sent else 0  # queued: extends run ahead of N+1 if they reach the worker before it
            if nxt is not None and queued:
                self.pipeline.send(nxt, nxt_request)
                self.outbox.release()  # the streams run while the worker does (a failure: run() releases)
                self._stats.add("decode_chained")
                ahead_of = nxt_request.seq
            extend_after = cur.seq if cur.batch.kind == "extend" else self._admit_until(  # waiting first, then arrivals
                cur.pending, cur.seq, ahead_of, admits_first(len(self.table.waiting), len(self.table.running), self.cfg))
            if nxt is not None and not queued:
                nxt_request.after_seq = extend_after
                self.pipeline.send(nxt, nxt_request)
                self._stats.add("decode_chained")
            reply = self.recovery.reply(cur.pending)  # a stall ends the wait (an extend at the head admits nothing)
            ahead = chain_ahead(self.pipeline, self.planner, self.table, self.cfg, self._items, self._stats,
                                self.recovery.info.eos_token_id)
        self.pipeline.pop()
        if self.cfg.deliver_after_send and nxt is not None and cur.batch.kind == "decode" and not ahead:
            self.outbox.hold()  # N's messages go out once the next round sent its Forward (outbox.py)
        self._apply(cur.batch, reply, cur.seq, t0, t1, time.perf_counter())

    def _ahead(self, inflight: Batch) -> bool:
        return can_send_ahead(inflight, self.table.running, len(self.table.waiting), self.cfg.max_running_requests)

    def _chunk_ahead(self) -> None:
        """Chunked prefill pipelined (``chunk_ahead.py``): while extend k runs, plans, allocates and sends the extend
        behind it (``after_seq = k``: the chunks that follow, admissions in the budget left), then applies k. A
        failure of k or of a cache call drops what is in flight (the worker aborts what follows k; resync requeues)."""
        cur = self.pipeline.head()
        with self.recovery.dropping_in_flight():
            nxt = self.planner.extend_ahead(cur.batch)
            self.table.publish()
            if nxt is not None:
                self.pipeline.send(nxt, self.pipeline.prepare(self._items(nxt), after_seq=cur.seq))
                self._stats.add("chunks_ahead")
            reply = self.recovery.reply(cur.pending)
        self.pipeline.pop()
        now = time.perf_counter()
        self._apply(cur.batch, reply, cur.seq, now, now, now)

    def _admissible_arrival(self, gate: ArrivalGate) -> bool:
        """Takes new requests; True when ``gate`` opens (``arrival_gate.py``; admission may still defer them). Raises
        WorkerStalled when the worker has stopped answering health checks."""
        if self.recovery.worker_stalled():
            raise self.recovery.stall_error()
        return gate.open(bool(self.budget.took(self.table.take_new())), len(self.table.running) < self.cfg.max_running_requests)
