"""Which attention path a batch takes (``attention.ragged``), on CPU: the pure rule, the engine's choice per Forward
(one plan, ragged or paged), and the new tokens' K/V the model hands to ``attend`` for the ragged path. A stand-in
backend that claims the ragged path and computes it in torch from ``new_kv`` checks that those views are the K/V
written to the pool and that served tokens equal the paged path's. flashinfer's ragged kernel itself is compared on
the GPU (tests/worker/test_gpu_ragged.py)."""

from __future__ import annotations

import pytest
import torch

from tests.worker.helpers import Driver, Req, cached_model, make_engine
from worker_svc.attention import ragged
from worker_svc.attention.base import AttentionMeta
from worker_svc.attention.torch_ref import TorchAttention
from worker_svc.engine import Engine
from worker_svc.extend_graph import ExtendGraphs
from worker_svc.forward_batch import build_layout
from worker_svc.kv_pool import KVPool, geometry
from worker_svc.model.config import ModelConfig
from worker_svc.model.gpt_bigcode import GPTBigCodeForCausalLM
from worker_svc.types import ForwardItem


def _layout(prefix: list[int], new: list[int]):
    tables, at = [], 1
    for p, n in zip(prefix, new):
        tables.append(list(range(at, at + p + n)))
        at += p + n
    return build_layout(prefix, new, tables)


@pytest.mark.parametrize("prefix,new,want", [
    ([0, 0, 0], [13, 1, 300], True),    # fresh prompts of uneven lengths
    ([0], [8192], True),                # one long first chunk
    ([0, 0], [1, 1], True),             # one-token prompts (a decode-shaped batch, still no prefix)
    ([0, 37, 0], [13, 7, 300], False),  # one request over a cached prefix: the whole batch stays paged
    ([5], [20], False),                 # a later chunk
    ([37, 5], [1, 1], False),           # decode
])
def test_the_ragged_path_takes_eager_batches_without_any_cached_prefix(prefix, new, want):
    layout = _layout(prefix, new)
    assert ragged.no_cached_prefix(layout) == want
    assert ragged.takes_ragged(layout, enabled=True, eager=True) == want
    assert not ragged.takes_ragged(layout, enabled=False, eager=True)
    assert not ragged.takes_ragged(layout, enabled=True, eager=False)  # a captured graph takes it: paged


class RaggedStandIn(TorchAttention):
    """The torch backend with a ragged path: after ``plan_ragged`` it attends from ``new_kv`` alone (causal within
    each request) and checks that those K/V are the ones the layer wrote to the pool. Records each plan's path."""

    ragged_prefill = True

    def __init__(self, *a):
        super().__init__(*a)
        self.paths: list[str] = []
        self.ragged_calls = 0

    def plan(self, meta: AttentionMeta) -> None:
        self.paths.append("paged")
        self._ragged = False
        super().plan(meta)

    def plan_ragged(self, meta: AttentionMeta) -> None:
        assert meta.qo_lens == meta.kv_lens
        self.paths.append("ragged")
        self._ragged = True
        super().plan(meta)

    def attend(self, layer, q, kv_pool, out=None, new_kv=None):
        if not self._ragged:
            return super().attend(layer, q, kv_pool, out)
        self.ragged_calls += 1
        k, v = new_kv  # [T, kv_heads, head_dim] each
        slots = self.meta.kv_indices.long()  # no prefix: the new tokens' slots, in row order
        assert k.shape == v.shape == (q.shape[0], self.kv_heads, self.head_dim)
        assert torch.equal(kv_pool.k[layer][slots], k.to(kv_pool.dtype))
        assert torch.equal(kv_pool.v[layer][slots], v.to(kv_pool.dtype))
        out = torch.empty_like(q) if out is None else out
        group, ptr = self.n_head // self.kv_heads, self.meta.qo_indptr_cpu.tolist()
        for b in range(len(ptr) - 1):
            s, e = ptr[b], ptr[b + 1]
            n = e - s
            qb = q[s:e].float().reshape(n, self.kv_heads, group, self.head_dim)
            sc = torch.einsum("nkgd,lkd->kgnl", qb, k[s:e].float()) * self.sm_scale
            sc = sc.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
            o = torch.einsum("kgnl,lkd->nkgd", torch.softmax(sc, dim=-1), v[s:e].float())
            out[s:e] = o.reshape(n, self.n_head, self.head_dim).to(q.dtype)
        return out


def _engine(model_dir, ragged_prefill: bool = True, kv_tokens: int = 4096) -> Engine:
    cfg, model = cached_model(str(model_dir))
    pool = KVPool(cfg, geometry(cfg, torch.float32, kv_tokens=kv_tokens), torch.float32, "cpu")
    backend = RaggedStandIn(cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.head_dim ** -0.5)
    return Engine(cfg, model, pool, backend, epoch="e", ragged_prefill=ragged_prefill)


def _serve(eng: Engine, prompts, chunk: int) -> list[tuple[list[int], list[float]]]:
    reqs = [Req(f"r{i}", p, 10) for i, p in enumerate(prompts)]
    Driver(eng, chunk=chunk).run(reqs)
    return [(r.out, r.logprobs) for r in reqs]


@pytest.mark.parametrize("chunk", [1 << 30, 9])
def test_served_tokens_are_the_paged_paths_and_only_fresh_batches_go_ragged(model_dir, prompts, chunk):
    """Every prompt in one batch (its first Forward: all fresh, ragged), then decodes (paged); with chunks of 9 the
    first Forward is ragged, every later one has a prefix (paged). Tokens and logprobs equal the torch engine's."""
    want = _serve(make_engine(model_dir), prompts, chunk)
    eng = _engine(model_dir)
    eng.backend.paths.clear()  # warm-up's plans
    got = _serve(eng, prompts, chunk)
    assert [a for a, _ in got] == [a for a, _ in want]
    assert max(abs(x - y) for (_, la), (_, lb) in zip(got, want) for x, y in zip(la, lb)) < 1e-4
    assert eng.backend.paths[0] == "ragged" and set(eng.backend.paths[1:]) == {"paged"}
    assert eng.backend.ragged_calls == eng.cfg.n_layer


def test_a_batch_mixing_prefix_and_fresh_requests_takes_the_paged_path(model_dir, prompts):
    eng = _engine(model_dir)
    drv = Driver(eng, chunk=4)
    a, b = Req("a", prompts[2], 4), Req("b", prompts[3], 4)
    drv.step([a])  # a's first chunk alone: ragged
    drv.step([a, b])  # a over its prefix, b fresh: paged
    assert eng.backend.paths[-2:] == ["ragged", "paged"]


def test_the_switch_and_the_extend_graphs_keep_batches_paged(model_dir):
    """Off (``ragged_prefill=False``) nothing goes ragged; with piecewise graphs up to 48 tokens a fresh batch that
    fits them stays paged (their attention reads the pool) and a larger one runs eagerly on the ragged path; a
    backend without the path (the torch reference) turns it off whatever is asked."""
    off = _engine(model_dir, ragged_prefill=False)
    off.warmup()  # its fresh extend included
    assert not off.ragged_prefill and off.backend.paths == ["paged"] * 3
    eng = _engine(model_dir)
    eng.extend_graphs = ExtendGraphs(eng.model, eng.kv_pool, 48, capture=False)
    eng.backend.paths.clear()
    slot = iter(range(1, 4000))
    for rid, n in (("small", 40), ("large", 49)):
        eng.forward([ForwardItem(request_id=rid, input_ids=tuple(range(3, 3 + n)), position_start=0,
                                 slot_ids=tuple(next(slot) for _ in range(n)), has_prefix=True)], eng.epoch)
    assert eng.backend.paths == ["paged", "ragged"]
    assert make_engine(model_dir).ragged_prefill is False


def test_warmup_plans_a_fresh_extend_ragged_then_an_extend_over_a_prefix_and_a_decode_paged(model_dir):
    eng = _engine(model_dir)  # Engine.__init__ does not warm up: do it here
    eng.backend.paths.clear()
    eng.warmup()
    assert eng.backend.paths == ["ragged", "paged", "paged"]


@pytest.mark.parametrize("multi_query", [True, False])
def test_start_hands_out_the_k_and_v_it_writes(multi_query):
    """``Attention.start``'s (k, v): [T, kv_heads, head_dim] views, equal to what it wrote to the pool (multi-query
    [q | k | v] and multi-head per-head [q_h | k_h | v_h] layouts of ``c_attn``)."""
    cfg = ModelConfig(vocab_size=32, n_embd=64, n_layer=1, n_head=4, n_inner=128, n_positions=64,
                      multi_query=multi_query, activation_function="gelu_pytorch_tanh", layer_norm_epsilon=1e-5,
                      scale_attn_weights=True, tie_word_embeddings=True, eos_token_id=0, name="t")
    torch.manual_seed(0)
    model = GPTBigCodeForCausalLM(cfg)
    pool = KVPool(cfg, geometry(cfg, torch.float32, kv_tokens=64), torch.float32, "cpu")
    slots = torch.tensor([9, 3, 40, 7, 22], dtype=torch.long)
    x = torch.randn(5, cfg.n_embd)
    with torch.inference_mode():
        q, (k, v) = model.transformer.h[0].attn.start(x, pool, slots)
    assert q.shape == (5, cfg.n_head, cfg.head_dim)
    assert k.shape == v.shape == (5, cfg.kv_heads, cfg.head_dim)
    assert torch.equal(pool.k[0][slots], k) and torch.equal(pool.v[0][slots], v)
