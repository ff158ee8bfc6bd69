"""The split-K GEMM's configuration choice and its defaults, on the CPU (the kernel's own tests need a GPU:
tests/worker/test_gpu_skinny_gemm.py)."""

from __future__ import annotations

import pytest
import torch

from worker_svc.build import auto_resident_mm_rows, auto_resident_rows, auto_splitk_rows
from worker_svc.model.config import ModelConfig
from worker_svc.model.default import SHAPES, model_config
from worker_svc.model.gpt_bigcode import GPTBigCodeForCausalLM
from worker_svc.model.skinny_gemm import choose

SHARED_MEMORY = 227 * 1024  # usable per block on the H100/H200 (sm90)


def shape_config(shape: str) -> ModelConfig:
    return ModelConfig.from_dict(model_config(shape, vocab_size=SHAPES[shape].get("vocab_size", 1024)))


@pytest.mark.parametrize("shape", ["tiny_starcoder_py", "starcoderbase-1b", "starcoder"])
def test_every_choice_fits_in_shared_memory_and_splits_k_into_whole_blocks(shape):
    d, f = SHAPES[shape]["n_embd"], SHAPES[shape]["n_inner"]
    for k, n in [(d, d + 2 * (d // SHAPES[shape]["n_head"])), (d, d), (d, f), (f, d)]:
        for m in range(1, 257):
            c = choose(m, k, n, 132)
            assert (c.block_m + c.block_n) * c.block_k * 2 * c.stages <= SHARED_MEMORY, (m, k, n, c)
            assert c.split >= 1 and k // c.split >= min(k, 128), (m, k, n, c)
            assert c.block_m >= min(m, 16), (m, c)


def test_one_wave_of_ctas_at_64_rows_for_the_1b_projections():
    for k, n in [(2048, 2048), (8192, 2048), (2048, 8192)]:
        c = choose(64, k, n, 132)
        ctas = -(-n // c.block_n) * c.split
        assert 100 <= ctas <= 160, (k, n, c, ctas)


def test_split_k_is_on_by_default_for_small_models_only():
    assert auto_splitk_rows(shape_config("tiny_starcoder_py")) == 16
    assert auto_splitk_rows(shape_config("default")) == 16
    assert auto_splitk_rows(shape_config("starcoderbase-1b")) == 0
    assert auto_splitk_rows(shape_config("starcoder")) == 0


def test_resident_rows_follow_the_measured_sizes():
    """Run 31 (H100): the resident-weight GEMV pays up to 4 rows on tiny_starcoder_py, at 1 row on the 1B; the larger
    models keep cuBLAS (unmeasured)."""
    assert auto_resident_rows(shape_config("tiny_starcoder_py"), pdl=True) == 4
    assert auto_resident_rows(shape_config("starcoderbase-1b"), pdl=True) == 1
    assert auto_resident_rows(shape_config("starcoder"), pdl=True) == 0
    assert auto_resident_rows(shape_config("tiny_starcoder_py"), pdl=False) == 0  # its gain is PDL's overlap


def test_the_worker_refuses_resident_rows_the_kernel_is_not_built_for(tmp_path):
    from worker_svc.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--model-path", str(tmp_path), "--resident-rows", "5"])
    with pytest.raises(SystemExit):
        parse_args(["--model-path", str(tmp_path), "--resident-rows", "-1"])
    assert parse_args(["--model-path", str(tmp_path), "--resident-rows", "4"]).resident_rows == 4
    assert parse_args(["--model-path", str(tmp_path)]).resident_rows is None  # build.auto_resident_rows


def test_on_the_cpu_the_model_keeps_torch_projections_and_plain_launches():
    model = GPTBigCodeForCausalLM(shape_config("default"))
    model.use_fused_kernels(splitk_rows=64, pdl=True)
    assert model.mm is None and model.pdl is False
    x = torch.zeros(3, model.cfg.n_embd)
    assert model._mm(x) is None


@pytest.mark.parametrize("dtype,on", [(torch.float32, False), (torch.bfloat16, True), (torch.float16, True)])
def test_split_k_is_for_16_bit_models_only(monkeypatch, dtype, on):
    """In float32, Triton's tl.dot rounds the inputs to TF32 (the kernel's default input precision) and the
    x and W tiles take twice the shared memory ``choose`` budgets (2 bytes an element): fp32 on CUDA, the
    configuration that must equal transformers token for token, keeps cuBLAS's fp32 GEMMs. Triton and CUDA
    stand-ins (this is about the switch): ``fused.enabled`` says yes, DecodeGemms records its construction."""
    from worker_svc.model import decode_gemms, fused

    made = []
    monkeypatch.setattr(fused, "enabled", lambda device: True)
    monkeypatch.setattr(decode_gemms, "DecodeGemms",
                        lambda shapes, rows, device, pdl, resident_rows, mm_rows: made.append((rows, resident_rows, mm_rows))
                        or "mm")
    model = GPTBigCodeForCausalLM(shape_config("default")).to(dtype)
    model.use_fused_kernels(splitk_rows=64, pdl=True)
    assert (model.mm == "mm") == on and made == ([(64, 0, 0)] if on else [])
    assert model.pdl is True  # the fused kernels' PDL does not depend on the dtype
    made.clear()
    model.use_fused_kernels(splitk_rows=0, pdl=True, resident_rows=2)  # the resident kernel alone builds it too
    assert (model.mm == "mm") == on and made == ([(0, 2, 0)] if on else [])
    made.clear()
    model.use_fused_kernels(splitk_rows=0, pdl=True, resident_mm_rows=32)  # ... and the resident GEMM alone
    assert (model.mm == "mm") == on and made == ([(0, 0, 32)] if on else [])


def test_splitk_linear_refuses_float32_before_it_needs_triton():
    from worker_svc.model.skinny_gemm import GemmConfig, SplitKWorkspace, splitk_linear

    x, w = torch.zeros(2, 64), torch.zeros(32, 64)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        splitk_linear(x, w, None, GemmConfig(16, 32, 128, 1), SplitKWorkspace(0, 0, "cpu"))


def test_resident_gemm_rows_follow_the_measured_sizes():
    """Run 32 (H100): the tiny model's steps at 8-32 rows x0.80-0.89 with it; the 1B's within 3% where it did not
    lose (B = 32 / 64 x1.04 / x1.09), so it stays off there."""
    assert auto_resident_mm_rows(shape_config("tiny_starcoder_py"), pdl=True) == 32
    assert auto_resident_mm_rows(shape_config("starcoderbase-1b"), pdl=True) == 0
    assert auto_resident_mm_rows(shape_config("tiny_starcoder_py"), pdl=False) == 0


def test_the_worker_refuses_resident_gemm_rows_the_kernel_is_not_built_for(tmp_path):
    from worker_svc.__main__ import parse_args

    for bad in ("65", "-1"):
        with pytest.raises(SystemExit):
            parse_args(["--model-path", str(tmp_path), "--resident-mm-rows", bad])
    assert parse_args(["--model-path", str(tmp_path), "--resident-mm-rows", "64"]).resident_mm_rows == 64
    assert parse_args(["--model-path", str(tmp_path)]).resident_mm_rows is None  # auto
