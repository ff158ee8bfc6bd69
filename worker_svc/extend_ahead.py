"""An eager extend's host work done before its turn: validation, layout and input tensors while the Forward
ahead of it runs.

With the scheduler's chunk pipeline, extend N+1 reaches the worker while extend N is still on the device, then
waits for N's commit (``ordering.ForwardOrder``). Everything it did after that wait before its first kernel was
host work proportional to its tokens: H200 run 17's Forward timeline (1B, c64) put the device's idle time between
two extends of 8,192 tokens at 4.6-6.9 ms although the second one had arrived 13-27 ms early (0.6 ms for 1,024
tokens): the batch's validation, its layout, the token ids as a Python list turned into a tensor, the copies.

``prepare_extend`` does that work at arrival, outside the engine's lock, for a batch whose result cannot depend on
what the Forwards ahead of it commit beyond the slot tables of its continuation rows: every item either brings its
own prefix (``has_prefix``: its slot table is in the item) or continues a prompt whose earlier chunk the worker
holds or runs (a *continuation row*: no prefix, no sampling with penalties), none asks for prompt logprobs, none is
a multi-step decode. Such a batch's validation reads nothing of the request table but a continuation row's length,
which is its ``position_start`` by construction: it is validated at arrival against that length, and the row's slot
table (the request's table once every Forward ahead of it has committed) is read when the batch is launched behind
the extend ahead (``with_tables``, from the tables the pending commits will leave:
``extend_behind.continuation_tables``), or at its turn, from the committed tables (``Engine.forward``: enqueued in
two parts there too, its requests guarded, so a Release of one of them waits for its commit; launched behind, the
commit finds the request gone and the batch is ABORTED). H200 run 25's c256 timeline: 31 of 32 chunks started with
such a row (a prompt cut at the previous chunk's end) and took their turn, 4-6 ms of idle device each. What stays at the turn is the attention
plan (the backend is shared with the Forward running now) and the launch. A batch that validation rejects, or that
a captured graph would run, is not prepared: its turn does everything, as before, and answers the error there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from worker_svc.forward_batch import BatchLayout, layout_from_parts
from worker_svc.model.config import ModelConfig
from worker_svc.step_feed import to_device
from worker_svc.types import ForwardItem, WorkerError
from worker_svc.validation import HeldState, validate_batch


@dataclass(frozen=True)
class PreparedExtend:
    """One eager extend batch, validated and laid out before its turn.

    ``items``: the batch; ``layout``: its ``BatchLayout`` (T new tokens); while
    ``continuing`` is not empty its continuation rows' prefix tables are placeholders of the right length (their
    positions and output slots are right, their ``kv_indices`` are not): ``with_tables`` gives the layout to launch;
    ``inputs[b]``: item b's new token ids; ``input_ids``, ``positions``, ``out_slots``: int64 [T] on the engine's
    device (copied through pinned memory on CUDA, enqueued on the current stream without the host waiting);
    ``continuing``: the indices of the items without a prefix (continuation rows)."""

    items: tuple[ForwardItem, ...]
    layout: BatchLayout
    inputs: tuple[tuple[int, ...], ...]
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_slots: torch.Tensor
    continuing: tuple[int, ...] = ()

    def with_tables(self, tables: Mapping[str, np.ndarray]) -> "PreparedExtend | None":
        """This batch with its continuation rows' slot tables (``tables[request_id]``: int32, the request's table
        before this batch) laid out: itself when it has none; None when a row's table is missing or is not
        ``position_start`` long (the batch then takes its turn, whose validation answers it)."""
        if not self.continuing:
            return self
        got = [tables.get(self.items[b].request_id) for b in self.continuing]
        if any(t is None or len(t) != self.items[b].position_start for b, t in zip(self.continuing, got)):
            return None
        prefix = dict(zip(self.continuing, got))
        layout = layout_from_parts([prefix[b] if b in prefix else np.asarray(it.prefix_slot_ids, dtype=np.int32)
                                    for b, it in enumerate(self.items)], [it.slot_ids for it in self.items])
        return replace(self, layout=layout, continuing=())


def eligible(items: Sequence[ForwardItem]) -> bool:
    """True for a batch whose validation and layout read no request state but its continuation rows' table lengths:
    every item ``has_prefix`` or is a continuation row (no prefix; when it samples, no penalties, which would read
    the request's token history), none asks for prompt logprobs, none runs more than one decode step, none takes its
    input from the last sample."""
    return bool(items) and all(not it.return_prompt_logprobs and it.decode_steps == 1 and not it.input_from_last_sample
                               and (it.has_prefix or not (it.sample and it.sampling.has_penalties)) for it in items)


def prepare_extend(items: Sequence[ForwardItem], *, cfg: ModelConfig, pool_slots: int, epoch: str,
                   device: torch.device, runs_eager: Callable[[BatchLayout], bool]) -> PreparedExtend | None:
    """The batch prepared, or None when it is not ``eligible``, validation rejects it (its turn raises the same
    error), or ``runs_eager(layout)`` is False (a captured graph takes it: its turn builds what the graph needs).
    Nothing here touches the request table or the KV pool; the only device work is the three copies."""
    if not eligible(items):
        return None
    continuing = tuple(b for b, it in enumerate(items) if not it.has_prefix)
    held = {items[b].request_id: HeldState(range(items[b].position_start)) for b in continuing}
    try:
        validate_batch(items, epoch, epoch, cfg, pool_slots, held, frozenset())
    except WorkerError:
        return None
    # a continuation row's prefix: zeros of its length (positions and output slots only; ``with_tables`` fills it)
    layout = layout_from_parts([np.asarray(it.prefix_slot_ids, dtype=np.int32) if it.has_prefix
                                else np.zeros(it.position_start, dtype=np.int32) for it in items],
                               [it.slot_ids for it in items])
    if not runs_eager(layout):
        return None
    inputs = tuple(tuple(it.input_ids) for it in items)
    flat = np.fromiter((t for ids in inputs for t in ids), dtype=np.int64, count=layout.num_tokens)
    ids, pos, out = (to_device(a, device) for a in (flat, layout.positions, layout.out_slots))
    return PreparedExtend(tuple(items), layout, inputs, ids, pos, out, continuing)
