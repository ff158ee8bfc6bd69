"""The whole extend graphs' logic on CPU (``extend_whole_graph.WholeExtendGraphs`` with ``capture=False``: the
same forward over the same static buffers, token buckets and padding, only not captured, attention by the torch
backend). The captured graphs are compared with eager flashinfer on the GPU in tests/worker/test_gpu_whole_graph.py."""

from __future__ import annotations

import pytest
import torch

from tests.worker.helpers import Driver, Req, hf_greedy, make_engine
from worker_svc.attention.base import AttentionMeta
from worker_svc.extend_whole_graph import WholeExtendGraphs
from worker_svc.forward_batch import build_layout


def _whole(eng, max_tokens: int) -> WholeExtendGraphs:
    return WholeExtendGraphs(eng.model, eng.kv_pool, max_tokens, capture=False, backend=eng.backend)


@pytest.mark.parametrize("prefix,new", [(0, 1), (0, 13), (5, 16), (40, 17), (300, 48), (1700, 100)])
def test_the_whole_forward_equals_the_models_over_a_cached_prefix(model_dir, prefix, new):
    """t new tokens after ``prefix`` cached ones (random K/V), padded to a bucket of up to 128: the hidden rows and
    the last row's logits of the model's forward, and the same K/V written at the new slots."""
    eng = make_engine(model_dir, kv_tokens=4096)
    pool = eng.kv_pool
    for t in pool.k + pool.v:
        t.normal_(generator=torch.Generator().manual_seed(prefix))
    table = list(range(4000 - prefix - new, 4000))
    layout = build_layout([prefix], [new], [table])
    ids = torch.randint(1, eng.cfg.vocab_size, (new,), generator=torch.Generator().manual_seed(new))
    hidden, logits = _whole(eng, 128).run(layout, ids.tolist())
    hidden, logits = hidden.clone(), logits.clone()
    k_graph = [k[table[prefix:]].clone() for k in pool.k]
    eng.backend.plan(AttentionMeta.from_layout(layout, pool.device))
    want = eng.model(ids, torch.from_numpy(layout.positions), pool, eng.backend, torch.from_numpy(layout.out_slots))
    assert hidden.shape == (new, eng.cfg.n_embd) and logits.shape == (1, eng.cfg.vocab_size)
    assert torch.allclose(hidden, want, atol=1e-5, rtol=1e-5)
    assert torch.allclose(logits, eng.model.logits(want[-1:]), atol=1e-4, rtol=1e-5)
    for k, kg in zip(pool.k, k_graph):
        assert torch.allclose(k[table[prefix:]], kg, atol=1e-6)


def test_padding_rows_write_only_slot_0(model_dir):
    """13 tokens after 7 cached ones in the 16-token bucket: the 3 padding rows write K/V to slot 0 alone."""
    eng = make_engine(model_dir, kv_tokens=256)
    pool = eng.kv_pool
    for t in pool.k + pool.v:
        t.normal_()
    before = [t.clone() for t in pool.k + pool.v]
    layout = build_layout([7], [13], [list(range(40, 60))])
    _whole(eng, 64).run(layout, list(range(3, 16)))
    written = set(range(47, 60)) | {0}
    untouched = [s for s in range(pool.pool_slots) if s not in written]
    for old, new in zip(before, pool.k + pool.v):
        assert torch.equal(old[untouched], new[untouched])
        assert not torch.equal(old[0], new[0])


def test_only_one_request_of_at_most_the_largest_bucket_fits(model_dir):
    eng = make_engine(model_dir, kv_tokens=256)
    whole = _whole(eng, 16)
    two = build_layout([0, 0], [3, 4], [[1, 2, 3], [4, 5, 6, 7]])
    big = build_layout([0], [17], [list(range(1, 18))])
    assert whole.fits(build_layout([5], [16], [list(range(1, 22))]))
    assert not whole.fits(two) and not whole.fits(big)
    with pytest.raises(ValueError, match="one request of <= 16 tokens, got 2 requests of 7"):
        whole.run(two, [1] * 7)
    with pytest.raises(ValueError, match="one request of <= 16 tokens, got 1 requests of 17"):
        whole.run(big, [1] * 17)
    with pytest.raises(ValueError, match="need an attention backend"):
        WholeExtendGraphs(eng.model, eng.kv_pool, 16, capture=False)


def _serve(model_dir, prompts, whole_tokens: int | None, chunk: int):
    """Each prompt alone (one-request Forwards: chunks, then decode steps), then retracted to half its prompt and
    run on from there (a cached prefix), then all of them in one batch. Returns (tokens, logprobs) per run and
    how many Forwards the whole graphs ran."""
    eng = make_engine(model_dir, kv_tokens=8192)
    calls = [0]
    if whole_tokens is not None:
        eng.whole_graphs = _whole(eng, whole_tokens)
        run = eng.whole_graphs.run
        eng.whole_graphs.run = lambda *a: (calls.__setitem__(0, calls[0] + 1), run(*a))[1]
    drv = Driver(eng, chunk=chunk)
    outs = []
    for i, p in enumerate(prompts):
        r = Req(f"a{i}", p, 8)
        drv.run([r])
        drv.retract(r, keep=len(r.prompt) // 2)
        r.max_new, r.done = len(r.out) + 4, False
        drv.run([r])
        outs.append((r.out, r.logprobs))
    together = [Req(f"b{i}", p, 6) for i, p in enumerate(prompts)]
    drv.run(together)
    return outs + [(r.out, r.logprobs) for r in together], calls[0]


def test_one_request_extends_and_decodes_through_the_whole_graphs_give_the_eager_tokens(model_dir, prompts):
    """Chunks of 9 tokens (and shorter last chunks) over growing prefixes, decode steps (one token: no decode
    graphs on the CPU, so they take the whole graphs too), a retract and its re-extend over the kept prefix: the
    eager tokens and logprobs; batches of several requests (and chunks above 24 tokens) run as before."""
    eager, _ = _serve(model_dir, prompts, None, chunk=9)
    whole, calls = _serve(model_dir, prompts, 24, chunk=9)
    assert calls > 10 * len(prompts)
    for (a, la), (b, lb) in zip(eager, whole):
        assert a == b
        assert max(abs(x - y) for x, y in zip(la, lb)) < 1e-4


def test_a_prompt_through_the_whole_graphs_equals_transformers(model_dir, hf_model, prompts):
    p = prompts[2]
    eng = make_engine(model_dir, kv_tokens=4096)
    eng.whole_graphs = _whole(eng, 1024)
    r = Req("r", p, 12)
    Driver(eng).run([r])
    assert r.out == hf_greedy(hf_model, p, 12)[0]


def test_an_unknown_prefill_backend_is_refused_before_anything_is_built() -> None:
    """``--extend-attention`` reaches ``FlashInferAttention(prefill_backend=...)``: a name flashinfer does not take
    for the paged prefill is a ValueError naming the choices (checked before CUDA is needed)."""
    from worker_svc.attention.flashinfer_backend import PREFILL_BACKENDS, FlashInferAttention

    with pytest.raises(ValueError, match="prefill_backend must be one of") as err:
        FlashInferAttention(12, 1, 64, 0.125, torch.bfloat16, "cpu", torch.empty(0), prefill_backend="fa4")
    assert all(name in str(err.value) for name in PREFILL_BACKENDS)


@pytest.mark.parametrize("size,choice,want", [(16, "auto", "fa2"), (128, "auto", "fa2"), (129, "auto", "auto"),
                                              (1024, "auto", "auto"), (1024, "fa2", "fa2"), (16, "fa3", "fa3")])
def test_the_prefill_backend_of_each_bucket(size, choice, want) -> None:
    """auto: fa2 (the KV split) for the short extends, flashinfer's own choice (FA3 on sm90) for the long ones."""
    from worker_svc.extend_whole_graph import FA2_MAX_TOKENS, prefill_backend_for

    assert FA2_MAX_TOKENS == 128
    assert prefill_backend_for(size, choice) == want


def test_an_unknown_extend_attention_is_refused() -> None:
    from worker_svc.extend_whole_graph import prefill_backend_for

    with pytest.raises(ValueError, match="auto, fa2 or fa3"):
        prefill_backend_for(16, "flash")
