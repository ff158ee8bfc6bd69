"""Multi-step decode: up to K decode steps in one Forward, with no host round trip between steps.

A batch whose items carry ``decode_steps`` (k_b >= 1, K = max k_b) runs K steps. Step j runs the rows with
k_b > j (rows are ordered by k_b, largest first, so the active rows are a prefix and the next step's input
ids are a slice of a device tensor): row b writes the K/V of its input at ``slot_ids[j]`` (position
``position_start + j``) and samples its next token on the device, which is the input of step j + 1. On
CUDA with ``DecodeGraphs`` each step replays the captured graph of its bucket. The sampled ids (and
logprobs) of all steps are read back once, at the end.

A Forward runs in two parts (``enqueue_multistep`` and ``EnqueuedSteps.finish``): the first enqueues every step
and the asynchronous read-back of their tokens, then the engine's lock is free while the device runs them (every
other Forward waits for the commit; a Release RPC may run), and ``finish`` waits for the tokens and commits.

A row that samples one of its ``stop_token_ids`` at step i keeps running to k_b (its later K/V goes to
its own slots, which stay unused), but only tokens up to and including the stop token are returned and
committed: K/V counts as written for ``len(next_token_ids)`` tokens. The scheduler sends the stop ids
(EOS unless ignore_eos, and the request's stop token ids); stop strings and max_new_tokens are its job.

Sampling is the same as ``sampler.sample`` for the parameters allowed here (no penalties, no top-N):
greedy rows take the argmax of the same logits, seeded rows draw with the generator seeded from
(seed, absolute position), so output does not depend on how many steps one Forward runs.
"""

from __future__ import annotations

import bisect
import operator
from typing import Mapping, NamedTuple, Sequence

import numpy as np
import torch

from worker_svc.attention.base import AttentionMeta
from worker_svc.forward_batch import DecodeSteps
from worker_svc.sampler import argmax_rows, draw_non_greedy
from worker_svc.step_feed import StepFeed, to_device
from worker_svc.types import ForwardItem, ForwardOutput
from worker_svc.validation import HeldState


def sample_on_device(logits: torch.Tensor, items: Sequence[ForwardItem], positions: Sequence[int],
                     generator: torch.Generator | None) -> torch.Tensor:
    """One token per row without reading anything back. logits [N, V] float32; ``positions[i]``: absolute
    position of the token row i samples (for seeded draws). Returns int64 [N] on logits' device."""
    chosen = argmax_rows(logits)
    draw_non_greedy(logits, chosen, [it.sampling for it in items], positions, generator)
    return chosen


def _host_copy(t: torch.Tensor, cuda: bool) -> torch.Tensor:
    """A host copy of device tensor ``t``, enqueued without waiting on CUDA (page-locked destination)."""
    if not cuda:
        return t.clone()
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t, non_blocking=True)
    return out


AUTO_LEAD_ROWS = 64  # ``launch_lead_steps`` 0: Forwards of more rows are launched behind two steps from their end


def lead_steps(launch_lead_steps: int, rows: int) -> int:
    """The steps from the end of a multi-step Forward of ``rows`` rows at whose start the Forward behind it is
    launched (``Engine._launch_behind``): ``launch_lead_steps``, or with 0 (auto, an A/B arm until measured) 2 above
    ``AUTO_LEAD_ROWS`` rows and 1 at or below. Session 29 (H100, bench/README.md): lead 2 took ~50 ms of decode gaps
    off a c256 phase (a 256-row launch, 3-4 ms of host work, about one step, then ends before the Forward ahead does)
    but cost c64 ~1.1k tok/s (an arrival's extend reaching the worker in the last two steps waits for the Forward
    launched behind)."""
    if launch_lead_steps:
        return launch_lead_steps
    return 2 if rows > AUTO_LEAD_ROWS else 1


class EnqueuedSteps:
    """The enqueued steps of one multi-step decode Forward, rows ordered by steps (largest first).

    ``toks`` int64 [K, B] (and ``lps`` float32 [K, B] when a row asked for logprobs) on the device: row b's
    token of step j; ``host_toks``/``host_lps``: their asynchronous copies (page-locked on CUDA), valid once
    ``wait()`` returned. ``states``: the request state each row was validated against (None for a ``has_prefix``
    row), so a row whose request was released meanwhile is answered ``skipped`` instead of committed. ``near_end``:
    a CUDA event recorded before the launch of step ``K - lead_steps(engine.launch_lead_steps, B)`` (the first when K is no larger;
    None on the CPU or for one step), which a Forward launched
    behind this one waits for (``Engine._launch_behind``). ``expect``: for a Forward launched behind another
    (``launch_behind``), each row's (table length, commits) that the Forward ahead's commit must leave for the row's
    steps to stand; a row whose state differs at the commit (the Forward ahead stopped it, or cut it short) is
    answered ``skipped`` and commits nothing. ``guarded``: as ``EnqueuedExtend``'s, none."""

    guarded: frozenset[str] = frozenset()

    def __init__(self, items, order, states, toks, lps, near_end=None, expect=None):
        self.items, self.order, self.states = items, order, states
        self.toks, self.lps = toks, lps
        self.near_end = near_end  # CUDA event: the device started step K - lead (None: CPU, one step)
        self.expect = expect  # launched behind: (table length, commits) each row's state must have at the commit
        cuda = toks.device.type == "cuda"
        self.host_toks = _host_copy(toks, cuda)
        self.host_lps = _host_copy(lps, cuda) if lps is not None else None
        self._ready = None
        if cuda:
            self._ready = torch.cuda.Event()
            self._ready.record()

    def wait(self) -> None:
        """Blocks until every step ran and the tokens are on the host (call it without the engine's lock)."""
        if self._ready is not None:
            self._ready.synchronize()

    def finish(self, engine, requests: Mapping[str, object]) -> tuple[ForwardOutput, ...]:
        """After ``wait()``, under the engine's lock: commits each row's written tokens and returns the outputs in
        the order of the items given to ``enqueue_multistep``. A row whose request state is no longer the one it
        was validated against (released meanwhile) is answered ``skipped`` and commits nothing (its K/V went to
        its own new slots, which the scheduler owns)."""
        rows_toks = self.host_toks.numpy().T.tolist()  # [B][steps] ints
        rows_lps = self.host_lps.numpy().T.tolist() if self.host_lps is not None else None
        outputs: list = [None] * len(self.items)
        for row, (b, it) in enumerate(zip(self.order, self.items)):
            state = self.states[row]
            if state is not None:
                if requests.get(it.request_id) is not state or (
                        self.expect is not None and (state.stopped or (len(state.slots), state.commits) != self.expect[row])):
                    outputs[b] = ForwardOutput(request_id=it.request_id, sampled=False, skipped=True)
                    continue
                first = state.last_token if it.input_from_last_sample else it.input_ids[0]
            else:
                first = it.input_ids[0]
            got = rows_toks[row][: it.decode_steps]
            stops = it.stop_token_ids
            n = next((i + 1 for i, t in enumerate(got) if t in stops), len(got)) if stops else len(got)
            del got[n:]
            lp = tuple(rows_lps[row][:n]) if rows_lps is not None and it.return_logprob else ()
            outputs[b] = ForwardOutput.make(request_id=it.request_id, sampled=True, next_token_id=got[-1],
                                            logprob=lp[-1] if lp else 0.0, top_logprobs=(), prompt_logprobs=(),
                                            prompt_top_logprobs=(), next_token_ids=tuple(got), logprobs=lp,
                                            skipped=False)
            got.insert(0, first)  # written: the input, then every sampled token but the last
            engine.commit(it, it.slot_ids[:n], got[:n], last_token=got[n])
        return tuple(outputs)


class Rows(NamedTuple):
    """A multi-step batch's rows ordered by steps, largest first (``row_tables``): ``order[r]`` the item index of
    row r, ``its`` the items in that order, ``ks`` their steps, ``states`` their request states (None for
    ``has_prefix``), ``prefixes`` their prefix slot tables (int32), ``commits`` the states' commit counts at which
    those tables hold."""

    order: list[int]
    its: list[ForwardItem]
    ks: list[int]
    states: list
    prefixes: list[np.ndarray]
    commits: list[int]


class Prepared:
    """The sorted rows and step metadata of a multi-step Forward, built before it may run: ``prepare_rows``
    builds it while the Forward ahead of it (``after_seq``) is still on the device, so the host work of the
    metadata (``StepFeed``: host arrays, pinned copies, the device gather; ``DecodeSteps`` on the eager path) is
    off the device's idle time between two Forwards. Row b's prefix is the request's committed slots, followed,
    when the pending Forward runs that request, by that Forward's new slots (what its commit will append when no
    stop token cuts it).

    ``valid_for(items, requests)`` says whether it still describes the Forward at its launch: the same item
    objects, and every row's request state the same object with the committed length and the number of commits it
    assumed (so the Forward ahead committed every step of the row, nothing else committed in between, not even
    after a stop that left the row as long as assumed; nothing was released or stopped);
    otherwise the launch builds the metadata again (``enqueue_multistep``)."""

    def __init__(self, items: Sequence[ForwardItem], rows: Rows, feed: StepFeed | None, eager: DecodeSteps | None):
        self.items, self.rows, self.feed, self.eager = tuple(items), rows, feed, eager

    def valid_for(self, items: Sequence[ForwardItem], requests: Mapping[str, object]) -> bool:
        if len(items) != len(self.items) or any(a is not b for a, b in zip(items, self.items)):
            return False
        r = self.rows
        for it, state, prefix, c in zip(r.its, r.states, r.prefixes, r.commits):
            if state is None:  # has_prefix: its prefix is the item's
                continue
            if (requests.get(it.request_id) is not state or len(state.slots) != len(prefix) or state.commits != c
                    or state.stopped):
                return False
        return True

    def graphed(self, device: torch.device) -> bool:
        """On CUDA: every step replays a decode graph (what ``Engine._launch_behind`` needs: a Triton bucket plans
        nothing, a flashinfer bucket plans through the graphs' ring of page-locked buffers, ``attention.plan_ring``;
        an eager step would plan the eager backend, whose one page-locked buffer the Forward ahead may still be
        copying from). Elsewhere (the CPU runs each step as it is enqueued): True."""
        return device.type != "cuda" or self.feed is not None


def _sorted_rows(items: Sequence[ForwardItem]):
    order = sorted(range(len(items)), key=lambda b: -items[b].decode_steps)  # active rows = a prefix
    its = [items[b] for b in order]
    return order, its, [it.decode_steps for it in its]


def row_tables(engine, items: Sequence[ForwardItem], ahead: EnqueuedSteps | None = None) -> Rows | None:
    """(Caller holds the engine's lock.) The ``Rows`` of multi-step batch ``items``. The items' requests are known or ``has_prefix``
    (the caller checks: ``Engine._prepare_ahead``, or validation). ``ahead``: the enqueued, not yet committed
    Forward this one runs after; a row whose request it runs gets that Forward's new slots after its committed ones
    (what its commit appends when no stop cuts it) and one commit more. Returns None when ``ahead`` is given and a
    row's table would not be ``position_start`` long (validation rejects such a batch: nothing is built for it)."""
    order, its, ks = _sorted_rows(items)
    requests = engine.requests
    states = [None if it.has_prefix else requests[it.request_id] for it in its]
    pending = {} if ahead is None else {it.request_id: (it, st) for it, st in zip(ahead.items, ahead.states)}
    prefixes, commits = [], []
    for it, state in zip(its, states):
        if it.has_prefix:  # K/V before this Forward
            prefixes.append(np.asarray(it.prefix_slot_ids, dtype=np.int32))
            commits.append(0)
            continue
        table = state.slots.view()  # the committed rows; a later commit appends past them, never rewrites them
        run = pending.get(it.request_id)
        if run is not None and run[1] is state:
            table = np.concatenate([table, np.asarray(run[0].slot_ids, dtype=np.int32)])
        if ahead is not None and len(table) != it.position_start:
            return None
        prefixes.append(table)
        commits.append(state.commits + (run is not None and run[1] is state))
    return Rows(order, its, ks, states, prefixes, commits)


def prepare_rows(engine, items: Sequence[ForwardItem], rows: Rows) -> Prepared:
    """The ``Prepared`` metadata of ``items`` from their ``row_tables`` (no lock needed: it reads only them and
    the engine's graphs, and enqueues its device work on the current stream). Raises ValueError when a row has not
    one new slot per step."""
    new = [it.slot_ids for it in rows.its]
    feed = eager = None
    if engine.graphs is not None and len(rows.its) <= engine.graphs.max_batch:
        # CUDA graphs: every step's metadata is built on the device (worker_svc/step_feed.py)
        feed = StepFeed(rows.prefixes, new, rows.ks, engine.device, bucket=engine.graphs.bucket)
    else:  # every row's full table (prefix + all its new slots) once; each step's layout slices it
        eager = DecodeSteps(rows.prefixes, new, rows.ks)
    return Prepared(items, rows, feed, eager)


def enqueue_multistep(engine, items: Sequence[ForwardItem], clock, prepared: Prepared | None = None,
                      behind: EnqueuedSteps | None = None) -> EnqueuedSteps:
    """Enqueues a validated multi-step decode batch on ``engine`` (a ``worker_svc.engine.Engine``; caller holds
    its lock); ``clock`` (``step_clock.StepClock``) times the steps, from the first one's launch to the last
    one's end. ``prepared``: its rows and metadata built ahead (``prepare_rows``; the caller checked
    ``Prepared.valid_for``), or None: built here. ``behind``: the enqueued, not yet committed Forward this one is
    launched behind (``Engine._launch_behind``; ``prepared`` then holds the tables as its commit will leave them):
    the rows it runs take their first input from its tokens on the device (``behind_inputs``) and the result
    carries each row's ``expect``. Returns the ``EnqueuedSteps`` to ``wait()`` for and ``finish``."""
    dev = engine.device
    if prepared is None:
        prepared = prepare_rows(engine, items, row_tables(engine, items))
    order, its, ks, states = prepared.rows.order, prepared.rows.its, prepared.rows.ks, prepared.rows.states
    feed, eager = prepared.feed, prepared.eager
    steps = ks[0]
    active = [bisect.bisect_left(ks, -j, key=operator.neg) for j in range(steps)]  # rows with k > j
    if behind is not None:
        cur = behind_inputs(behind, prepared.rows, dev)
    else:
        first = [it.input_ids[0] if state is None or not it.input_from_last_sample else state.last_token
                 for it, state in zip(its, states)]
        cur = to_device(np.asarray(first, dtype=np.int64), dev)  # [B] int64 on the device: inputs of this step
    want_lp = any(it.return_logprob for it in its)
    all_greedy = all(it.sampling.greedy for it in its)
    toks = torch.zeros((steps, len(its)), dtype=torch.long, device=dev)
    lps = torch.zeros((steps, len(its)), dtype=torch.float32, device=dev) if want_lp else None
    near_end = None
    planned = None  # eager steps on CUDA: an event after the last plan's copies (flashinfer plans into one page-locked
    # buffer and copies it to the device asynchronously: the next plan must not overwrite it before that copy ran)
    near_step = max(steps - lead_steps(engine.launch_lead_steps, len(its)), 0)
    clock.start()
    for j in range(steps):
        if j == near_step and steps > 1 and dev.type == "cuda":
            near_end = torch.cuda.Event()  # completes when the device starts step K - lead (a Forward behind waits)
            near_end.record()
        n = active[j]
        ids = cur[:n]
        picked = None  # the graph's greedy pick of every row (int64 [n]), when a graph ran the step
        if feed is not None:
            logits, picked = engine.graphs.run_step(feed, j, ids)  # [n, vocab] in the model's dtype, [n]
        else:
            layout = eager.layout(j, n)
            if planned is not None:
                planned.synchronize()
            engine.backend.plan(AttentionMeta.from_layout(layout, dev))
            if dev.type == "cuda":
                planned = torch.cuda.Event()
                planned.record()
            hidden = engine.model(ids, to_device(layout.positions, dev), engine.kv_pool, engine.backend,
                                  to_device(layout.out_slots, dev))
            logits = engine.model.logits(hidden)
        if all_greedy:  # what sample_on_device gives when no row draws
            nxt = argmax_rows(logits) if picked is None else picked
        else:
            logits = logits.float()
            nxt = sample_on_device(logits, its[:n], [it.position_start + j + 1 for it in its[:n]], engine.generator)
        if lps is not None:
            lps[j, :n] = torch.log_softmax(logits.float(), dim=-1).gather(1, nxt[:, None])[:, 0]
        toks[j, :n] = nxt
        cur = nxt  # rows past n never run again (k sorted, largest first)
    clock.stop()
    expect = [(len(p), c) for p, c in zip(prepared.rows.prefixes, prepared.rows.commits)] if behind is not None else None
    return EnqueuedSteps(its, order, states, toks, lps, near_end=near_end, expect=expect)


def behind_inputs(ahead: EnqueuedSteps, rows: Rows, device: torch.device) -> torch.Tensor:
    """The first inputs (int64 [B] on ``device``) of a multi-step Forward launched behind ``ahead`` (enqueued, not
    yet committed): a row whose request ``ahead`` runs (the same state object) takes ``ahead``'s last token of that
    row from the device (its step ``k - 1``, where it ran ``k`` steps); any other row its request's ``last_token``
    (``input_from_last_sample``) or its own input id. Enqueued on the current stream, behind ``ahead``'s steps."""
    width = ahead.toks.shape[1]
    where = {it.request_id: (row, it.decode_steps, st) for row, (it, st) in enumerate(zip(ahead.items, ahead.states))}
    own, index = [], []
    flat = ahead.toks.numel()
    for it, state in zip(rows.its, rows.states):
        got = where.get(it.request_id)
        if got is not None and state is not None and got[2] is state and it.input_from_last_sample:
            index.append((got[1] - 1) * width + got[0])
        else:
            index.append(flat + len(own))
            own.append(it.input_ids[0] if state is None or not it.input_from_last_sample else state.last_token)
    source = torch.cat([ahead.toks.reshape(-1), to_device(np.asarray(own, dtype=np.int64), device)]) if own \
        else ahead.toks.reshape(-1)
    return source[to_device(np.asarray(index, dtype=np.int64), device)]


def assumed_table(requests: Mapping[str, object], ahead: EnqueuedSteps) -> Mapping[str, object]:
    """``requests`` (the committed table) with every request that ``ahead`` runs (its validated state still there)
    as its commit will leave it when no row stops: ``k`` slots longer, a last token sampled, not stopped. What a
    Forward launched behind ``ahead`` is validated against."""
    table = dict(requests)
    for it, state in zip(ahead.items, ahead.states):
        if state is not None and requests.get(it.request_id) is state:
            table[it.request_id] = HeldState(range(len(state.slots) + it.decode_steps), 0)
    return table
