"""The decode graphs' attention by default (``build.auto_decode_attention``) and how ``Info`` names it, on the CPU
(the kernel's own tests need a GPU: tests/worker/test_gpu.py, the Triton decode cases)."""

from __future__ import annotations

import types

import pytest

from worker_svc.build import auto_decode_attention
from worker_svc.engine import Engine
from worker_svc.model.config import ModelConfig
from worker_svc.model.default import SHAPES, model_config


def shape_config(shape: str) -> ModelConfig:
    return ModelConfig.from_dict(model_config(shape, vocab_size=SHAPES[shape].get("vocab_size", 1024)))


@pytest.mark.parametrize("shape,want", [("tiny_starcoder_py", "triton"), ("starcoderbase-1b", "flashinfer"),
                                        ("starcoder", "flashinfer")])
def test_triton_decode_attention_by_default_for_small_multi_query_models_only(shape, want):
    assert auto_decode_attention(shape_config(shape)) == want


def test_a_model_with_several_kv_heads_keeps_flashinfer():
    cfg = shape_config("tiny_starcoder_py")
    assert cfg.kv_heads == 1
    assert auto_decode_attention(types.SimpleNamespace(kv_heads=2, n_embd=cfg.n_embd)) == "flashinfer"


@pytest.mark.parametrize("graphs,want", [(None, "flashinfer"), ("flashinfer", "flashinfer"),
                                         ("triton", "flashinfer+triton-decode")])
def test_info_names_the_decode_graphs_attention_when_it_is_another_kernel(graphs, want):
    eng = types.SimpleNamespace(backend=types.SimpleNamespace(name="flashinfer"),
                                graphs=None if graphs is None else types.SimpleNamespace(decode_attention=graphs))
    assert Engine.attention_name(eng) == want
