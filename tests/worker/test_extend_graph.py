"""The piecewise extend graphs' logic on CPU (``extend_graph.ExtendGraphs`` with ``capture=False``: the same
pieces over the same static buffers, token buckets and padding, only not captured). The captured graphs are
compared with the eager forward on the GPU in tests/worker/test_gpu.py."""

from __future__ import annotations

import pytest
import torch

from tests.worker.helpers import Driver, Req, hf_greedy, make_engine
from worker_svc.attention.base import AttentionMeta
from worker_svc.extend_graph import ExtendGraphs, token_buckets
from worker_svc.forward_batch import build_layout


def test_token_buckets_are_powers_of_two_and_halfway_points_up_to_the_maximum():
    assert token_buckets(1024) == [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
    assert token_buckets(100) == [16, 24, 32, 48, 64, 96, 100]
    assert token_buckets(20) == [16, 20]
    assert token_buckets(8) == [8]
    with pytest.raises(ValueError, match="max_tokens"):
        token_buckets(0)


def _run(model_dir, prompts, max_tokens: int | None, chunk: int):
    eng = make_engine(model_dir, kv_tokens=4096)
    if max_tokens is not None:
        eng.extend_graphs = ExtendGraphs(eng.model, eng.kv_pool, max_tokens, capture=False)
    drv = Driver(eng, chunk=chunk)
    reqs = [Req(f"r{i}", p, 12) for i, p in enumerate(prompts)]
    drv.run(reqs)
    return [(r.out, r.logprobs) for r in reqs]


def test_extends_through_the_pieces_give_the_eager_tokens(model_dir, prompts):
    """Chunked prefill of 7 prompts (chunks of 9: batches of 9..63 tokens, mixed with decodes, most padded to a
    bucket), then decode batches of 1..7 rows, all through the pieces with at most 48 tokens (larger batches
    run eagerly): the tokens and logprobs of the eager forward."""
    eager = _run(model_dir, prompts, None, chunk=9)
    pieces = _run(model_dir, prompts, 48, chunk=9)
    for (a, la), (b, lb) in zip(eager, pieces):
        assert a == b
        assert max(abs(x - y) for x, y in zip(la, lb)) < 1e-4


def test_a_prompt_through_the_pieces_equals_transformers(model_dir, hf_model, prompts):
    p = prompts[2]
    ours = _run(model_dir, [p], 1024, chunk=1 << 30)[0][0]
    assert ours == hf_greedy(hf_model, p, 12)[0]


def test_padding_rows_write_only_slot_0(model_dir):
    """13 tokens in the 16-token bucket: the 3 padding rows write K/V to slot 0 alone; every other slot
    outside the batch keeps its contents, and the batch's rows equal the eager forward's."""
    eng = make_engine(model_dir, kv_tokens=256)
    pool = eng.kv_pool
    for t in pool.k + pool.v:
        t.normal_()
    before = [t.clone() for t in pool.k + pool.v]
    layout = build_layout([0], [13], [list(range(40, 53))])
    ids = torch.arange(3, 16, dtype=torch.long)
    eng.backend.plan(AttentionMeta.from_layout(layout, pool.device))
    graphs = ExtendGraphs(eng.model, pool, 64, capture=False)
    hidden = graphs.run(layout, ids, eng.backend).clone()
    assert hidden.shape == (13, eng.cfg.n_embd)
    written = set(range(40, 53)) | {0}
    untouched = [s for s in range(pool.pool_slots) if s not in written]
    for old, new in zip(before, pool.k + pool.v):
        assert torch.equal(old[untouched], new[untouched])
        assert not torch.equal(old[0], new[0])
    want = eng.model(ids, torch.from_numpy(layout.positions), pool, eng.backend, torch.from_numpy(layout.out_slots))
    assert torch.allclose(hidden, want, atol=1e-5, rtol=1e-5)


def test_a_batch_above_the_largest_bucket_is_refused_by_the_pieces(model_dir):
    eng = make_engine(model_dir, kv_tokens=256)
    graphs = ExtendGraphs(eng.model, eng.kv_pool, 16, capture=False)
    layout = build_layout([0], [17], [list(range(1, 18))])
    assert not graphs.fits(layout)
    with pytest.raises(ValueError, match="17 tokens exceed the largest extend graph"):
        graphs.run(layout, torch.zeros(17, dtype=torch.long), eng.backend)
