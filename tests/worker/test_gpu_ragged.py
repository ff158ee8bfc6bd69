"""GPU checks of the ragged prefill path (``attention.ragged``, flashinfer's ``BatchPrefillWithRaggedKVCacheWrapper``;
the H200 accelerator machine, skipped on the CPU CI): the kernel against the paged path and the torch reference on
the same batch (several fresh requests of uneven lengths, K/V as strided views of a c_attn output, pools of page
size 1 and 16, the head shapes of the family), the model's forward ragged against paged, served greedy tokens with
the path on and off, fp16 / bf16 ragged against HF fp32 up to near-ties, and the batches that must stay paged."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.worker.helpers import Driver, Req, hf_greedy
from tests.worker.test_gpu import LOGPROB_TOL, NEAR_TIE, _cfg, _near_tie_gap, _prefix_agreement
from worker_svc.attention.base import AttentionMeta
from worker_svc.attention.torch_ref import TorchAttention
from worker_svc.build import make_backend
from worker_svc.engine import Engine
from worker_svc.forward_batch import build_layout
from worker_svc.kv_pool import KVPool, geometry
from worker_svc.model.loader import load_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and importlib.util.find_spec("flashinfer")),
                       reason="needs CUDA and flashinfer (run on the accelerator machine)"),
]

DEV = torch.device("cuda:0")
NEW = [1, 37, 300, 129, 1000, 5]  # fresh requests, uneven, none a multiple of 16 but the single token
# (n_head, head_dim), one K/V head: starcoderbase-1b / santacoder, tiny_starcoder_py, starcoderbase-3b, starcoder 15B
SHAPES = [(16, 64), (12, 64), (22, 128), (48, 128)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _tables(prefix: list[int], new: list[int], page_size: int, pool_slots: int) -> list[list[int]]:
    """Each request's slots in whole pages of ``page_size`` (the cache service's allocation), pages shuffled over
    the pool, the reserved first page never used."""
    pages = (torch.randperm(pool_slots // page_size - 1, generator=torch.Generator().manual_seed(3)) + 1).tolist()
    tables = []
    for p, n in zip(prefix, new):
        need = -(-(p + n) // page_size)
        own, pages = pages[:need], pages[need:]
        tables.append([pg * page_size + i for pg in own for i in range(page_size)][:p + n])
    return tables


def _qkv(t: int, n_head: int, head_dim: int, dtype: torch.dtype, seed: int):
    """q [t, n_head, hd], k and v [t, 1, hd]: views of one [t, n_embd + 2 hd] tensor, as the fused c_attn path
    hands them out (rows of n_embd + 2 hd elements)."""
    e = n_head * head_dim
    g = torch.Generator(device=DEV).manual_seed(seed)
    qkv = torch.randn(t, e + 2 * head_dim, generator=g, device=DEV).to(dtype)
    return qkv[:, :e].unflatten(1, (n_head, head_dim)), qkv[:, e:e + head_dim].unsqueeze(1), qkv[:, e + head_dim:].unsqueeze(1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("n_head,head_dim", SHAPES)
def test_ragged_attention_matches_paged_and_torch(n_head, head_dim, page_size, dtype):
    """The same fresh batch through the ragged wrapper (K/V from the strided views), the paged one (K/V from the
    pool, where they were written at scattered slots) and the torch reference: within 1e-2 relative error; the
    ragged output written into a given ``out`` equals the one it allocates."""
    cfg = _cfg(n_head, 1, head_dim)
    pool = KVPool(cfg, geometry(cfg, dtype, kv_tokens=4096, page_size=page_size), dtype, DEV)
    prefix = [0] * len(NEW)
    layout = build_layout(prefix, NEW, _tables(prefix, NEW, page_size, pool.pool_slots))
    q, k, v = _qkv(layout.num_tokens, n_head, head_dim, dtype, seed=n_head + page_size)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    pool.write(0, torch.from_numpy(layout.out_slots).to(DEV), k, v)
    meta = AttentionMeta.from_layout(layout, DEV)
    fi = make_backend("flashinfer", cfg, dtype, DEV)
    ref = TorchAttention(n_head, 1, head_dim, head_dim ** -0.5)
    fi.plan_ragged(meta)
    got = fi.attend(0, q, pool, new_kv=(k, v))
    out = torch.empty(layout.num_tokens, n_head, head_dim, dtype=dtype, device=DEV)
    assert fi.attend(0, q, pool, out=out, new_kv=(k, v)) is out
    assert torch.equal(out, got)
    fi.plan(meta)
    paged = fi.attend(0, q, pool)
    ref.plan(meta)
    want = ref.attend(0, q, pool)
    assert got.dtype == dtype and got.shape == want.shape
    assert _rel(got, want) < 1e-2, _rel(got, want)
    assert _rel(got, paged) < 1e-2, _rel(got, paged)


def test_the_ragged_plan_refuses_what_it_cannot_serve():
    """A request over a cached prefix (ValueError), attend without ``new_kv`` after ``plan_ragged`` (RuntimeError);
    a paged plan ignores ``new_kv``."""
    cfg, dtype = _cfg(16, 1, 64), torch.bfloat16
    pool = KVPool(cfg, geometry(cfg, dtype, kv_tokens=1024), dtype, DEV)
    fi = make_backend("flashinfer", cfg, dtype, DEV)
    mixed = build_layout([0, 37], [13, 7], [list(range(1, 14)), list(range(20, 64))])
    with pytest.raises(ValueError, match="cached prefix"):
        fi.plan_ragged(AttentionMeta.from_layout(mixed, DEV))
    fresh = build_layout([0], [13], [list(range(1, 14))])
    q, k, v = _qkv(13, 16, 64, dtype, seed=0)
    fi.plan_ragged(AttentionMeta.from_layout(fresh, DEV))
    with pytest.raises(RuntimeError, match="new_kv"):
        fi.attend(0, q, pool)
    fi.plan(AttentionMeta.from_layout(mixed, DEV))
    q20 = _qkv(20, 16, 64, dtype, seed=1)[0]
    assert torch.equal(fi.attend(0, q20, pool, new_kv=(k, v)), fi.attend(0, q20, pool))


def _engine(model_dir, dtype: torch.dtype, ragged: bool, fused: bool = True, attention: str = "flashinfer") -> Engine:
    """An engine of the default model on the GPU, eager (no graphs), its fused kernels as asked (fused: q, k, v are
    views of the c_attn output; unfused: q contiguous, k and v split views); plan_ragged calls counted."""
    cfg, model = load_model(model_dir, dtype=dtype, device=DEV)
    model.use_fused_kernels(norms=fused, gelu=fused, kv=fused)
    pool = KVPool(cfg, geometry(cfg, dtype, kv_tokens=16384), dtype, DEV)
    eng = Engine(cfg, model, pool, make_backend(attention, cfg, dtype, DEV), epoch="gpu", model_path=str(model_dir),
                 ragged_prefill=ragged)
    assert eng.ragged_prefill == (ragged and attention == "flashinfer")
    eng.warmup()
    eng.ragged_plans = 0
    if eng.ragged_prefill:
        plan = eng.backend.plan_ragged
        eng.backend.plan_ragged = lambda meta: (setattr(eng, "ragged_plans", eng.ragged_plans + 1), plan(meta))[1]
    return eng


def _batch(prompts, vocab: int) -> list[list[int]]:
    """The code prompts and a 1,001-token random one: uneven lengths."""
    long = torch.randint(1, vocab, (1001,), generator=torch.Generator().manual_seed(5)).tolist()
    return [*prompts, long]


@pytest.mark.parametrize("fused", [True, False])
def test_the_forward_on_the_ragged_path_matches_the_paged_one(model_dir, prompts, fused):
    """One fresh batch (the 7 code prompts and a 1,001-token one), bf16: hidden states and each request's last-row logits
    through ragged attention within bf16 noise of the paged path's, the same top token (or one within 0.05 of the
    paged top logit), and the K/V written to the pool the same."""
    eng = _engine(model_dir, torch.bfloat16, ragged=True, fused=fused)
    batch = _batch(prompts, eng.cfg.vocab_size)
    new = [len(p) for p in batch]
    layout = build_layout([0] * len(new), new, _tables([0] * len(new), new, 1, eng.kv_pool.pool_slots))
    ids = torch.tensor([t for p in batch for t in p], device=DEV)
    pos, slots = torch.from_numpy(layout.positions).to(DEV), torch.from_numpy(layout.out_slots).to(DEV)
    last = torch.from_numpy(layout.last_rows).to(DEV)
    runs = {}
    for path in ("ragged", "paged"):
        eng.plan(layout, eager=path == "ragged")  # eager=False: what a captured graph would plan (paged)
        hidden = eng.model(ids, pos, eng.kv_pool, eng.backend, slots)
        runs[path] = (hidden.clone(), eng.model.logits(hidden[last]), torch.stack([k[slots] for k in eng.kv_pool.k]))
    assert eng.ragged_plans == 1
    (h_r, l_r, k_r), (h_p, l_p, k_p) = runs["ragged"], runs["paged"]
    assert _rel(h_r, h_p) < 2e-2 and _rel(l_r, l_p) < 2e-2
    assert _rel(k_r, k_p) < 2e-2  # layer 0's equal; later layers' follow their inputs
    top = l_r.argmax(-1)
    assert bool((l_p.gather(1, top[:, None])[:, 0] >= l_p.max(-1).values - 0.05).all())


def _serve(eng: Engine, batch, chunk: int) -> list[tuple[list[int], list[float]]]:
    reqs = [Req(f"r{i}", p, 16) for i, p in enumerate(batch)]
    Driver(eng, chunk=chunk).run(reqs)
    return [(r.out, r.logprobs) for r in reqs]


@pytest.mark.parametrize("chunk", [1 << 30, 9])
def test_served_greedy_tokens_are_the_same_with_the_ragged_path_on_and_off(model_dir, prompts, chunk):
    """The 7 code prompts (uneven lengths) in one batch (chunks of 9: the first Forward fresh, the later ones over
    prefixes), bf16: the same greedy tokens with --ragged-prefill on and off, logprobs within bf16 noise; the first
    Forward took the ragged path, nothing else did. (Code prompts only: the default model's continuations of them
    are not near-ties, as test_gpu_whole_graph relies on too; a random prompt's may be.)"""
    outs = []
    for ragged in (False, True):
        eng = _engine(model_dir, torch.bfloat16, ragged=ragged)
        outs.append(_serve(eng, prompts, chunk))
        assert eng.ragged_plans == (1 if ragged else 0)
    for (a, la), (b, lb) in zip(*outs):
        assert a == b
        assert max(abs(x - y) for x, y in zip(la, lb)) < 5e-2


def test_a_batch_mixing_prefix_and_fresh_requests_takes_the_paged_path(model_dir, prompts):
    eng = _engine(model_dir, torch.bfloat16, ragged=True)
    drv = Driver(eng, chunk=4)
    a, b = Req("a", prompts[2], 4), Req("b", prompts[3], 4)
    drv.step([a])  # a's first chunk alone: ragged
    assert eng.ragged_plans == 1
    drv.step([a, b])  # a over its prefix, b fresh: paged
    assert eng.ragged_plans == 1
    drv.run([a, b])
    assert eng.ragged_plans == 1 and a.done and b.done


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ragged_greedy_tokens_match_hf_fp32_up_to_near_ties(model_dir, hf_model, prompts, dtype):
    """Every prompt in one fresh batch (ragged first Forward), then decode: greedy tokens equal HF fp32's (which
    the fp32 torch backend on the GPU equals token for token: tests/worker/test_gpu.py) up to a near-tie of HF's
    own logits, logprobs within the dtype's tolerance there. The fp32 torch backend on the GPU, same batch: equal."""
    eng = _engine(model_dir, dtype, ragged=True)
    ours = _serve(eng, prompts, 1 << 30)
    assert eng.ragged_plans == 1
    fp32 = _serve(_engine(model_dir, torch.float32, ragged=True, fused=False, attention="torch"), prompts, 1 << 30)
    name = ("fp16" if dtype == torch.float16 else "bf16") + "-flashinfer"
    for p, (out, lps), (out32, _) in zip(prompts, ours, fp32):
        ref, ref_lps = hf_greedy(hf_model, p, 16)
        assert out32 == ref
        n = _prefix_agreement(out, ref)
        assert max((abs(a - b) for a, b in zip(lps[:n], ref_lps[:n])), default=0.0) < LOGPROB_TOL[dtype]
        if n < min(len(ref), len(out)):
            assert _near_tie_gap(hf_model, p, ref, out, n) < NEAR_TIE[name], (p, n)
