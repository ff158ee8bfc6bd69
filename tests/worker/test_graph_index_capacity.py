"""The CUDA graphs' shared kv_indices buffer is sized by rows x context, not by the KV pool (CPU: the formula;
tests/worker/test_gpu.py runs a batch that needs it on the GPU)."""

import torch

from worker_svc.cuda_graph import index_capacity
from worker_svc.kv_pool import geometry
from worker_svc.model.default import model_config
from worker_svc.model.config import ModelConfig


def test_rows_sharing_one_prefix_fit_when_their_tables_exceed_the_pool():
    cfg = ModelConfig.from_dict(model_config("starcoderbase-1b", dtype="bfloat16"))
    pool_slots = geometry(cfg, torch.bfloat16, kv_tokens=76_800).pool_slots
    rows, table = 64, 3_201  # one tenant's 3,000 + 200-token prompt, read by 64 decoding rows (run 6, call 5)
    assert rows * table > pool_slots
    assert index_capacity(256, cfg.n_positions) >= rows * table
    assert index_capacity(256, cfg.n_positions) == 256 * cfg.n_positions  # every row at the context limit
