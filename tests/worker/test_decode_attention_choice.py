"""Which decode-graph buckets take the Triton multi-query attention (``build.triton_decode_max_batch``) and how
``Info`` names it, on the CPU (the kernel's own tests need a GPU: tests/worker/test_gpu.py, the Triton cases)."""

from __future__ import annotations

import types

import pytest

from worker_svc.build import triton_decode_max_batch
from worker_svc.engine import Engine
from worker_svc.model.config import ModelConfig
from worker_svc.model.default import SHAPES, model_config


def shape_config(shape: str) -> ModelConfig:
    return ModelConfig.from_dict(model_config(shape, vocab_size=SHAPES[shape].get("vocab_size", 1024)))


@pytest.mark.parametrize("shape,want", [("tiny_starcoder_py", 256), ("default", 256), ("starcoderbase-1b", 64),
                                        ("starcoder", 0)])
def test_auto_gives_small_models_every_bucket_the_1b_the_small_buckets_and_larger_ones_none(shape, want):
    assert triton_decode_max_batch(shape_config(shape), "auto", 256) == want
    assert triton_decode_max_batch(shape_config(shape), "auto", 16) == min(16, want)


@pytest.mark.parametrize("name,want", [("flashinfer", 0), ("triton", 128)])
def test_a_named_kernel_takes_every_bucket_or_none(name, want):
    assert triton_decode_max_batch(shape_config("starcoderbase-1b"), name, 128) == want


def test_a_model_with_several_kv_heads_keeps_flashinfer_and_a_bad_name_is_refused():
    cfg = shape_config("tiny_starcoder_py")
    assert cfg.kv_heads == 1
    assert triton_decode_max_batch(types.SimpleNamespace(kv_heads=2, n_embd=cfg.n_embd), "auto", 256) == 0
    with pytest.raises(ValueError, match="decode_attention"):
        triton_decode_max_batch(cfg, "flash", 256)


@pytest.mark.parametrize("triton_max,want", [(None, "flashinfer"), (0, "flashinfer"), (256, "flashinfer+triton-decode"),
                                             (64, "flashinfer+triton-decode<=64")])
def test_info_names_the_buckets_that_take_the_triton_kernel(triton_max, want):
    graphs = None if triton_max is None else types.SimpleNamespace(triton_max_batch=triton_max, max_batch=256)
    eng = types.SimpleNamespace(backend=types.SimpleNamespace(name="flashinfer"), graphs=graphs)
    assert Engine.attention_name(eng) == want
