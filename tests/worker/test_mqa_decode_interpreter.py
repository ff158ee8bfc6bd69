"""The Triton multi-query decode attention's numerics on the CPU, in Triton's interpreter (``TRITON_INTERPRET=1``):
against a float64 softmax over each request's slots, for one split (the output written directly) and several
(partials and the merge), spans past a request's end (more splits than tokens), lengths that are not multiples
of BLOCK_N, head counts that are not a power of two (12, tiny_starcoder_py's) and a q strided as the model's
fused K/V write hands it over (a view into the qkv projection's output).

float16 only: the interpreter's bfloat16 ``tl.dot`` is wrong (tests/worker/test_skinny_gemm_interpreter.py).
The GPU check against flashinfer, and the speed, are ``bench/attn_bench.py``'s."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from worker_svc.attention import mqa_decode
from worker_svc.attention.mqa_decode import DecodeConfig, MQADecodeWorkspace, decode_config, splits_for

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="needs Triton importable (pip install triton; the interpreter runs on CPU)")


@pytest.fixture
def interpreted(monkeypatch):
    """The kernels built under TRITON_INTERPRET=1, and dropped again after the test (``_kernels`` is cached)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    mqa_decode._kernels.cache_clear()
    yield
    mqa_decode._kernels.cache_clear()


def reference(q, k, v, indices, indptr, scale):
    """float64 attention of each request's q [H, D] over its slots' K/V: [B, H, D]."""
    out = torch.empty(q.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        idx = indices[indptr[b]:indptr[b + 1]].long()
        kk, vv = k[idx, 0].double(), v[idx, 0].double()  # [n, D]
        p = torch.softmax(q[b].double() @ kk.T * scale, dim=-1)  # [H, n]
        out[b] = p @ vv
    return out


def make(lens, heads, dim, slots=4096, seed=0, strided=False):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(slots, 1, dim, generator=g).half()
    v = torch.randn(slots, 1, dim, generator=g).half()
    perm = torch.randperm(slots - 1, generator=g) + 1  # slot 0 is the reserved one
    indices = perm[:sum(lens)].to(torch.int32)
    indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    if strided:  # q as the fused K/V write leaves it: rows of [q heads | k | v] of the qkv output
        qkv = torch.randn(len(lens), heads * dim + 2 * dim, generator=g).half()
        q = qkv[:, :heads * dim].view(len(lens), heads, dim)
    else:
        q = torch.randn(len(lens), heads, dim, generator=g).half()
    return q, k, v, indices, indptr


@needs_triton
@pytest.mark.parametrize("lens,heads,dim,cfg", [
    ([1, 5, 64, 130], 16, 128, DecodeConfig(splits=1, block_n=32)),
    ([1, 5, 64, 130], 16, 128, DecodeConfig(splits=3, block_n=32)),
    ([3, 200, 77], 12, 64, DecodeConfig(splits=8, block_n=16)),  # spans past the end of the 3-token request
    ([300], 48, 64, DecodeConfig(splits=5, block_n=64)),
])
def test_matches_float64_reference(interpreted, lens, heads, dim, cfg):
    q, k, v, indices, indptr = make(lens, heads, dim, seed=len(lens) + heads + cfg.splits)
    scale = 1 / math.sqrt(dim)
    ws = MQADecodeWorkspace(len(lens) + 2, cfg.splits, heads, dim, "cpu") if cfg.splits > 1 else None
    got = mqa_decode.mqa_decode(q, k, v, indices, indptr, scale, cfg, ws)
    want = reference(q, k, v, indices, indptr, scale)
    assert got.shape == q.shape and got.dtype == q.dtype
    assert (got.double() - want).abs().max().item() < 2e-3


@needs_triton
def test_strided_q_and_given_out(interpreted):
    q, k, v, indices, indptr = make([40, 9], 12, 64, strided=True)
    assert not q.is_contiguous()
    out = torch.full((2, 12, 64), float("nan"), dtype=torch.float16)
    ws = MQADecodeWorkspace(2, 4, 12, 64, "cpu")
    got = mqa_decode.mqa_decode(q, k, v, indices, indptr, 0.125, DecodeConfig(splits=4, block_n=16), ws, out=out)
    assert got is out
    assert (out.double() - reference(q, k, v, indices, indptr, 0.125)).abs().max().item() < 2e-3


@needs_triton
@pytest.mark.parametrize("splits", [1, 3, 8])
def test_the_newest_token_is_written_into_its_slot_and_read_from_it(interpreted, splits):
    """``new_kv`` (the fused K/V write): each request's newest K and V, in the qkv rows after its q, land in the slot
    its list names last, and the output is the reference's over the pool holding them; a span past the end of the
    3-token request has no newest token to write. Before, a separate kernel wrote them ahead of the attention."""
    lens, heads, dim = [3, 40, 17, 1], 12, 64
    q, k, v, indices, indptr = make(lens, heads, dim, strided=True, seed=splits)
    qkv = torch.as_strided(q, (len(lens), heads * dim + 2 * dim), (q.stride(0), 1))  # the rows q is a view of
    new_k, new_v = qkv[:, heads * dim:heads * dim + dim].unsqueeze(1), qkv[:, heads * dim + dim:].unsqueeze(1)
    last = indptr[1:].long() - 1
    stale_k, stale_v = k.clone(), v.clone()
    stale_k[indices[last].long()] = stale_v[indices[last].long()] = float("nan")  # what the slots held before
    want_k, want_v = k.clone(), v.clone()
    want_k[indices[last].long()], want_v[indices[last].long()] = new_k, new_v
    ws = MQADecodeWorkspace(len(lens), splits, heads, dim, "cpu") if splits > 1 else None
    got = mqa_decode.mqa_decode(q, stale_k, stale_v, indices, indptr, 0.125, DecodeConfig(splits=splits, block_n=16),
                                ws, new_kv=(new_k, new_v))
    assert torch.equal(stale_k, want_k) and torch.equal(stale_v, want_v)
    assert (got.double() - reference(q, want_k, want_v, indices, indptr, 0.125)).abs().max().item() < 2e-3
    with pytest.raises(ValueError, match="new_kv"):
        mqa_decode.mqa_decode(q, k, v, indices, indptr, 0.125, DecodeConfig(splits=1),
                              new_kv=(new_k, new_k.clone()))  # V is not K's row neighbour


def test_rejects_what_does_not_fit():
    q, k, v, indices, indptr = make([4], 16, 128)
    with pytest.raises(ValueError, match="splits need a workspace"):
        mqa_decode.mqa_decode(q, k, v, indices, indptr, 0.1, DecodeConfig(splits=2))
    with pytest.raises(ValueError, match="float16 / bfloat16"):
        mqa_decode.mqa_decode(q.float(), k, v, indices, indptr, 0.1, DecodeConfig(splits=1))
    with pytest.raises(ValueError, match="out must be"):
        mqa_decode.mqa_decode(q, k, v, indices, indptr, 0.1, DecodeConfig(splits=1), out=torch.empty(1, 16, 64).half())
    with pytest.raises(ValueError, match=r"\[slots, 1, 128\]"):
        mqa_decode.mqa_decode(q, k[:, :, :64], v[:, :, :64], indices, indptr, 0.1, DecodeConfig(splits=1))


def test_splits_for_follows_the_measured_best():
    assert [splits_for(b, 132) for b in (1, 64, 256, 600)] == [32, 9, 3, 1]


@pytest.mark.parametrize("batch,head_dim,want", [
    (1, 64, DecodeConfig(64, 32, 4, 2)), (1, 128, DecodeConfig(64, 32, 4, 2)),  # run 12's sweep winners
    (64, 64, DecodeConfig(9, 64, 4, 3)), (64, 128, DecodeConfig(4, 64, 4, 2)),  # 128: run 22's in-graph sweep
    (32, 128, DecodeConfig(7, 64, 4, 2)), (16, 128, DecodeConfig(13, 64, 4, 2)),
    (256, 64, DecodeConfig(3, 64, 4, 3)), (600, 128, DecodeConfig(1, 64, 4, 3)),
])
def test_decode_config_takes_the_measured_winners(batch, head_dim, want):
    assert decode_config(batch, 132, head_dim) == want
