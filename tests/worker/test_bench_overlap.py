"""The two-stream overlap experiment's prefill stand-in (worker_svc/bench_overlap.py) is the model's extend:
its hidden states equal transformers' on the same prompts (CPU, fp32). The overlap timing itself needs CUDA
streams and runs only in the worker bench on a GPU (`python -m worker_svc.bench --decode-steps 8 --overlap-prefill 8192`)."""

from __future__ import annotations

import pytest
import torch

from tests.worker.helpers import make_engine
from worker_svc.bench_overlap import prefill_stand_in


def test_prefill_stand_in_gives_transformers_hidden_states(model_dir, hf_model):
    eng = make_engine(model_dir, kv_tokens=256)
    ids = torch.randint(1, eng.cfg.vocab_size, (3, 40), generator=torch.Generator().manual_seed(3))
    ours = prefill_stand_in(eng.model, eng.kv_pool, ids)()
    with torch.no_grad():
        ref = hf_model.transformer(ids).last_hidden_state  # after ln_f, [3, 40, n_embd]
    assert ours.shape == (120, eng.cfg.n_embd)
    assert torch.allclose(ours, ref.reshape(120, -1), atol=1e-4, rtol=1e-4), (ours - ref.reshape(120, -1)).abs().max()
    # it wrote each token's K/V at slots 1..120 (layer 0's K equals the model's own projection of token 0)
    k0 = eng.model.transformer.h[0].attn.split_qkv(eng.model.transformer.h[0].ln_1(
        eng.model.transformer.wte(ids[0, :1]) + eng.model.transformer.wpe(torch.zeros(1, dtype=torch.long))))[1]
    assert torch.allclose(eng.kv_pool.k[0][1].reshape(-1), k0.reshape(-1), atol=1e-5)


def test_prefill_stand_in_rejects_prompts_beyond_the_pool_or_the_positions(model_dir):
    eng = make_engine(model_dir, kv_tokens=64)  # 65 slots: 0 (padding) and 1..64
    with pytest.raises(ValueError, match="not all in a pool"):
        prefill_stand_in(eng.model, eng.kv_pool, torch.ones(2, 40, dtype=torch.long))
    with pytest.raises(ValueError, match="not all in a pool"):
        prefill_stand_in(eng.model, eng.kv_pool, torch.ones(1, 10, dtype=torch.long), first_slot=60)
    with pytest.raises(ValueError, match="not all in a pool"):
        prefill_stand_in(eng.model, eng.kv_pool, torch.ones(1, 10, dtype=torch.long), first_slot=0)
    prefill_stand_in(eng.model, eng.kv_pool, torch.ones(1, 10, dtype=torch.long), first_slot=55)  # 55..64 fit
    n_pos = eng.cfg.n_positions
    big = make_engine(model_dir, kv_tokens=n_pos + 64)
    with pytest.raises(ValueError, match="exceed n_positions"):
        prefill_stand_in(big.model, big.kv_pool, torch.ones(1, n_pos + 1, dtype=torch.long))


def test_the_overlap_flag_needs_decode_graphs_and_steps():
    from worker_svc import bench

    for argv in (["--overlap-prefill", "2048"],  # --decode-steps 1
                 ["--overlap-prefill", "2048", "--decode-steps", "8", "--batches", "64", "--cuda-graph-max-batch", "32"],
                 ["--overlap-prefill", "1000", "--decode-steps", "8"],  # not a multiple of 1,024
                 ["--overlap-prefill", "-1024", "--decode-steps", "8"]):
        with pytest.raises(SystemExit):
            bench.main(argv)
