"""Fused kernels of the GPTBigCode block for CUDA (Triton), with the unfused torch code as their definition.

- ``add_layer_norm(h, x, ln)``: the residual add and the next LayerNorm in one kernel, ``(h + x,
  LayerNorm(h + x))``. The sum is rounded to the model dtype before it is normalised, as the unfused
  ``h = h + x; ln(h)`` does, and the statistics are float32 (as torch's LayerNorm): one read of h and x,
  one write of each output, instead of three kernels and five passes over the hidden state.
- ``mlp_up(x, c_fc)``: ``gelu_tanh(x @ W.T + b)`` with the bias and the tanh GELU in the cuBLASLt epilogue
  (``torch._addmm_activation(..., use_gelu=True)``, which falls back to addmm + gelu(tanh) itself where
  the epilogue does not apply). Not bit-equal to the unfused path: the epilogue applies GELU to the float32
  accumulator, where the unfused path first rounds ``x @ W.T + b`` to the model dtype.
- ``write_kv(qkv, k, v, slots, k_col, width)``: a multi-query layer's new K and V copied from the ``c_attn``
  output straight into the pool's slots, one kernel for both (the unfused path splits, reshapes and runs two
  ``index_put`` kernels). Exact (a copy). The query is then handed to attention as a strided view of the same
  output (flashinfer reads q's row and head strides), so no copy of q is made either.

Triton is imported on first use on a CUDA tensor, so this module imports on a CPU-only machine; the
model calls these only when ``enabled(device)`` (CUDA and Triton present). tests/worker/test_gpu_fused.py
compares each against its torch definition on the GPU.
"""

from __future__ import annotations

import functools
import importlib.util

import torch
import torch.nn.functional as F
from torch import nn


def enabled(device: torch.device | str) -> bool:
    """True when the fused kernels can run on ``device`` (CUDA with Triton importable)."""
    return torch.device(device).type == "cuda" and importlib.util.find_spec("triton") is not None


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def add_ln(h_ptr, x_ptr, w_ptr, b_ptr, sum_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # launched before the kernel ahead finished: let the next one launch, then wait for that one
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        off = row * n_cols + cols
        h = tl.load(h_ptr + off, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        s = (h + x).to(sum_ptr.dtype.element_ty)  # rounded as the unfused add rounds it
        tl.store(sum_ptr + off, s, mask=mask)
        sf = s.to(tl.float32)
        mean = tl.sum(sf, axis=0) / n_cols
        d = tl.where(mask, sf - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + off, (d * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)

    return add_ln, triton.next_power_of_2


def add_layer_norm(h: torch.Tensor, x: torch.Tensor, ln: nn.LayerNorm,
                   pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """h, x [T, n_embd] (same dtype, contiguous) -> (h + x, ln(h + x)), both [T, n_embd] in that dtype.

    CUDA: one Triton kernel (``pdl``: as a programmatic dependent launch); elsewhere the torch definition.
    Raises ValueError for mismatched shapes."""
    if h.shape != x.shape or h.dim() != 2:
        raise ValueError(f"add_layer_norm needs two [T, n_embd] tensors, got {tuple(h.shape)} and {tuple(x.shape)}")
    if not h.is_cuda:
        s = h + x
        return s, ln(s)
    kernel, next_pow2 = _kernel()
    h, x = h.contiguous(), x.contiguous()
    rows, cols = h.shape
    s, y = torch.empty_like(h), torch.empty_like(h)
    block = next_pow2(cols)
    kernel[(rows,)](h, x, ln.weight, ln.bias, s, y, cols, ln.eps, BLOCK=block, PDL=pdl,
                    num_warps=min(16, max(4, block // 512)), **({"launch_pdl": True} if pdl else {}))
    return s, y


def mlp_up(x: torch.Tensor, c_fc: nn.Linear) -> torch.Tensor:
    """x [T, n_embd] -> gelu_tanh(c_fc(x)) [T, n_inner], bias and GELU in the GEMM's epilogue."""
    if not x.is_cuda:
        return F.gelu(c_fc(x), approximate="tanh")
    return torch._addmm_activation(c_fc.bias, x, c_fc.weight.t(), use_gelu=True)


@functools.cache
def _kv_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def write_kv(qkv_ptr, k_ptr, v_ptr, slot_ptr, stride_row, k_col, width, BLOCK: tl.constexpr,
                 PDL: tl.constexpr):
        if PDL:  # as add_ln
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        row = tl.program_id(0).to(tl.int64)
        slot = tl.load(slot_ptr + row).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < width
        src = qkv_ptr + row * stride_row + k_col + cols
        tl.store(k_ptr + slot * width + cols, tl.load(src, mask=mask), mask=mask)
        tl.store(v_ptr + slot * width + cols, tl.load(src + width, mask=mask), mask=mask)

    return write_kv, triton.next_power_of_2


def write_kv(qkv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, k_col: int, width: int,
             pdl: bool = False) -> None:
    """Copies ``qkv[:, k_col:k_col + width]`` to ``k[slots]`` and the next ``width`` columns to ``v[slots]``.

    qkv [T, C] (rows contiguous), k and v [pool_slots, ...] contiguous with ``width`` elements a slot (one K/V
    head of a multi-query layer: width = head_dim), all one dtype; slots int64 [T] (validated by the caller).
    CUDA: one Triton kernel (``pdl``: as a programmatic dependent launch); elsewhere index_put. Raises
    ValueError for mismatched dtypes or widths."""
    if qkv.dtype != k.dtype or k.dtype != v.dtype or k.stride(0) != width or qkv.shape[1] < k_col + 2 * width:
        raise ValueError(f"write_kv: qkv {tuple(qkv.shape)} {qkv.dtype}, k {tuple(k.shape)} {k.dtype}, "
                         f"v {v.dtype}, columns {k_col}+2x{width}")
    if not qkv.is_cuda:
        k[slots] = qkv[:, k_col:k_col + width].reshape(-1, *k.shape[1:])
        v[slots] = qkv[:, k_col + width:k_col + 2 * width].reshape(-1, *v.shape[1:])
        return
    if qkv.stride(1) != 1:
        qkv = qkv.contiguous()
    kernel, next_pow2 = _kv_kernel()
    kernel[(qkv.shape[0],)](qkv, k, v, slots, qkv.stride(0), k_col, width, BLOCK=next_pow2(width), PDL=pdl,
                            num_warps=1, **({"launch_pdl": True} if pdl else {}))
