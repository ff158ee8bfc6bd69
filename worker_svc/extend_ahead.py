"""An eager extend's host work done before its turn: validation, layout and input tensors while the Forward
ahead of it runs.

With the scheduler's chunk pipeline, extend N+1 reaches the worker while extend N is still on the device, then
waits for N's commit (``ordering.ForwardOrder``). Everything it did after that wait before its first kernel was
host work proportional to its tokens: H200 run 17's Forward timeline (1B, c64) put the device's idle time between
two extends of 8,192 tokens at 4.6-6.9 ms although the second one had arrived 13-27 ms early (0.6 ms for 1,024
tokens): the batch's validation, its layout, the token ids as a Python list turned into a tensor, the copies.

``prepare_extend`` does that work at arrival, outside the engine's lock, for a batch whose result cannot depend on
what the Forwards ahead of it commit: every item brings its own prefix (``has_prefix``: its slot table is in the
item), none asks for prompt logprobs, none is a multi-step decode. Such a batch's validation reads no request
state (``validation.validate_batch`` with an empty table), so its outcome at arrival is its outcome at its turn.
What stays at the turn is the attention plan (the backend is shared with the Forward running now) and the launch.
A batch that validation rejects, or that a captured graph would run, is not prepared: its turn does everything, as
before, and answers the error there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from worker_svc.forward_batch import BatchLayout, layout_from_parts
from worker_svc.model.config import ModelConfig
from worker_svc.step_feed import to_device
from worker_svc.types import ForwardItem, WorkerError
from worker_svc.validation import validate_batch


@dataclass(frozen=True)
class PreparedExtend:
    """One eager extend batch, validated and laid out before its turn.

    ``items``: the batch (identity: ``valid_for``); ``layout``: its ``BatchLayout`` (T new tokens);
    ``inputs[b]``: item b's new token ids; ``input_ids``, ``positions``, ``out_slots``: int64 [T] on the engine's
    device (copied through pinned memory on CUDA, enqueued on the current stream without the host waiting)."""

    items: tuple[ForwardItem, ...]
    layout: BatchLayout
    inputs: tuple[tuple[int, ...], ...]
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_slots: torch.Tensor

    def valid_for(self, items: Sequence[ForwardItem]) -> bool:
        """True when ``items`` are the very item objects this was prepared from (nothing else is assumed: the
        batch reads no request state)."""
        return len(items) == len(self.items) and all(a is b for a, b in zip(items, self.items))


def eligible(items: Sequence[ForwardItem]) -> bool:
    """True for a batch whose validation and layout read no request state: every item ``has_prefix``, none
    asks for prompt logprobs, none runs more than one decode step, none takes its input from the last sample."""
    return bool(items) and all(it.has_prefix and not it.return_prompt_logprobs and it.decode_steps == 1
                               and not it.input_from_last_sample for it in items)


def prepare_extend(items: Sequence[ForwardItem], *, cfg: ModelConfig, pool_slots: int, epoch: str,
                   device: torch.device, runs_eager: Callable[[BatchLayout], bool]) -> PreparedExtend | None:
    """The batch prepared, or None when it is not ``eligible``, validation rejects it (its turn raises the same
    error), or ``runs_eager(layout)`` is False (a captured graph takes it: its turn builds what the graph needs).
    Nothing here touches the request table or the KV pool; the only device work is the three copies."""
    if not eligible(items):
        return None
    try:
        validate_batch(items, epoch, epoch, cfg, pool_slots, {}, frozenset())
    except WorkerError:
        return None
    layout = layout_from_parts([np.asarray(it.prefix_slot_ids, dtype=np.int32) for it in items],
                               [it.slot_ids for it in items])
    if not runs_eager(layout):
        return None
    inputs = tuple(tuple(it.input_ids) for it in items)
    flat = np.fromiter((t for ids in inputs for t in ids), dtype=np.int64, count=layout.num_tokens)
    ids, pos, out = (to_device(a, device) for a in (flat, layout.positions, layout.out_slots))
    return PreparedExtend(tuple(items), layout, inputs, ids, pos, out)
