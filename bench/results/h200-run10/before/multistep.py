"""Multi-step decode: up to K decode steps in one Forward, with no host round trip between steps.

A batch whose items carry ``decode_steps`` (k_b >= 1, K = max k_b) runs K steps. Step j runs the rows with
k_b > j (rows are ordered by k_b, largest first, so the active rows are a prefix and the next step's input
ids are a slice of a device tensor): row b writes the K/V of its input at ``slot_ids[j]`` (position
``position_start + j``) and samples its next token on the device, which is the input of step j + 1. On
CUDA with ``DecodeGraphs`` each step replays the captured graph of its bucket. The sampled ids (and
logprobs) of all steps are read back once, at the end.

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
from typing import Sequence

import numpy as np
import torch

from worker_svc.attention.base import AttentionMeta
from worker_svc.forward_batch import DecodeSteps
from worker_svc.sampler import argmax_rows, draw_non_greedy
from worker_svc.step_feed import StepFeed, to_device
from worker_svc.types import ForwardItem, ForwardOutput


def sample_on_device(logits: torch.Tensor, items: Sequence[ForwardItem], positions: Sequence[int],
                     generator: torch.Generator | None) -> torch.Tensor:
    """One token per row without reading anything back. logits [N, V] float32; ``positions[i]``: absolute
    position of the token row i samples (for seeded draws). Returns int64 [N] on logits' device."""
    chosen = argmax_rows(logits)
    draw_non_greedy(logits, chosen, [it.sampling for it in items], positions, generator)
    return chosen


def run_multistep(engine, items: Sequence[ForwardItem], clock) -> tuple[ForwardOutput, ...]:
    """Runs a validated multi-step decode batch on ``engine`` (a ``worker_svc.engine.Engine``; caller
    holds its lock) and commits each request's written tokens; ``clock`` (``step_clock.StepClock``) times the
    steps, from the first one's launch to the last one's end. Returns outputs in item order."""
    dev = engine.device
    order = sorted(range(len(items)), key=lambda b: -items[b].decode_steps)  # active rows = a prefix
    its = [items[b] for b in order]
    ks = [it.decode_steps for it in its]
    steps = ks[0]
    active = [bisect.bisect_left(ks, -j, key=operator.neg) for j in range(steps)]  # rows with k > j
    requests = engine.requests
    prefixes = [np.asarray(it.prefix_slot_ids, dtype=np.int32) if it.has_prefix
                else requests[it.request_id].slots.view() for it in its]  # K/V before this Forward
    first = engine.first_inputs(its)  # step-0 input of each row (ints)
    cur = to_device(np.asarray(first, dtype=np.int64), dev)  # [B] int64 on the device: inputs of this step
    want_lp = any(it.return_logprob for it in its)
    all_greedy = all(it.sampling.greedy for it in its)
    toks = torch.zeros((steps, len(its)), dtype=torch.long, device=dev)
    lps = torch.zeros((steps, len(its)), dtype=torch.float32, device=dev) if want_lp else None
    feed = eager = None
    if engine.graphs is not None and len(its) <= engine.graphs.max_batch:
        # CUDA graphs: every step's metadata is built on the device (worker_svc/step_feed.py)
        feed = StepFeed(prefixes, [it.slot_ids for it in its], ks, dev)
    else:  # every row's full table (prefix + all its new slots) once; each step's layout slices it
        eager = DecodeSteps(prefixes, [it.slot_ids for it in its], ks)
    clock.start()
    for j in range(steps):
        n = active[j]
        ids = cur[:n]
        if feed is not None:
            logits = engine.graphs.run_step(feed, j, ids)  # [n, vocab] float32
        else:
            layout = eager.layout(j, n)
            engine.backend.plan(AttentionMeta.from_layout(layout, dev))
            hidden = engine.model(ids, torch.from_numpy(layout.positions).to(dev), engine.kv_pool, engine.backend,
                                  torch.from_numpy(layout.out_slots).to(dev))
            logits = engine.model.logits(hidden)
        if all_greedy:  # what sample_on_device gives when no row draws
            nxt = argmax_rows(logits)
        else:
            nxt = sample_on_device(logits, its[:n], [it.position_start + j + 1 for it in its[:n]], engine.generator)
        if lps is not None:
            lps[j, :n] = torch.log_softmax(logits, dim=-1).gather(1, nxt[:, None])[:, 0]
        toks[j, :n] = nxt
        cur = nxt  # rows past n never run again (k sorted, largest first)
    clock.stop()
    rows_toks = toks.cpu().numpy().T.tolist()  # the one read-back of the Forward; [B][steps] ints
    rows_lps = lps.cpu().numpy().T.tolist() if lps is not None else None
    outputs: list = [None] * len(items)
    for row, (b, it) in enumerate(zip(order, its)):
        got = rows_toks[row][: it.decode_steps]
        stops = it.stop_token_ids
        n = next((i + 1 for i, t in enumerate(got) if t in stops), len(got)) if stops else len(got)
        del got[n:]
        lp = tuple(rows_lps[row][:n]) if rows_lps is not None and it.return_logprob else ()
        outputs[b] = ForwardOutput.make(request_id=it.request_id, sampled=True, next_token_id=got[-1],
                                        logprob=lp[-1] if lp else 0.0, top_logprobs=(), prompt_logprobs=(),
                                        prompt_top_logprobs=(), next_token_ids=tuple(got), logprobs=lp, skipped=False)
        got.insert(0, first[row])  # written: the input, then every sampled token but the last
        engine.commit(it, it.slot_ids[:n], got[:n], last_token=got[n])
    return tuple(outputs)
