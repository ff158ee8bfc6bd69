"""A prepared eager extend in two parts, launch and commit, so the next one can run behind it on the device.

With the scheduler's chunk pipeline, extend N+1 reaches the worker while extend N is on the device. Run in one part
under the engine's lock (plan, layers, sampling, read-back, commit), N held the lock until its tokens were on the
host, and N+1 could only start after that: the device idled for N's read-back, its commit and reply, then N+1's
plan and first launches (H100 run 19 call 2, 1B c64: 103 gaps between extends, p50 1.65 ms, ~230 ms of a 5.5 s
phase with N+1 already waiting at the worker).

An extend prepared at arrival (``extend_ahead``: every item brings its prefix or continues a prompt, no prompt
logprobs, eager) now runs
as a multi-step decode does (``multistep``): ``enqueue_extend`` plans, launches the layers, the sampling rows'
``lm_head`` and the draw (``sampler.sample_async``: the chosen tokens copied to page-locked memory without waiting),
under the lock; the lock is free while the device runs it (``EnqueuedExtend.wait``); ``EnqueuedExtend.finish``
commits under the lock. While N is enqueued and not committed, a prepared extend N+1 that follows it
(``after_seq``) is launched behind it (``Engine._extend_behind``): it waits, without the lock, for N's attention plan
to have been copied to the device (``planned``: flashinfer plans into page-locked buffers that N+1's plan reuses),
then plans and launches; its commit still comes after N's (``ForwardOrder``). Nothing N+1 reads depends on N's
result: its items bring their prefixes or continue a prompt whose table is known before N's commit (N's items and
the committed table: ``continuation_tables``; the commit checks it still holds), and on the device it follows N in
stream order (N's K/V of an earlier chunk is written before N+1 reads it).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from worker_svc.extend_ahead import PreparedExtend
from worker_svc.sampler import PendingSample, SampleRow, sample_async
from worker_svc.step_feed import to_device
from worker_svc.types import ForwardItem, ForwardOutput, WorkerError


class EnqueuedExtend:
    """One prepared eager extend enqueued on the device (``enqueue_extend``), not yet committed.

    ``items``, ``inputs`` (item b's new token ids): the batch; ``sampled``: the indices of the items that sample,
    in the order of ``pending``'s rows; ``planned``: a CUDA event recorded once the attention plan's copies were
    enqueued (None on the CPU), which an extend launched behind this one waits for before it plans.
    ``near_end`` is None: a multi-step decode is never launched behind an extend (``Engine._launch_behind``).
    ``guarded``: request ids whose Release waits for this commit (``PendingForwards.wait_unguarded``; set for a batch
    with continuation rows enqueued at its turn)."""

    near_end = None
    guarded: frozenset[str] = frozenset()

    def __init__(self, items: Sequence[ForwardItem], inputs: Sequence[Sequence[int]], sampled: Sequence[int],
                 pending: PendingSample | None, planned: torch.cuda.Event | None):
        self.items, self.inputs, self.sampled = tuple(items), tuple(inputs), tuple(sampled)
        self.pending, self.planned = pending, planned

    def wait_planned(self) -> None:
        """Blocks until the device has this extend's attention plan (call it without the engine's lock)."""
        if self.planned is not None:
            self.planned.synchronize()

    def wait(self) -> None:
        """Blocks until the sampled tokens are on the host (call it without the engine's lock)."""
        if self.pending is not None:
            self.pending.wait()

    def finish(self, engine, requests: Mapping[str, object]) -> tuple[ForwardOutput, ...]:
        """After ``wait()``, under the engine's lock: each item's state is created from its prefix (or, for a
        continuation row, is the request's committed state) and grows by its new slots and tokens
        (``engine.commit``); returns the outputs in item order. Raises WorkerError ABORTED, committing nothing, when
        a continuation row's request in ``requests`` (the committed table) is gone or is not ``position_start``
        long: the table it was launched against is not the one the Forwards ahead left (its K/V went to its own
        new slots, which the scheduler owns)."""
        for it in self.items:
            if it.has_prefix:
                continue
            state = requests.get(it.request_id)
            if state is None or len(state.slots) != it.position_start:
                raise WorkerError("ABORTED", f"request {it.request_id!r}: launched behind as a continuation at "
                                             f"position {it.position_start}, but the worker holds "
                                             f"{'no state' if state is None else len(state.slots)} for it at its commit")
        results = dict(zip(self.sampled, self.pending.results())) if self.pending is not None else {}
        outputs = []
        for b, it in enumerate(self.items):
            res = results.get(b)
            sampled = res is not None
            outputs.append(ForwardOutput.make(
                request_id=it.request_id, sampled=sampled, next_token_id=res.token_id if sampled else -1,
                logprob=res.logprob if sampled and it.return_logprob else 0.0, top_logprobs=res.top if sampled else (),
                prompt_logprobs=(), prompt_top_logprobs=(), next_token_ids=(), logprobs=(), skipped=False))
            engine.commit(it, it.slot_ids, self.inputs[b], res.token_id if sampled else None)
        return tuple(outputs)


def continuation_tables(items: Sequence[ForwardItem], requests: Mapping[str, object],
                        ahead: Sequence["EnqueuedExtend"]) -> dict[str, np.ndarray]:
    """The slot tables (int32) that the requests of ``items``' continuation rows (no ``has_prefix``) will have once
    the extends ``ahead`` (enqueued, not committed, in launch order) have committed on top of ``requests`` (the
    committed table): an item of one of them that brings its prefix starts the request's table from that prefix,
    any other appends its new slots. A request neither committed nor in ``ahead`` has no entry."""
    want = {it.request_id for it in items if not it.has_prefix}
    tables: dict[str, list] = {}
    for rid in want:
        state = requests.get(rid)
        if state is not None:
            tables[rid] = [state.slots.view()]
    for extend in ahead:
        for it in extend.items:
            if it.request_id in want:
                if it.has_prefix:
                    tables[it.request_id] = [np.asarray(it.prefix_slot_ids, dtype=np.int32)]
                elif it.request_id not in tables:
                    continue  # appended to a table nobody holds: its own commit fails, and so does this one
                tables[it.request_id].append(np.asarray(it.slot_ids, dtype=np.int32))
    return {rid: np.concatenate(parts) if len(parts) > 1 else parts[0] for rid, parts in tables.items()}


def sample_row(it: ForwardItem, inputs: Sequence[int]) -> SampleRow:
    """The sampling row of an item that brings its prefix: its history is the prefix and its new tokens, its
    prompt length ``prompt_len`` when given (a chunk of a longer prompt), else all of them. A continuation row gets
    an empty history: the history is read for penalties only, and a continuation that samples with penalties is
    not prepared (``extend_ahead.eligible``)."""
    new = len(inputs)
    prompt_len = it.prompt_len if it.prompt_len > 0 else it.position_start + new
    history = list(it.prefix_token_ids) + list(inputs) if it.sampling.has_penalties else []
    return SampleRow(params=it.sampling, history=history, prompt_len=prompt_len, position=it.position_start + new,
                     top_n=it.top_logprobs_num)


def enqueue_extend(engine, prepared: PreparedExtend, clock) -> EnqueuedExtend:
    """Enqueues prepared extend ``prepared`` on ``engine`` (a ``worker_svc.engine.Engine``; caller holds its lock):
    the ragged (or paged) plan, the layers (each writes its K/V at the items' slots), the ``lm_head`` of the
    sampling rows and the draw. ``clock`` (``step_clock.StepClock``) times the layers. Returns the
    ``EnqueuedExtend`` to ``wait()`` for and ``finish``."""
    items, layout = prepared.items, prepared.layout
    engine.plan(layout, eager=True)
    planned = None
    if engine.device.type == "cuda":
        planned = torch.cuda.Event()
        planned.record()
    clock.start()
    hidden = engine.model(prepared.input_ids, prepared.positions, engine.kv_pool, engine.backend, prepared.out_slots)
    clock.stop()  # the lm_head of the sampling rows runs after it: a few us of one GEMM
    sampled = [b for b, it in enumerate(items) if it.sample]
    pending = None
    if sampled:
        # the sampling rows (each item's last new token) as a device index copied through pinned memory: indexing
        # with a Python list copies it with the host waiting for the stream, here for this extend's own layers and
        # the extend ahead, with the engine's lock held (H200 run 22: ~4 ms of idle device between chained extends)
        rows = to_device(layout.last_rows[np.asarray(sampled)], engine.device)  # int64 [S]
        logits = engine.model.logits(hidden.index_select(0, rows))  # [S, vocab] float32
        pending = sample_async(logits, [sample_row(items[b], prepared.inputs[b]) for b in sampled], engine.generator)
    return EnqueuedExtend(items, prepared.inputs, sampled, pending, planned)
