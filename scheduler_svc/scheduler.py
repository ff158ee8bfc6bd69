"""The scheduling loop: admit -> build a batch (extend first, decode otherwise) -> Worker.Forward ->
process results -> cache and release finished requests. One thread runs it and owns all request state.
With ``overlap`` (default) steady decode is pipelined: Forward N+1 is allocated while N runs and sent
before N's reply is processed; a request that arrives meanwhile has its extend sent to run right after N
(``scheduler_svc/overlap.py``).

Frozen worker (``liveness``, ``--worker-stall-timeout``): every wait for a Forward reply also watches the
worker's health checks (``scheduler_svc/liveness.py``). When the worker has not answered them for the stall
timeout, the loop stops waiting and fails the requests of the Forwards in flight and everything running or
waiting with UNAVAILABLE naming the worker; new requests are refused at once while it stays silent. Their cache
state is released as after any dependency failure: the resync opens a new session (the cache frees every slot
and lock of the old one) and releases the requests at the worker. Safety of the resumed worker's stale writes:
the Forwards in flight are not cancelled but kept (``_stale``), and the resync first waits until each has
answered (its reply or its error, bounded by the Forward deadline). The worker runs Forwards one at a time under
its engine lock, so an answered Forward has finished writing K/V; only then is any new Forward sent. A stale
Forward writes only slots that its own requests owned (never slots in the radix tree: finished requests are
inserted after the Forward that wrote them was processed); the new session frees those slots, so new requests
may get them, and their K/V is written by Forwards that run after the stale one. Nothing stale is read as
valid K/V. (A freeze longer than the Forward deadline ends the wait with DEADLINE_EXCEEDED: then the guarantee
rests on the engine lock alone, which holds for a Forward that was running or waiting for the lock when the
worker froze.)"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import grpc

from codeserve.v1 import cache_pb2
from scheduler_svc.admission import NewTokenRatio
from scheduler_svc.batch import Batch, forward_item
from scheduler_svc.batch_formation import BatchFormation
from scheduler_svc.cache_client import CacheClient
from scheduler_svc.errors import DependencyUnavailable, SessionLost, WorkerEpochChanged, WorkerStalled
from scheduler_svc.intake import Intake
from scheduler_svc.liveness import WorkerLiveness
from scheduler_svc.multistep import apply_tokens, stop_ids
from scheduler_svc.overlap import Pipeline
from scheduler_svc.overlap_mode import DEFAULT_OVERLAP_MODE, OVERLAP_MODES
from scheduler_svc.request import Finish, Req, State
from scheduler_svc.worker_client import PendingForward, WorkerClient

STALL_POLL_S = 0.25  # seconds between looks at the worker's liveness while a Forward reply is awaited


@dataclass(frozen=True)
class SchedulerConfig:
    """Loop settings (tokens for sizes, seconds for times)."""

    pool_id: str = "default"
    max_running_requests: int = 64
    chunk_size: int = 512
    policy: str = "fcfs"
    max_queued_requests: int = 1024
    progress_timeout: float = 30.0
    outage_timeout: float = 30.0
    owner: str = "scheduler-0"
    lease_seconds: float = 30.0
    decode_steps: int = 1  # > 1: multi-step decode, up to this many steps per Forward (scheduler_svc/multistep.py)
    overlap: bool = True  # steady decode sends Forward N+1 before processing N (scheduler_svc/overlap.py)
    # when N+1 is sent (overlap_mode.OVERLAP_MODES): "queued" at once; "just-in-time" when N's reply is in
    overlap_mode: str = DEFAULT_OVERLAP_MODE

    def __post_init__(self) -> None:
        if self.overlap_mode not in OVERLAP_MODES:
            raise ValueError(f"overlap_mode must be one of {', '.join(OVERLAP_MODES)}, got {self.overlap_mode!r}")


class Scheduler(BatchFormation):
    """Waiting queue, admission on cache receipts, continuous batching with chunked prefill, retract.

    Thread-safe entry points: ``submit``, ``abort``, ``load``, ``progress_ok``. Everything else runs on
    the loop thread (``run``). Requests' ``out`` queues receive GenerateResponse messages and a StreamEnd.
    """

    def __init__(self, cache: CacheClient, worker: WorkerClient, cfg: SchedulerConfig, log,
                 liveness: WorkerLiveness | None = None) -> None:
        """``liveness``: the worker's health-check monitor (None: no stall detection, waits end only with the
        Forward deadline)."""
        self.cache, self.worker, self.cfg, self.log, self.liveness = cache, worker, cfg, log, liveness
        self.intake = Intake(cfg.max_queued_requests)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.ratio = NewTokenRatio()
        self._stop = threading.Event()
        self._needs_resync = False
        self._orphans: list[str] = []
        self._down_since: float | None = None
        self._last_renew = 0.0
        self.info = None
        self.capacity = 0
        self.last_batch_at = time.monotonic()
        self.snapshot = (0, 0, 0)  # (running, waiting, waiting tokens), published by the loop every round
        self.pipeline = Pipeline(self)  # overlap: Forwards sent and not yet processed, in order
        self._aborts: list[Req] = []  # flagged (Intake.take_aborts) and not yet freed: running ones wait for the loop
        self._zombies: list[Req] = []  # finished (end streamed) but in an in-flight Forward: released after it
        self._stale: list[PendingForward] = []  # sent before a failure or stall; answered before any new Forward
        self._alloc_s = 0.0  # seconds of the last decode batch's Cache.Allocate
        self._seq = time.time_ns() // 1000  # Forward seq, unique per worker epoch across scheduler restarts
        # Decode rounds, cumulative seconds (logged by loop_stats; bench/ derives the outside share):
        # wall = the loop's time in decode rounds; alloc = Cache.Allocate; rpc = sending Forward and waiting
        # for its reply (with overlap: only the wait left after the loop's own work); process = results.
        # chained: Forwards sent before the previous reply was processed; dropped: results of requests that
        # had finished in the previous Forward (sent ahead for them, then dropped); extends_ahead: extends of
        # requests that arrived while a decode Forward ran, sent to run right after it.
        self.stats = dict(batches=0, prefix_query=0, prefix_hit=0, prompt_tokens=0, generation_tokens=0,
                          retractions=0, decode_batches=0, decode_steps=0, decode_wall_seconds=0.0,
                          decode_forward_seconds=0.0, decode_alloc_seconds=0.0, decode_rpc_seconds=0.0,
                          decode_process_seconds=0.0, decode_chained=0, decode_dropped=0, extends_ahead=0)

    # ---- thread-safe API -------------------------------------------------------------------------------
    def submit(self, req: Req) -> None:
        """Queues a validated request. Raises QueueFull, SchedulerStopped, ValueError (id in use), WorkerStalled
        (the worker does not answer health checks: fail fast, never queue behind a frozen worker)."""
        if self.worker_stalled():
            raise self._stall_error()
        self.intake.submit(req, self.snapshot[1])

    def worker_stalled(self) -> bool:
        """True when the worker has not answered health checks past the stall timeout (False without liveness)."""
        return self.liveness is not None and self.liveness.stalled()

    def abort(self, rid: str, reason: str = "aborted by client") -> bool:
        """Flags a live request for abort; the loop frees it within one step. False when unknown."""
        return self.intake.abort(rid, reason)

    @property
    def stopped_reason(self) -> str:
        return self.intake.stopped_reason

    def progress_ok(self) -> bool:
        """False when the loop stopped, the worker is stalled, or work waits or runs and no batch completed
        within progress_timeout."""
        return not self.unhealthy_reason()

    def unhealthy_reason(self) -> str:
        """Why ``progress_ok`` is False ("" when it is True)."""
        if self.stopped_reason:
            return self.stopped_reason
        if self.worker_stalled():
            return str(self._stall_error())
        since = time.monotonic() - max(self.last_batch_at, self.intake.busy_since)
        if self.intake.busy() and since > self.cfg.progress_timeout:
            return f"no batch completed for {since:.0f} s (progress timeout {self.cfg.progress_timeout:g} s) while work waits or runs"
        return ""

    def queue_lengths(self) -> tuple[int, int, int]:
        """(running, waiting, waiting prompt tokens), new requests not yet taken by the loop included."""
        running, waiting, tokens = self.snapshot
        new, new_tokens = self.intake.inbox_stats()
        return running, waiting + new, tokens + new_tokens

    def stop(self, reason: str) -> None:
        self.intake.stop(reason)
        self._stop.set()

    # ---- start-up and resync ---------------------------------------------------------------------------
    def connect(self) -> None:
        """Opens a new cache session (releasing everything of an older one), registers the pool with the
        worker's epoch (a new epoch flushes it). Raises the clients' errors."""
        opened = self.cache.open_session(self.cfg.owner, self.cfg.lease_seconds)
        self.info = self.worker.info()
        self.worker.epoch = self.info.epoch
        member = cache_pb2.PoolMember(worker_id=self.info.worker_id, epoch=self.info.epoch,
                                      capacity_tokens=self.info.capacity_tokens)
        reg = self.cache.register_pool(self.info.page_size, [member])
        self.capacity = reg.capacity
        self._last_renew = time.monotonic()
        self.log.info("connected", session=opened.session_id, replaced=opened.replaced_session_id,
                      epoch=self.info.epoch, capacity=reg.capacity, page_size=reg.page_size, flushed=reg.flushed)

    def _resync(self) -> None:
        """After a worker restart, a lost session or an outage: drop worker state, reconnect, requeue
        every running request at the front (it is recomputed; its output so far is kept)."""
        self.pipeline.drop()
        self._await_stale()  # no new Forward while one sent before may still run (raises WorkerStalled)
        rids = self._orphans + [r.rid for r in self.running if r.worker_knows]
        self.connect()  # raises while the cache or the worker is still down
        self.worker.release(rids)  # same epoch: drop its slot tables; new epoch: it knows none of them
        self._orphans = []
        for req in reversed(self.running):
            if req.stream.has_final:  # finished before the outage: deliver it, the new session freed its slots
                req.stream.close()
                self._forget(req)
                continue
            req.requeued()
            self.waiting.appendleft(req)
        self.log.warning("resynced", requeued=len(self.running))
        self.running = []
        self._needs_resync = False
        self._publish()

    # ---- the loop --------------------------------------------------------------------------------------
    def run(self) -> None:
        """Runs until ``stop``. Dependency outages: back off and resync; after outage_timeout s of outage,
        waiting and running requests fail with UNAVAILABLE naming the service. A stalled worker: every request
        fails with UNAVAILABLE at once, and the loop resyncs when the worker answers again. Any other exception
        fails every request with INTERNAL, marks the loop stopped and is re-raised."""
        try:
            while not self._stop.is_set():
                try:
                    if self.worker_stalled():
                        self._on_worker_stalled(self._stall_error())
                        continue
                    if self._needs_resync:
                        self._resync()
                    worked = self.step()
                    self._down_since = None
                except WorkerStalled as exc:
                    self._on_worker_stalled(exc)
                    continue
                except (DependencyUnavailable, SessionLost, WorkerEpochChanged) as exc:
                    self._on_dependency_error(exc)
                    continue
                if not worked:
                    self.intake.wake.wait(0.2)
                    self.intake.wake.clear()
        except BaseException as exc:
            self.stop(f"scheduler loop failed: {type(exc).__name__}: {exc}")
            self.log.exception("loop_failed")
            self._fail_all(grpc.StatusCode.INTERNAL, self.stopped_reason)
            raise
        self._fail_all(grpc.StatusCode.UNAVAILABLE, f"scheduler stopped: {self.stopped_reason}")

    def step(self) -> bool:
        """One round. Returns False when there was nothing to run. With a Forward in flight: chain the next
        one in steady decode, or drain it and take the synchronous path."""
        self._intake()
        self._renew_session()
        drained = False
        if self.pipeline:
            if self.pipeline.chainable():
                self.pipeline.chain()
                self._apply_aborts(running=False)
                self._publish()
                return True
            self.pipeline.drain()
            drained = True
        self._apply_aborts()
        t0 = time.perf_counter()
        batch = self._extend_batch() or self._decode_batch()
        self._publish()
        if batch is None:
            return drained
        if batch.kind == "decode" and self.cfg.overlap:
            self.pipeline.send(batch)
            self.stats["decode_rpc_seconds"] += time.perf_counter() - t0 - self._alloc_s
            self.stats["decode_wall_seconds"] += time.perf_counter() - t0
            return True
        t1 = time.perf_counter()
        reply = self._reply(self.worker.forward_async(self._items(batch), self.next_seq()))
        t2 = time.perf_counter()
        self._process(batch, reply)
        self._publish()
        if batch.kind == "decode":  # the share of a decode step spent outside the worker's forward
            self._decode_stats(batch, reply, wall=time.perf_counter() - t0, rpc=t2 - t1, process=time.perf_counter() - t2)
        return True

    # ---- Forwards ----------------------------------------------------------------------------------------
    def next_seq(self) -> int:
        """The seq of the next Forward (unique per worker epoch; the worker orders Forwards by it)."""
        self._seq += 1
        return self._seq

    def _items(self, batch: Batch) -> list:
        eos = self.info.eos_token_id
        return [forward_item(e, stop_ids(e.req, eos) if e.sample else ()) for e in batch.entries]

    def _decode_stats(self, batch: Batch, reply, wall: float, rpc: float, process: float) -> None:
        st = self.stats
        st["decode_batches"] += 1
        st["decode_steps"] += max(e.steps for e in batch.entries)
        st["decode_wall_seconds"] += wall
        st["decode_forward_seconds"] += reply.forward_seconds
        st["decode_rpc_seconds"] += rpc
        st["decode_process_seconds"] += process

    def _on_dependency_error(self, exc: Exception) -> None:
        now = time.monotonic()
        self._needs_resync = True
        if self._down_since is None:
            self._down_since = now
        down = now - self._down_since
        self.log.warning("dependency_error", error=str(exc), kind=type(exc).__name__, down_seconds=round(down, 3))
        if isinstance(exc, DependencyUnavailable) and down > self.cfg.outage_timeout:
            self._intake()
            self._fail_all(grpc.StatusCode.UNAVAILABLE,
                           f"{exc} for {down:.0f} s; request not completed (retry later)")
        self._stop.wait(min(2.0, 0.1 * 2 ** min(int(down), 5)) if isinstance(exc, DependencyUnavailable) else 0)

    # ---- frozen worker ---------------------------------------------------------------------------------
    def _reply(self, pending: PendingForward):
        """``pending``'s reply (raises what ``PendingForward.result`` raises). Raises WorkerStalled when the
        worker stops answering health checks first; ``pending`` is then stale (the resync waits for it)."""
        if self.liveness is not None:
            self._wait_answered(pending)
        return pending.result()

    def _wait_answered(self, pending: PendingForward) -> None:
        """Waits until ``pending`` has its reply or error (bounded by the Forward deadline); raises WorkerStalled
        (keeping ``pending`` stale unless it is in flight, where ``Pipeline.drop`` finds it) when the worker is
        stalled meanwhile (never without ``liveness``)."""
        if pending.done():
            return
        answered = threading.Event()
        pending.add_done_callback(answered.set)
        while not answered.wait(STALL_POLL_S):
            if self.worker_stalled():
                if not self.pipeline.holds(pending) and pending not in self._stale:
                    self._stale.append(pending)
                raise self._stall_error()

    def _await_stale(self) -> None:
        """Before any new Forward: waits until every Forward sent before a failure or stall has answered, so
        the worker is done with it (it runs Forwards one at a time under its engine lock)."""
        while self._stale:
            self._wait_answered(self._stale[0])
            self._stale.pop(0)

    def _stall_error(self) -> WorkerStalled:
        lv = self.liveness
        worker = self.info.worker_id if self.info is not None else "?"
        return WorkerStalled(f"worker {worker} has not answered health checks for {lv.unresponsive_for():.1f} s "
                             f"(stall timeout {lv.stall_timeout_s:g} s; last probe: {lv.last_error}); the request "
                             f"was not completed: retry when the worker answers again")

    def _on_worker_stalled(self, exc: WorkerStalled) -> None:
        """Fails every request (in flight, running, waiting, new) with UNAVAILABLE and ``exc``'s message; a
        resync follows when the worker answers again (when anything was sent or held). Waits a moment."""
        sent = bool(self.running or self.pipeline or self._zombies or self._stale)
        self._intake()
        failed = len(self.waiting) + len(self.running)
        if failed or sent:
            self.log.error("worker_stalled", error=str(exc), failed=failed, in_flight=len(self.pipeline),
                           stale=len(self._stale))
        self._fail_all(grpc.StatusCode.UNAVAILABLE, str(exc))
        self._needs_resync = self._needs_resync or sent
        self.intake.wake.wait(STALL_POLL_S)
        self.intake.wake.clear()

    def _fail_all(self, code: grpc.StatusCode, message: str) -> None:
        self.pipeline.drop()
        self._orphans += [r.rid for r in self.running]  # a first chunk in a stale Forward may still register it
        for req in list(self.waiting) + self.running + self.intake.take():
            if req.stream.has_final:
                req.stream.close()  # it completed; only its release was cut short (the next session frees it)
            elif req.state != State.FINISHED:
                req.stream.fail(code, message)
            self._forget(req)
        self.waiting.clear()
        self.running = []
        self._publish()

    def _intake(self) -> int:
        """Moves new requests to the waiting queue; returns how many."""
        taken = self.intake.take()
        if taken:  # publish at once: the queue bound reads inbox + snapshot, and they left the inbox
            self.waiting.extend(taken)
            self._publish()
        return len(taken)

    def _forget(self, req: Req) -> None:
        self.intake.forget(req)

    def _publish(self) -> None:
        """Running counts every request whose slots are not yet released: finished ones still in a Forward in
        flight (overlap), and orphans (failed by a stall or a dependency error; the resync's new session frees
        their slots): idle means the pool is settled."""
        self.snapshot = (len(self.running) + len(self._zombies) + len(self._orphans), len(self.waiting),
                         sum(len(r.prompt_ids) + len(r.output_ids) for r in self.waiting))

    def _renew_session(self) -> None:
        if time.monotonic() - self._last_renew >= self.cfg.lease_seconds / 3:
            self.cache.renew_session()
            self._last_renew = time.monotonic()

    def _apply_aborts(self, running: bool = True) -> None:
        """Frees aborted requests; ``running=False`` (a Forward in flight holds the running ones) only
        the waiting ones."""
        self._aborts = self.intake.take_aborts(self._aborts)
        if not self._aborts:
            return
        waiting_aborted = [r for r in self._aborts if r.state == State.WAITING]
        running_aborted = [r for r in self._aborts if r.state in (State.PREFILL, State.DECODE)] if running else []
        self._aborts = [r for r in self._aborts if r.state in (State.PREFILL, State.DECODE) and not running]
        if running_aborted:  # never insert unwritten KV: release, not cache
            self.cache.release_requests([r.rid for r in running_aborted])
            self.worker.release([r.rid for r in running_aborted if r.worker_knows])
        gone = {id(r) for r in waiting_aborted + running_aborted}
        if waiting_aborted:  # one pass per round with aborts, not one per abort
            kept = [r for r in self.waiting if id(r) not in gone]
            self.waiting.clear()
            self.waiting.extend(kept)
        if running_aborted:
            self.running[:] = [r for r in self.running if id(r) not in gone]
        for req in waiting_aborted + running_aborted:
            req.stream.finish_without_token(Finish.ABORT)
            req.stream.close()
            self._forget(req)
            self.log.info("aborted", rid=req.rid, reason=req.abort_reason, output_tokens=len(req.output_ids))

    # ---- results ---------------------------------------------------------------------------------------
    def _process(self, batch: Batch, reply) -> None:
        """Applies a Forward's results. Requests that finished while the previous Forward was processed
        (zombies, in this one only to be dropped) are released now; requests that finish now and are in
        the in-flight Forward become zombies (end streamed now, released after it)."""
        results = {r.request_id: r for r in reply.results}
        missing = [e.req.rid for e in batch.entries if e.req.rid not in results]
        if missing:
            raise RuntimeError(f"Forward answered no result for requests {missing}")
        finished: list[Req] = []
        for e in batch.entries:
            req, res = e.req, results[e.req.rid]
            if req.state == State.FINISHED:  # a zombie: it ended in the previous Forward
                self.stats["decode_dropped"] += 1
                continue
            if res.skipped:
                if req.abort_requested:  # it stopped in the Forward before, whose tokens the abort dropped
                    continue
                raise RuntimeError(f"worker skipped {req.rid} (stopped at a stop token) but the scheduler "
                                   f"has not seen it finish")
            req.worker_knows, req.prefix_slot_ids = True, []
            req.kv_len = e.start + (len(res.next_token_ids) if e.steps > 1 else e.n)
            if req.wants_prompt_logprobs:
                req.prompt_logprobs.extend(res.prompt_logprobs)
                req.prompt_top_logprobs.extend(res.prompt_top_logprobs)
            if req.abort_requested:
                continue
            if e.steps > 1:
                if not res.next_token_ids or len(res.next_token_ids) > e.steps:
                    raise RuntimeError(f"worker returned {len(res.next_token_ids)} tokens for {req.rid} "
                                       f"({e.steps} decode steps)")
                self.stats["generation_tokens"] += apply_tokens(req, e.start, res.next_token_ids, res.logprobs)
            elif e.sample:
                if not res.sampled:
                    raise RuntimeError(f"worker did not sample for {req.rid} (sample=true)")
                if req.state == State.PREFILL:
                    req.state = State.DECODE
                    self.stats["prompt_tokens"] += len(req.prompt_ids) if req.retractions == 0 else 0
                self.stats["generation_tokens"] += 1
                req.stream.on_token(res.next_token_id, res.logprob,
                                    res.top_logprobs if req.params.top_logprobs_num else None)
            elif req.pending_tokens == 0:  # prompt computed, nothing to generate (max_new_tokens 0)
                req.stream.finish_without_token(Finish.LENGTH)
            if req.state == State.FINISHED:
                finished.append(req)
        self.stats["batches"] += 1
        self.last_batch_at = time.monotonic()
        in_flight = self.pipeline.request_ids()
        release = [r for r in finished + self._zombies if r.rid not in in_flight]
        self._zombies = [r for r in self._zombies if r.rid in in_flight]
        for req in finished:
            self.running.remove(req)
            if req.rid in in_flight:  # stream its end now; release after the in-flight Forward
                req.stream.close()
                self._zombies.append(req)
        if release:
            self._cache_finished(release)

    def _cache_finished(self, finished: list[Req]) -> None:
        """Inserts each finished request's written tokens into the tree and releases it (cache and worker);
        the ones not yet streamed end their stream. They are no longer in ``running``. When a call fails, the
        error propagates (the dependency path resyncs), but the requests are answered and forgotten all the same
        (their output is complete) and become orphans, which the resync releases at the worker (the new cache
        session frees their slots): they are in no list the failure path walks, so they would hang otherwise."""
        try:
            self.cache.cache_requests([cache_pb2.CacheItem(request_id=r.rid, token_ids=r.all_ids[:r.kv_len],
                                                           finished=True) for r in finished])
            self.worker.release([r.rid for r in finished])
        except Exception:
            self._orphans += [r.rid for r in finished]
            raise
        finally:
            self._deliver(finished)

    def _deliver(self, finished: list[Req]) -> None:
        for req in finished:
            if req.stream.has_final:
                req.stream.close()
            self._forget(req)
            self.log.info("finished", rid=req.rid, reason=req.finish.value, prompt_tokens=len(req.prompt_ids),
                          cached_tokens=req.cached_tokens, output_tokens=len(req.output_ids),
                          retractions=req.retractions)
