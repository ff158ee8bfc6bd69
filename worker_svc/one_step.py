"""One-step Forward: a batch that runs to its commit in one part under the engine's lock.

Every batch but a multi-step decode (``multistep``) and an extend prepared at arrival (``extend_behind``): it is
laid out flat (``forward_batch.layout_from_parts``) against the request table, then runs on the first path that
takes it: the decode graphs (``cuda_graph.DecodeGraphs``: a replay, the plan copied in), one graph of a whole
one-request extend (``extend_whole_graph``), the extend pieces' graphs (``extend_graph``), else eagerly (the ragged
prefill when ``attention.ragged`` picks it, else the paged plan). The items that sample are sampled from their last
new token's logits, prompt logprobs computed where asked, and every item committed (``Engine.commit``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from worker_svc.forward_batch import layout_from_parts
from worker_svc.prompt_logprobs import prompt_logprobs
from worker_svc.sampler import SampleRow, sample
from worker_svc.step_clock import StepClock
from worker_svc.types import ForwardItem, ForwardOutput


def history(engine, it: ForwardItem) -> list[int]:
    """Token ids before this item's new tokens: its prefix when it brings one, else the request's committed tokens."""
    return list(it.prefix_token_ids) if it.has_prefix else engine.requests[it.request_id].tokens


def prev_hidden(engine, it: ForwardItem) -> torch.Tensor | None:
    """[n_embd]: the last hidden row kept by the request's chunk before this one (None for a first chunk; validated
    kept)."""
    return engine.requests[it.request_id].last_hidden if it.position_start > 0 else None


def run_one_step(engine, items: Sequence[ForwardItem], clock: StepClock) -> tuple[ForwardOutput, ...]:
    """Runs validated batch ``items`` on ``engine`` (a ``worker_svc.engine.Engine``; caller holds its lock) and
    commits every item; ``clock`` times the model's steps. Returns the outputs in item order. Nothing here
    validates: an invalid batch never gets here (``validation.validate_batch``)."""
    dev = engine.device
    prefixes = [np.asarray(it.prefix_slot_ids, dtype=np.int32) if it.has_prefix
                else engine.requests[it.request_id].slots.view() for it in items]
    layout = layout_from_parts(prefixes, [it.slot_ids for it in items])
    inputs = [engine.item_inputs(it) for it in items]
    flat_ids = [t for ids in inputs for t in ids]
    qo = layout.qo_indptr.tolist()
    sample_items = [b for b, it in enumerate(items) if it.sample]
    hidden = None  # [T, n_embd], all paths but the decode graphs
    if engine.graphs is not None and engine.graphs.fits(layout) and not any(it.return_prompt_logprobs for it in items):
        clock.start()  # the graph's plan is in it (run copies the layout in, then replays)
        ids = torch.tensor(flat_ids, dtype=torch.long).to(dev)
        all_logits = engine.graphs.run(layout, ids)  # [B, vocab] float32, one row per item
        row_logits = lambda rows: all_logits[rows]  # noqa: E731
    elif engine.whole_graphs is not None and engine.whole_graphs.fits(layout):
        clock.start()  # its plan is in it, as for the decode graphs
        hidden, last_logits = engine.whole_graphs.run(layout, flat_ids)  # [T, n_embd], [1, vocab] float32
        row_logits = lambda rows: last_logits  # noqa: E731  (one item: the only row it samples is its last)
    else:
        input_ids = torch.tensor(flat_ids, dtype=torch.long).to(dev)
        pieces = engine.extend_graphs is not None and engine.extend_graphs.fits(layout)
        engine.plan(layout, eager=not pieces)
        clock.start()
        if pieces:
            hidden = engine.extend_graphs.run(layout, input_ids, engine.backend)  # [T, n_embd], until the next run
        else:
            hidden = engine.model(input_ids, torch.from_numpy(layout.positions).to(dev), engine.kv_pool, engine.backend,
                                torch.from_numpy(layout.out_slots).to(dev))
        row_logits = lambda rows: engine.model.logits(hidden[rows])  # noqa: E731
    clock.stop()  # the lm_head of the eager rows runs after it: a few us of one GEMM

    # Sampling rows: the last new token of each item that samples.
    results: dict[int, object] = {}
    if sample_items:
        logits = row_logits([qo[b + 1] - 1 for b in sample_items])  # [S, vocab] float32
        rows = []
        for b in sample_items:
            it = items[b]
            prev = engine.prompt_len(it)
            hist: list[int] = []
            if it.sampling.has_penalties:
                hist = history(engine, it) + list(inputs[b])
            rows.append(SampleRow(params=it.sampling, history=hist, prompt_len=prev,
                                  position=it.position_start + len(inputs[b]),
                                  top_n=it.top_logprobs_num))
        for b, res in zip(sample_items, sample(logits, rows, engine.generator)):
            results[b] = res

    prompt = {b: prompt_logprobs(it, hidden[qo[b]:qo[b + 1]], prev_hidden(engine, it), engine.model.logits)
              for b, it in enumerate(items) if it.return_prompt_logprobs}

    outputs = []
    for b, it in enumerate(items):
        res = results.get(b)
        plp, ptop = prompt.get(b, ((), ()))
        sampled = res is not None
        outputs.append(ForwardOutput.make(
            request_id=it.request_id, sampled=sampled, next_token_id=res.token_id if sampled else -1,
            logprob=res.logprob if sampled and it.return_logprob else 0.0, top_logprobs=res.top if sampled else (),
            prompt_logprobs=plp, prompt_top_logprobs=ptop, next_token_ids=(), logprobs=(), skipped=False))
        # its table grows by the new slots and tokens; the sampled token is the input of a from-last item
        engine.commit(it, it.slot_ids, inputs[b], res.token_id if sampled else None,
                    hidden[qo[b + 1] - 1].clone() if it.return_prompt_logprobs else None)
    return tuple(outputs)

