"""Test helpers: build engines on a checkpoint and drive them the way the scheduler does."""

from __future__ import annotations

import functools
import pathlib
from dataclasses import dataclass, field

import torch

from worker_svc.attention.torch_ref import TorchAttention
from worker_svc.engine import Engine
from worker_svc.kv_pool import KVPool, geometry
from worker_svc.model.loader import load_model
from worker_svc.sampler import SamplingParams
from worker_svc.types import ForwardItem


@functools.lru_cache(maxsize=8)
def cached_model(path: str, dtype: torch.dtype = torch.float32):
    """(config, model) loaded once per path and dtype."""
    return load_model(path, dtype=dtype, device="cpu")


def make_engine(path: str | pathlib.Path, kv_tokens: int = 4096, epoch: str = "epoch-1", seed: int = 0) -> Engine:
    """A CPU fp32 engine with the torch attention backend and a fresh KV pool (the model is shared)."""
    cfg, model = cached_model(str(path))
    pool = KVPool(cfg, geometry(cfg, torch.float32, kv_tokens=kv_tokens), torch.float32, "cpu")
    backend = TorchAttention(cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.head_dim ** -0.5 if cfg.scale_attn_weights else 1.0)
    return Engine(cfg, model, pool, backend, epoch=epoch, model_path=str(path), seed=seed)


@dataclass
class Req:
    """A request as the test driver tracks it (the scheduler's view)."""

    rid: str
    prompt: list[int]
    max_new: int
    params: SamplingParams = field(default_factory=SamplingParams)
    tokens: list[int] = field(default_factory=list)      # tokens whose KV is written (prompt, then generated)
    slots: list[int] = field(default_factory=list)
    out: list[int] = field(default_factory=list)         # generated token ids
    logprobs: list[float] = field(default_factory=list)
    known: bool = False                                  # the worker holds this request's state
    done: bool = False


class Driver:
    """Drives an Engine like the scheduler: slots from a free list, chunked extend, decode, retract.

    ``step`` builds one batch out of every unfinished request: a request still in prefill sends its next
    chunk (sample only on the final one), a request in decode sends its last sampled token.
    """

    def __init__(self, engine: Engine, chunk: int = 1 << 30, stop_at_eos: bool = True):
        self.engine = engine
        self.chunk = chunk
        self.stop_at_eos = stop_at_eos
        self.free = list(range(engine.kv_pool.pool_slots - 1, 0, -1))  # slot 0 reserved
        self.eos = engine.cfg.eos_token_id

    def alloc(self, n: int) -> list[int]:
        return [self.free.pop() for _ in range(n)]

    def _item(self, r: Req) -> ForwardItem | None:
        pending = r.prompt[len(r.tokens):] if len(r.tokens) < len(r.prompt) else r.out[-1:]
        if r.done or not pending:
            return None
        in_prefill = len(r.tokens) < len(r.prompt)
        new = pending[: self.chunk] if in_prefill else pending
        final = (len(r.tokens) + len(new) >= len(r.prompt))
        item = ForwardItem(
            request_id=r.rid, input_ids=tuple(new), position_start=len(r.tokens), slot_ids=tuple(self.alloc(len(new))),
            has_prefix=not r.known, prefix_slot_ids=tuple(r.slots) if not r.known else (),
            prefix_token_ids=tuple(r.tokens) if not r.known else (), sampling=r.params, sample=final,
            return_logprob=True, prompt_len=len(r.prompt),
        )
        return item

    def step(self, reqs: list[Req]) -> None:
        """One forward over every active request in ``reqs``."""
        items = [(r, it) for r in reqs if (it := self._item(r)) is not None]
        res = self.engine.forward([it for _, it in items], self.engine.epoch)
        for (r, it), o in zip(items, res.outputs):
            r.known = True
            r.tokens.extend(it.input_ids)
            r.slots.extend(it.slot_ids)
            if o.sampled:
                r.out.append(o.next_token_id)
                r.logprobs.append(o.logprob)
                if len(r.out) >= r.max_new or (self.stop_at_eos and o.next_token_id == self.eos):
                    r.done = True

    def retract(self, r: Req, keep: int | None = None) -> None:
        """Releases the request on the worker; keeps its first ``keep`` computed tokens as a cached prefix
        (None = all of them), freeing the other slots. The next step re-sends it with has_prefix."""
        self.engine.release([r.rid])
        keep = len(r.tokens) if keep is None else keep
        self.free.extend(r.slots[keep:])
        del r.slots[keep:], r.tokens[keep:]
        r.known = False

    def run(self, reqs: list[Req], max_steps: int = 10_000) -> list[Req]:
        for _ in range(max_steps):
            if all(r.done for r in reqs):
                return reqs
            self.step([r for r in reqs if not r.done])
        raise AssertionError("requests did not finish")


def hf_greedy(hf_model, prompt: list[int], max_new: int) -> tuple[list[int], list[float]]:
    """HF ``generate(do_sample=False)``: (new ids, log_softmax of the raw logits at each chosen id)."""
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False,
                                return_dict_in_generate=True, output_logits=True, pad_token_id=0)
    new = out.sequences[0, len(prompt):].tolist()
    lps = [float(torch.log_softmax(lg[0].float(), -1)[t]) for lg, t in zip(out.logits, new)]
    return new, lps
