"""The worker engine: request table, batch validation, forward pass and sampling. No gRPC here.

Request table: ``request_id -> RequestState`` with the slot table and token history of every token whose
K/V this worker has written (or was told is cached, via ``has_prefix``). A forward:

1. validates the whole batch (``validation.validate_batch``; nothing changes on error);
2. lays the batch out flat (``forward_batch.build_layout``), plans the attention backend, runs the model
   (``one_step.run_one_step``; a multi-step decode: ``multistep``; an extend prepared at arrival: ``extend_behind``)
   (each layer writes the new tokens' K/V at their slots): a decode batch replays a captured graph
   (``cuda_graph.DecodeGraphs``), an extend of one request of few tokens one graph of its whole forward
   (``extend_whole_graph``, when enabled), another batch of few tokens its pieces' graphs (``extend_graph``),
   the rest runs eagerly; an eager batch whose requests have no cached prefix plans the backend's ragged
   prefill (``attention.ragged``; flashinfer, unless ``ragged_prefill`` is off);
3. samples the items with ``sample=True`` from the logits of their last new token, and computes prompt
   logprobs where asked;
4. commits: each request's table grows by its new slots and tokens. The sampled token is *not* added: the
   scheduler sends it back as the next decode item's input (its K/V is written then), or, with overlapped
   decode, sends an ``input_from_last_sample`` item whose input is the token kept here (``last_token``).
   A request whose last sampled token is one of the item's ``stop_token_ids`` is ``stopped``: a later
   ``input_from_last_sample`` item of it is skipped (nothing written or committed, result ``skipped``).

Ordering: a Forward with ``after_seq`` waits (outside the lock, after the epoch check) until that Forward
completed here (``ordering.ForwardOrder``), and for every Forward that asked to run before it
(``before_seq``) while it had not started; each Forward with a ``seq`` records its outcome.

Releases: ``release`` (the Release RPC) drops requests' state at once; a Forward's ``release_ids`` are dropped
when it starts running (after its ordering wait, under the lock, before validation; ``_drop_released``), so a
release riding on a Forward never overtakes a Forward queued before it. ``has_prefix=True`` replaces whatever the
worker held for that id. Thread-safe: one forward at a time. A multi-step decode Forward runs in two parts
(``multistep``): its steps are enqueued under the lock, then the lock is free while the device runs them (a
Release RPC may drop a request meanwhile: its row is answered ``skipped``), and they are committed under it;
every other Forward waits for that commit before it validates (``pending.PendingForwards.wait_empty``).
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

import torch

from worker_svc.attention import ragged
from worker_svc.attention.base import AttentionBackend, AttentionMeta
from worker_svc.extend_ahead import PreparedExtend, prepare_extend
from worker_svc.extend_behind import EnqueuedExtend, continuation_tables, enqueue_extend
from worker_svc.forward_batch import BatchLayout, build_layout
from worker_svc.kv_pool import KVPool
from worker_svc.model.config import ModelConfig
from worker_svc.model.gpt_bigcode import GPTBigCodeForCausalLM
from worker_svc.multistep import EnqueuedSteps, Prepared, assumed_table, enqueue_multistep, prepare_rows, row_tables
from worker_svc.one_step import run_one_step
from worker_svc.request_state import RequestState, SlotTable
from worker_svc.step_clock import StepClock
from worker_svc.ordering import ForwardOrder
from worker_svc.marks import Marks
from worker_svc.pending import PendingForwards
from worker_svc.types import EngineInfo, ForwardItem, ForwardOutput, ForwardResult, WorkerError
from worker_svc.validation import validate_batch

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


class Engine:
    """Runs forward batches for one model on one device. See the module docstring for the contract."""

    def __init__(self, cfg: ModelConfig, model: GPTBigCodeForCausalLM, kv_pool: KVPool, backend: AttentionBackend,
                 *, epoch: str, worker_id: str = "worker-0", model_path: str = "", seed: int = 0, graphs=None,
                 extend_graphs=None, whole_graphs=None, ragged_prefill: bool = True, prepare_ahead: bool = True,
                 launch_behind: bool = True, extend_ahead: bool = True, extend_behind: bool = True,
                 launch_lead_steps: int = 1, hold_commit_s: float = 0.0):
        """``graphs``: an optional ``cuda_graph.DecodeGraphs`` used for decode batches that fit it;
        ``whole_graphs``: an optional ``extend_whole_graph.WholeExtendGraphs`` for the other one-request batches
        that fit it; ``extend_graphs``: an optional ``extend_graph.ExtendGraphs`` for the rest that fit it.
        ``ragged_prefill``: eager batches with no cached prefix take the backend's ragged prefill where it has one
        (``backend.ragged_prefill``: flashinfer; the torch backend has none, so this changes nothing there).
        ``prepare_ahead``: a multi-step Forward that arrives while the one it follows (``after_seq``) is enqueued
        builds its step metadata then (``_prepare_ahead``), not after that one's commit. ``launch_behind``: such a
        Forward is also launched then, behind that one on the device (``_launch_behind``; needs ``prepare_ahead``).
        ``extend_ahead``: an eager extend batch of items that bring their prefixes or continue a prompt is
        validated and laid out, its inputs copied, at arrival, outside the lock (``extend_ahead.prepare_extend``),
        not at its turn.
        ``extend_behind``: such a batch that follows another one enqueued and not yet committed is launched
        behind it on the device (``_extend_behind``; needs ``extend_ahead``).
        ``launch_lead_steps`` (>= 0, else ValueError): a Forward launched behind a multi-step one starts its launch
        when the device starts that one's step ``K - launch_lead_steps`` (1: its last step; ``EnqueuedSteps.near_end``);
        0: per Forward, ``multistep.lead_steps``. ``hold_commit_s`` (> 0: on): a multi-step Forward's commit waits up to
        that long for one coming to launch behind it (``PendingForwards.hold``; needs ``launch_behind``).
        An extend inserted ahead (``before_seq``) that reaches the worker after then runs after the launched one."""
        if launch_lead_steps < 0:
            raise ValueError(f"launch_lead_steps must be >= 0, got {launch_lead_steps}")
        self.prepare_ahead, self.launch_behind, self.extend_ahead = prepare_ahead, launch_behind, extend_ahead
        self.extend_behind, self.launch_lead_steps, self.hold_commit_s = extend_behind, launch_lead_steps, hold_commit_s
        # multi-step launches, by where their metadata came from; "behind": those launched behind the one ahead
        self.prepared_ahead = {"used": 0, "built_at_launch": 0, "behind": 0}
        self.extends_prepared = 0  # eager extend batches prepared at arrival (``_prepare_extend``)
        self.extends_behind = 0  # those launched behind the extend ahead of them (``_extend_behind``)
        self.cfg, self.model, self.kv_pool, self.backend = cfg, model, kv_pool, backend
        self.ragged_prefill = ragged_prefill and backend.ragged_prefill
        self.graphs, self.extend_graphs, self.whole_graphs = graphs, extend_graphs, whole_graphs
        self.epoch, self.worker_id, self.model_path = epoch, worker_id, model_path
        self.device = kv_pool.device
        self.requests: dict[str, RequestState] = {}
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._lock = threading.Lock()  # the request table (validation, launch, commit, release)
        self.order = ForwardOrder()
        self._seq = 0  # seq of the Forward running under the lock (``commit`` stamps the states it creates)
        # the Forwards enqueued, not yet committed (multi-step decodes, prepared extends): every other Forward waits
        # for their commits (``PendingForwards.wait_empty``) unless it is launched behind them
        self.pending = PendingForwards(self._lock)
        self.origin = None  # a forward_log.DeviceOrigin: each ForwardResult then carries its device span

    def info(self) -> EngineInfo:
        """Model facts, pool geometry, epoch."""
        c, g = self.cfg, self.kv_pool.geometry
        return EngineInfo(
            worker_id=self.worker_id, epoch=self.epoch, model_name=c.name, model_path=self.model_path,
            n_layer=c.n_layer, n_head=c.n_head, kv_heads=c.kv_heads, head_dim=c.head_dim, n_embd=c.n_embd,
            n_positions=c.n_positions, vocab_size=c.vocab_size, eos_token_id=c.eos_token_id,
            dtype=DTYPE_NAMES[self.kv_pool.dtype], kv_bytes_per_token=g.kv_bytes_per_token,
            capacity_tokens=g.capacity_tokens, page_size=g.page_size, pool_slots=g.pool_slots,
            device=str(self.device), attention_backend=self.attention_name(),
        )

    def attention_name(self) -> str:
        """The backend's name, with the decode graphs' Triton attention after a ``+`` when buckets take it
        (``flashinfer+triton-decode`` for all, ``flashinfer+triton-decode<=64`` for buckets up to 64 rows)."""
        name = self.backend.name
        if self.graphs is not None and self.graphs.triton_max_batch > 0:
            full = self.graphs.triton_max_batch >= self.graphs.max_batch
            name += "+triton-decode" + ("" if full else f"<={self.graphs.triton_max_batch}")
        return name

    def release(self, request_ids: Sequence[str]) -> int:
        """Drops the state of these requests; unknown ids are ignored. Returns how many were dropped. A request of an
        extend that took its turn with continuation rows and is not committed yet is dropped after that commit
        (``PendingForwards.wait_unguarded``: raises WorkerError ABORTED when it does not come within the turn timeout)."""
        with self._lock:
            self.pending.wait_unguarded(request_ids)
            return sum(self.requests.pop(rid, None) is not None for rid in request_ids)

    def forward(self, items: Sequence[ForwardItem], expected_epoch: str, seq: int = 0, after_seq: int = 0,
                cancelled=None, before_seq: int = 0, release_ids: Sequence[str] = (), on_run=None) -> ForwardResult:
        """Runs one batch. ``seq`` > 0 records this Forward's outcome; ``after_seq`` > 0 waits until that
        Forward completed; ``before_seq`` > 0 makes Forward ``before_seq`` wait for this one if it has not
        started yet (``ForwardOrder.insert_before``); ``cancelled()`` (optional) is asked after the wait: True
        (the caller gave up on the call meanwhile) -> ABORTED without running. ``release_ids``: requests whose
        state is dropped once the Forward may run, before its items are validated (``_drop_released``; kept
        when the batch then fails). ``on_run()`` (optional) is called when the Forward's turn came, before it is
        validated (hop tracing: the time before it is the wait for the Forwards ahead). Raises WorkerError
        (INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION, ABORTED when the Forward it follows failed or never
        completed) before any work when the batch is invalid or may not run; then nothing else has changed.
        A Forward launched behind the one it follows (``_launch_behind``) has run on the device when it is answered
        ABORTED (the one ahead failed, or it was cancelled): it commits nothing, and its K/V went to its own new slots."""
        if seq > 0 and after_seq == seq:  # before anything: nothing is registered or recorded under that seq
            raise WorkerError("INVALID_ARGUMENT", f"Forward seq {seq} cannot run after itself (after_seq {after_seq})")
        behind = None  # (steps, clock) of this Forward when it was launched behind the one it follows
        finishing = False  # _finish leaves the pending place itself
        mark = Marks()
        try:
            if expected_epoch != self.epoch:  # before waiting: a restarted worker never saw after_seq
                raise WorkerError("FAILED_PRECONDITION", f"expected_epoch {expected_epoch!r} != worker epoch "
                                                         f"{self.epoch!r} (worker restarted: re-register the pool)")
            self.order.insert_before(seq, before_seq, after_seq)
            with self.pending.coming_behind(after_seq, self.hold_commit_s > 0 and self.launch_behind
                                            and after_seq > 0 and bool(items) and items[0].decode_steps > 1):
                ahead = self._prepare_ahead(items, after_seq, mark)
                extend = self._prepare_extend(items) if ahead is None else None
                prepared_ns = time.monotonic_ns() if ahead is not None or extend is not None else -1
                if ahead is not None and self.launch_behind:
                    behind = self._launch_behind(items, seq, after_seq, ahead, release_ids, on_run, mark)
            if extend is not None and self.extend_behind and after_seq > 0:
                behind = self._extend_behind(extend, seq, after_seq, release_ids, on_run)
            self.order.wait_for(after_seq, seq)
            if after_seq > 0 and cancelled is not None and cancelled():
                raise WorkerError("ABORTED", f"Forward seq {seq} was cancelled by the caller while it waited "
                                             f"for seq {after_seq}")
            if behind is not None:
                t0 = time.perf_counter()  # from the turn: the steps ahead of it are the other Forward's time
                finishing = True
                steps, clock = behind
                outputs = self._finish(steps, (None,) * len(items), seq, release_ids, mark)
                return self._done(seq, ForwardResult(
                    outputs=outputs, forward_seconds=time.perf_counter() - t0, device_seconds=clock.seconds(),
                    device_span_ns=clock.span_ns(self.origin) if self.origin else None, prepared_ns=prepared_ns,
                    launch="behind", marks=tuple(mark.stamps)))
            clock = StepClock(self.device)
            with self._lock:
                self.pending.wait_empty(seq)
                mark("turn")
                if on_run is not None:
                    on_run()
                self._drop_released(release_ids, seq)
                self._seq = seq
                stored = ({rid for rid, s in self.requests.items() if s.last_hidden is not None}
                          if any(it.return_prompt_logprobs for it in items) else frozenset())  # read for those only
                guard = extend is not None and bool(extend.continuing)  # laid out on the committed tables: none is
                if guard:  # pending now; a Release of its requests waits for its commit (``EnqueuedExtend.guarded``)
                    extend = extend.with_tables(continuation_tables(extend.items, self.requests, ()))
                if extend is None:  # a prepared batch was validated at arrival, against no request state
                    validate_batch(items, expected_epoch, self.epoch, self.cfg, self.kv_pool.pool_slots, self.requests,
                                   stored)
                t0 = time.perf_counter()
                outputs, steps = self._launch(items, clock, ahead, extend)
                mark("launched")
                if steps is not None:
                    self.pending.add(seq, steps)
                    if guard and extend is not None:
                        steps.guarded = frozenset(it.request_id for it in items)
                    if isinstance(steps, EnqueuedExtend):
                        self.order.launched(seq)  # an extend that follows it may now be launched behind it
            if steps is not None:
                finishing = True
                outputs = self._finish(steps, outputs, seq, (), mark)
            result = ForwardResult(outputs=outputs, forward_seconds=time.perf_counter() - t0,
                                   device_seconds=clock.seconds() if clock.ran else 0.0,
                                   device_span_ns=clock.span_ns(self.origin) if clock.ran and self.origin else None,
                                   prepared_ns=prepared_ns, marks=tuple(mark.stamps))
        except BaseException as e:  # recorded for the Forwards that follow this one, then raised
            try:
                if behind is not None and not finishing:
                    self._abandon(behind[0], seq)
            finally:
                self.order.done(seq, f"{e.code}: {e.message}" if isinstance(e, WorkerError)
                                else f"{type(e).__name__}: {e}")
            raise
        return self._done(seq, result)

    def _done(self, seq: int, result: ForwardResult) -> ForwardResult:
        self.order.done(seq)
        return result

    def _launch_behind(self, items: Sequence[ForwardItem], seq: int, after_seq: int, ahead: Prepared,
                       release_ids: Sequence[str], on_run, mark: Marks) -> tuple[EnqueuedSteps, StepClock] | None:
        """Launches multi-step Forward ``seq`` behind Forward ``after_seq`` (enqueued, not yet committed), before that
        one's commit (docs/worker.md, "Launch behind"): under the lock, validates the batch against the table that
        commit will leave (``multistep.assumed_table``); waits without the lock for the device to start that one's
        step ``launch_lead_steps`` from its end (``EnqueuedSteps.near_end``); then, under the lock, checks again that
        nothing it assumed changed (``_fits_behind``), marks it started (``ForwardOrder.start_early``) and enqueues
        its steps, first inputs read from that one's tokens on the device (``multistep.behind_inputs``); rows the commit
        stops or cuts short are answered skipped at its own commit (``EnqueuedSteps.expect``). Returns (steps, clock),
        or None (nothing launched: the Forward takes its turn) when the one ahead is no longer the only pending one,
        a row's request was stopped, released, is not the state the one ahead runs or runs there with an explicit
        input, the batch releases its own requests, or on CUDA a step would run eagerly (``Prepared.graphed``)."""
        with self._lock:
            first = self.pending.only(after_seq)
            if first is None or not self._fits_behind(items, ahead, first, release_ids):
                return None
            try:  # before the wait: the table it assumes changes only by that commit or a release (checked after)
                validate_batch(items, self.epoch, self.epoch, self.cfg, self.kv_pool.pool_slots,
                               assumed_table(self.requests, first), frozenset())
            except WorkerError:
                return None  # its own turn validates it against the committed table and answers the error
        if first.near_end is not None:
            first.near_end.synchronize()  # the device is near its end: what arrives later goes behind this one
        mark("near_end")
        with self._lock:
            if self.pending.only(after_seq) is not first or not self._fits_behind(items, ahead, first, release_ids):
                return None  # the one ahead committed meanwhile (the usual turn), or a row's request was released
            if not self.order.start_early(seq, after_seq):
                return None
            if on_run is not None:
                on_run()
            clock = StepClock(self.device)
            steps = enqueue_multistep(self, items, clock, ahead, behind=first)
            mark("launched")
            self.pending.add(seq, steps)
            self.prepared_ahead["behind"] += 1
            return steps, clock

    def _fits_behind(self, items: Sequence[ForwardItem], ahead: Prepared, first: EnqueuedSteps,
                     release_ids: Sequence[str]) -> bool:
        """(Lock held.) True when multi-step batch ``items`` (its metadata ``ahead``) may launch behind pending
        Forward ``first``: every row's request is the state ``ahead`` was built on, not stopped, and, where ``first``
        runs it, the same state with its input from ``first``'s last sample; the batch releases none of its own
        requests; on CUDA every step replays a graph (``Prepared.graphed``)."""
        running = {it.request_id: st for it, st in zip(first.items, first.states)}
        if any(st is None or self.requests.get(it.request_id) is not st or st.stopped
               or (it.request_id in running and (running[it.request_id] is not st or not it.input_from_last_sample))
               for it, st in zip(ahead.rows.its, ahead.rows.states)):
            return False  # (an explicit input for a request N runs: N may stop it, which its turn answers otherwise)
        return not {it.request_id for it in items}.intersection(release_ids) and ahead.graphed(self.device)

    def _extend_behind(self, extend: PreparedExtend, seq: int, after_seq: int, release_ids: Sequence[str],
                       on_run) -> tuple[EnqueuedExtend, StepClock] | None:
        """Launches prepared extend ``seq`` behind extend ``after_seq`` (enqueued, not yet committed; module doc of
        ``extend_behind``): waits without the lock until that one is enqueued (``ForwardOrder.wait_launched``: it may
        arrive later, or wait for its own turn first) and its attention plan is on the device, then, under the lock,
        marks it started (``ForwardOrder.start_early``) and enqueues it. It commits after that one
        (``_finish``, after ``ForwardOrder.wait_for``). Extends chain so at any depth: N+2 behind N+1 while N is still
        pending. A continuation row's slot table is the one the pending extends' commits will leave
        (``extend_behind.continuation_tables``). Returns (steps, clock), or None (it takes its turn) when the one ahead
        is not the last pending Forward, a pending Forward is not a prepared extend, the batch releases its own ids, or
        a continuation row's table would not be ``position_start`` long."""
        if not self.order.wait_launched(after_seq):  # it may still wait for its own turn, or not have arrived
            return None
        with self._lock:
            first = self._extends_only(after_seq)
            if first is None:
                return None
        first.wait_planned()  # the pinned buffers of its plan are free for this one's
        with self._lock:
            if self._extends_only(after_seq) is not first:
                return None  # the one ahead committed meanwhile: the usual turn
            if {it.request_id for it in extend.items}.intersection(release_ids):
                return None
            if extend.continuing:  # the tables the commits ahead will leave (a missing one: the usual turn)
                extend = extend.with_tables(continuation_tables(extend.items, self.requests,
                                                                self.pending.steps()))
            if extend is None or not self.order.start_early(seq, after_seq):
                return None
            if on_run is not None:
                on_run()
            clock = StepClock(self.device)
            steps = enqueue_extend(self, extend, clock)
            self.pending.add(seq, steps)
            self.order.launched(seq)
            self.extends_behind += 1
            return steps, clock

    def _extends_only(self, last_seq: int) -> EnqueuedExtend | None:
        """(Lock held.) The steps of ``last_seq`` when it is the last pending Forward and all pending Forwards are
        enqueued extends, else None."""
        last = self.pending.last(last_seq, EnqueuedExtend)
        return last if last is not None and self.pending.all_of(EnqueuedExtend) else None

    def _abandon(self, steps: EnqueuedSteps | EnqueuedExtend, seq: int) -> None:
        """A Forward launched behind another gave up before its commit: its steps run out, then it leaves the
        pending place (nothing committed)."""
        try:
            steps.wait()
        finally:
            with self._lock:
                self.pending.leave(steps)

    def _prepare_ahead(self, items: Sequence[ForwardItem], after_seq: int, mark: Marks) -> Prepared | None:
        """The step metadata of multi-step batch ``items``, built now while Forward ``after_seq`` (enqueued, its
        steps on the device) is not yet committed (``multistep.row_tables`` under the lock, then
        ``multistep.prepare_rows`` without it: the commit ahead never waits for it), so its host work is not between
        the two Forwards on the device; None when that is not the pending Forward, ``prepare_ahead`` is off, or
        the batch is not one of known requests' continuations with one new slot per step, pool slots, positions
        within ``n_positions`` and each row's table ``position_start`` long (nothing is built for a batch that
        validation may reject, and nothing here raises for one: validation answers it at its turn). The launch
        uses it only while it still holds (``Prepared.valid_for``). Nothing here changes the request table."""
        if not self.prepare_ahead or after_seq <= 0 or not items:
            return None
        top = self.kv_pool.pool_slots
        if any(it.decode_steps <= 1 or it.has_prefix or len(it.slot_ids) != it.decode_steps
               or (not it.input_from_last_sample and len(it.input_ids) != 1)
               or it.position_start + it.decode_steps > self.cfg.n_positions
               or min(it.slot_ids) < 1 or max(it.slot_ids) >= top for it in items):
            return None  # validation answers it at its turn; nothing is built for a batch it may reject
        with self._lock:  # the tables are read under the lock, the metadata is built outside it
            mark("locked")
            ahead = self.pending.last(after_seq, EnqueuedSteps)
            if ahead is None or any(it.request_id not in self.requests for it in items):
                return None
            rows = row_tables(self, items, ahead)
        mark("tables")
        if rows is None:
            return None
        return prepare_rows(self, items, rows)

    def _prepare_extend(self, items: Sequence[ForwardItem]) -> PreparedExtend | None:
        """``extend_ahead.prepare_extend`` for this engine (None when ``extend_ahead`` is off), outside the lock."""
        if not self.extend_ahead:
            return None
        prepared = prepare_extend(items, cfg=self.cfg, pool_slots=self.kv_pool.pool_slots, epoch=self.epoch,
                                  device=self.device, runs_eager=self._runs_eager)
        if prepared is not None:
            self.extends_prepared += 1
        return prepared

    def _runs_eager(self, layout: BatchLayout) -> bool:
        """True when no captured graph (decode, whole extend, extend pieces) takes ``layout``:
        ``one_step.run_one_step`` runs it eagerly."""
        return not any(g is not None and g.fits(layout) for g in (self.graphs, self.whole_graphs, self.extend_graphs))

    def _finish(self, steps: EnqueuedSteps, outputs, seq: int, release_ids: Sequence[str],
                mark: Marks) -> tuple[ForwardOutput, ...]:
        """The second part of a multi-step Forward: waits for its steps without the lock, then commits under the
        lock (after dropping ``release_ids``: a Forward launched behind another applies its releases here, after
        that one's commit). It leaves the pending place whatever happens (and wakes the Forwards waiting for their
        turn)."""
        try:
            steps.wait()
        except BaseException:
            with self._lock:
                self.pending.leave(steps)
            raise
        mark("woke")
        with self._lock:  # the commit and the leaving in one hold: no Forward sees it committed and still pending
            try:
                self.pending.hold(seq, self.hold_commit_s)  # a Forward coming behind this one launches first
                self._drop_released(release_ids, seq)
                self._seq = seq
                done = iter(steps.finish(self, self.requests))
                return tuple(next(done) if o is None else o for o in outputs)
            finally:
                self.pending.leave(steps)
                mark("committed")

    def _drop_released(self, request_ids: Sequence[str], seq: int) -> None:
        """Drops the state of ``request_ids`` (lock held) for Forward ``seq``; unknown ids are ignored. With seq > 0
        a state created by a Forward with a larger seq is kept: a newer request reused the id and its extend ran
        ahead of this Forward (the scheduler numbers Forwards in the order it builds them and releases an id on
        a Forward built after its request ended)."""
        for rid in request_ids:
            state = self.requests.get(rid)
            if state is not None and not (seq > 0 and state.created_seq > seq):
                del self.requests[rid]

    def _launch(self, items: Sequence[ForwardItem], clock: StepClock, ahead: Prepared | None = None,
                extend: PreparedExtend | None = None):
        """(Lock held.) Runs the items that are not skipped (continuations of stopped requests) and answers those
        skipped; ``clock`` times the model's steps. A multi-step batch is only enqueued: returns (outputs with None
        where its rows' outputs will come, its ``EnqueuedSteps``, which ``_finish`` waits for and commits); any
        other batch runs to its commit: (outputs, None). ``ahead``: a multi-step batch's metadata built before its
        turn (``_prepare_ahead``), used when still valid (``Prepared.valid_for``; ``prepared_ahead`` counts both ways);
        ``extend``: an eager batch prepared at arrival (``_prepare_extend``): enqueued (``extend_behind.enqueue_extend``),
        committed by ``_finish``."""
        if extend is not None:  # its items bring their prefixes (continuation rows only launched behind): none skipped
            return (None,) * len(items), enqueue_extend(self, extend, clock)
        skip = [it.input_from_last_sample and self.requests[it.request_id].stopped for it in items]
        run = [it for it, s in zip(items, skip) if not s]
        steps = None
        if run and any(it.decode_steps > 1 for it in run):
            ahead = ahead if ahead is not None and ahead.valid_for(run, self.requests) else None
            self.prepared_ahead["used" if ahead is not None else "built_at_launch"] += 1
            steps = enqueue_multistep(self, run, clock, ahead)
            done = iter([None] * len(run))
        else:
            done = iter(run_one_step(self, run, clock) if run else ())
        return tuple(ForwardOutput(request_id=it.request_id, sampled=False, skipped=True) if s else next(done)
                     for it, s in zip(items, skip)), steps

    def item_inputs(self, it: ForwardItem) -> tuple[int, ...]:
        """The item's new input token ids: ``input_ids``, or (the request's kept last token,) for
        ``input_from_last_sample`` (validated present)."""
        if it.input_from_last_sample:
            return (self.requests[it.request_id].last_token,)
        return tuple(it.input_ids)

    def warmup(self) -> None:
        """Runs two extends (without a cached prefix, the ragged path when it is on, and over one) and one decode
        step on slots 1..3 (no request state is kept), so the attention kernels are compiled before serving. The
        garbage K/V written there is overwritten by later use."""
        with self._lock:
            dev = self.device
            s = [1 + i % (self.kv_pool.pool_slots - 1) for i in range(3)]  # slots 1, 2, 3 (fewer in tiny pools)
            for prefix, new, table in (([0], [2], [s[:2]]), ([1], [2], [s]), ([2], [1], [s])):
                layout = build_layout(prefix, new, table)
                self.plan(layout, eager=True)
                ids = torch.zeros(layout.num_tokens, dtype=torch.long, device=dev)
                hidden = self.model(ids, torch.from_numpy(layout.positions).to(dev), self.kv_pool, self.backend,
                                    torch.from_numpy(layout.out_slots).to(dev))
                self.model.logits(hidden).sum().item()

    def plan(self, layout: BatchLayout, eager: bool) -> None:
        """Plans the backend once for ``layout``: the ragged prefill when ``eager`` (the
        model's forward runs it, handing each layer's new K/V to attention) and ``attention.ragged`` picks it,
        else the paged plan."""
        meta = AttentionMeta.from_layout(layout, self.device)
        if ragged.takes_ragged(layout, enabled=self.ragged_prefill, eager=eager):
            self.backend.plan_ragged(meta)
        else:
            self.backend.plan(meta)

    # -- internals -------------------------------------------------------------------------------------

    def prompt_len(self, it: ForwardItem) -> int:
        """The item's prompt length: ``prompt_len`` when given, else the request's, else (a first chunk that brings
        its prefix) every token up to its last new one."""
        if it.prompt_len > 0:
            return it.prompt_len
        if not it.has_prefix:
            return self.requests[it.request_id].prompt_len
        return it.position_start + len(it.input_ids)

    def commit(self, it: ForwardItem, slots, tokens, last_token: int | None,
               last_hidden: torch.Tensor | None = None) -> None:
        """Records that ``tokens`` (K/V written at ``slots``, same length) follow the request's history, creating
        its state from the item's prefix when ``has_prefix``. ``last_token``: the token sampled last (None: none;
        the input of a later ``input_from_last_sample`` item; the request is stopped when it is one of the item's
        stop ids). ``last_hidden`` [n_embd]: the hidden row of the last written token, kept when the next chunk
        needs it for prompt logprobs. The one commit of every Forward path (one step and multi-step)."""
        if it.has_prefix:
            state = RequestState(slots=SlotTable(it.prefix_slot_ids), tokens=list(it.prefix_token_ids),
                                 prompt_len=self.prompt_len(it), created_seq=self._seq)
            self.requests[it.request_id] = state
        else:
            state = self.requests[it.request_id]
            if it.prompt_len > 0:
                state.prompt_len = it.prompt_len
        state.slots.extend(slots)
        state.tokens.extend(tokens)
        state.commits += 1
        state.last_token, state.stopped = last_token, last_token is not None and last_token in it.stop_token_ids
        state.last_hidden = last_hidden
