"""Attention with flashinfer's paged kernels (GPU only), page size 1.

- decode batches (every request has one new token): ``BatchDecodeWithPagedKVCacheWrapper`` with
  ``use_tensor_cores=True`` (the CUDA-core decode kernels only take query/KV group sizes 1, 2, 3, 4, 8;
  GPTBigCode multi-query groups are 12, 16, 22, 32, 48);
- extend / mixed batches: ``BatchPrefillWithPagedKVCacheWrapper`` with ``causal=True`` (flashinfer aligns
  the causal mask to the end of each request's KV, i.e. the whole cached prefix is visible);
- extends with no cached prefix that run eagerly (``plan_ragged``, chosen by the engine: ``attention.ragged``):
  ``BatchPrefillWithRaggedKVCacheWrapper`` with ``causal=True`` over the new tokens' K/V as the model hands them
  to ``attend`` (``new_kv``: strided views of the ``c_attn`` output, no copy; flashinfer takes each of q, k, v
  with its own row and head strides, FA2 and FA3 alike), instead of gathering them from the pool by slot.

flashinfer is imported when a backend is built, never at module import, so this module imports on a
CPU-only machine. Kernels are JIT-compiled on first use (tens of seconds per kernel on a fresh machine):
call ``warmup`` at start-up. Supports float16 and bfloat16 only.
"""

from __future__ import annotations

import builtins
import importlib.util

import torch

from worker_svc.attention.base import AttentionBackend, AttentionMeta


def _tensor_aware_max(*args, **kwargs):
    """``max`` for flashinfer's decode module: a lone 1-D tensor is reduced by torch (same value, a 0-d
    tensor); everything else goes to the builtin.

    flashinfer 0.6.4's tensor-core decode ``plan`` takes ``max(kv_lens_arr_host).item()`` with Python's
    builtin over a CPU tensor: one 0-d tensor and one comparison op per request, ~1.8 ms of host time per
    plan at batch 256 (measured with torch.profiler on the H200), more than the GPU time of the step it plans.
    """
    if len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor) and args[0].dim() == 1:
        return args[0].max()
    return builtins.max(*args, **kwargs)


PREFILL_BACKENDS = ("auto", "fa2", "fa3")  # flashinfer's for the paged prefill (FlashInferAttention)

def _speed_up_decode_plan(decode_module) -> None:
    """Installs ``_tensor_aware_max`` as the ``max`` of flashinfer's decode module (module globals shadow
    builtins). Values are unchanged; tests/worker/test_gpu.py runs the planned kernels against a reference."""
    decode_module.max = _tensor_aware_max


def available() -> bool:
    """True when flashinfer can be imported and CUDA is present."""
    return torch.cuda.is_available() and importlib.util.find_spec("flashinfer") is not None


class FlashInferAttention(AttentionBackend):
    """See ``attention.base`` for the semantics. Raises RuntimeError for a CPU device or float32."""

    name = "flashinfer"

    def __init__(self, n_head: int, kv_heads: int, head_dim: int, sm_scale: float, dtype: torch.dtype,
                 device: torch.device | str, workspace: torch.Tensor,
                 graph_buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 prefill_graph_buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 prefill_backend: str = "auto"):
        """``graph_buffers`` (kv_indptr [B+1], kv_indices [N], kv_last_page_len [B], int32 on the device)
        makes a decode-only backend for CUDA-graph capture at batch size B: ``plan`` writes into them.
        ``prefill_graph_buffers`` (qo_indptr [B+1], kv_indptr [B+1], kv_indices [N], kv_last_page_len [B])
        makes a prefill-only one for CUDA-graph capture (``plan_prefill``; ``extend_whole_graph``).
        ``workspace``: flashinfer's float workspace (uint8 on the device), shared by every backend of a worker
        (one runs at a time); size it with ``workspace.workspace_bytes`` for the largest batch the backend
        will see (``allocate_workspace``). ``prefill_backend``: flashinfer's implementation of the paged prefill
        (``PREFILL_BACKENDS``: ``auto`` picks FA3 on sm90, which does not split the KV; ``fa2`` splits it over CTAs,
        always in CUDA-graph mode). Raises ValueError for another name."""
        if prefill_backend not in PREFILL_BACKENDS:
            raise ValueError(f"prefill_backend must be one of {PREFILL_BACKENDS}, got {prefill_backend!r}")
        super().__init__(n_head, kv_heads, head_dim, sm_scale)
        device = torch.device(device)
        if device.type != "cuda":
            raise RuntimeError(f"flashinfer attention needs a CUDA device, got {device}")
        if dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError(f"flashinfer attention supports float16 and bfloat16, not {dtype}")
        import flashinfer  # lazy: absent on CPU machines
        import flashinfer.decode

        _speed_up_decode_plan(flashinfer.decode)

        self.dtype = dtype
        self.workspace = workspace
        self._wrapper = None
        self.ragged = None  # the eager backend's ragged prefill wrapper (``plan_ragged``)
        if graph_buffers is not None:
            indptr, indices, last = graph_buffers
            self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True, paged_kv_indptr_buffer=indptr,
                paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last)
            for attr in ("_pin_memory_int_workspace_buffer", "_int_workspace_buffer"):  # plan_decode's page_locked
                if not isinstance(getattr(self.decode, attr, None), torch.Tensor):
                    raise RuntimeError(f"flashinfer {flashinfer.__version__}: the decode wrapper has no tensor {attr} "
                                       f"(plan_decode's page-locked ring needs it; flashinfer 0.6.4 has it)")
            self.prefill = None
            return
        if prefill_graph_buffers is not None:
            qo, indptr, indices, last = prefill_graph_buffers
            self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=qo, paged_kv_indptr_buf=indptr,
                paged_kv_indices_buf=indices, paged_kv_last_page_len_buf=last, backend=prefill_backend)
            self.decode = None
            return
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", use_tensor_cores=True)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend=prefill_backend)
        # the same float workspace (its plan is PrefillPlan / PrefillSM90Plan at page size 1 with kv_len = qo_len:
        # the eager term of attention.workspace covers it); its own 8 MiB int workspace, as every wrapper's
        self.ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD")
        self.ragged_prefill = True

    def plan(self, meta: AttentionMeta) -> None:
        if meta.is_decode and self.decode is not None:
            self.decode.plan(
                meta.kv_indptr_cpu, meta.kv_indices, meta.kv_last_page_len,
                self.n_head, self.kv_heads, self.head_dim, 1,
                q_data_type=self.dtype, kv_data_type=self.dtype, sm_scale=self.sm_scale,
            )
            self._wrapper = self.decode
        else:
            if self.prefill is None:
                raise RuntimeError("this flashinfer backend is decode-only (CUDA graph)")
            self.prefill.plan(
                meta.qo_indptr_cpu, meta.kv_indptr_cpu, meta.kv_indices, meta.kv_last_page_len,
                self.n_head, self.kv_heads, self.head_dim, 1,
                causal=True, q_data_type=self.dtype, kv_data_type=self.dtype, sm_scale=self.sm_scale,
            )
            self._wrapper = self.prefill

    def plan_ragged(self, meta: AttentionMeta) -> None:
        """Plans causal ragged prefill for a batch with no cached prefix: request b's queries attend to its own
        new tokens' K/V (``attend``'s ``new_kv``), rows ``qo_indptr[b]:qo_indptr[b + 1]`` of both. Raises
        ValueError when a request has a cached prefix, RuntimeError on a CUDA-graph backend (no ragged wrapper)."""
        if self.ragged is None:
            raise RuntimeError("this flashinfer backend serves a CUDA graph: it has no ragged prefill")
        if any(kv != qo for qo, kv in zip(meta.qo_lens, meta.kv_lens)):
            raise ValueError(f"ragged prefill reads the new tokens alone, but a request has a cached prefix "
                             f"(new tokens {meta.qo_lens}, KV lengths {meta.kv_lens})")
        self.ragged.plan(
            meta.qo_indptr_cpu, meta.kv_indptr_cpu, self.n_head, self.kv_heads, self.head_dim,
            causal=True, q_data_type=self.dtype, kv_data_type=self.dtype, sm_scale=self.sm_scale,
        )
        self._wrapper = self.ragged

    def plan_decode(self, kv_indptr_host: torch.Tensor, kv_indices: torch.Tensor,
                    kv_last_page_len_host: torch.Tensor, page_locked: torch.Tensor) -> None:
        """Plans a decode batch from a pinned host ``kv_indptr`` (int32 [B+1]), device ``kv_indices`` (int32)
        and a pinned host ``kv_last_page_len`` (int32 [B], ones) into ``page_locked`` (uint8, pinned, as large as the
        wrapper's device int workspace: ``int_workspace_bytes``; a ``plan_ring.PlanRing``'s buffer, which tracks when
        the copy out of it ran). Nothing here waits for the GPU: flashinfer copies the plan from that buffer
        asynchronously. flashinfer 0.6.4 plans into the wrapper's ``_pin_memory_int_workspace_buffer`` and reads it
        nowhere else (``run`` takes the device buffer and the plan's offsets): it points at ``page_locked`` for this
        plan only (the constructor checks it exists)."""
        own = self.decode._pin_memory_int_workspace_buffer
        self.decode._pin_memory_int_workspace_buffer = page_locked
        try:
            self.decode.plan(
                kv_indptr_host, kv_indices, kv_last_page_len_host,
                self.n_head, self.kv_heads, self.head_dim, 1,
                q_data_type=self.dtype, kv_data_type=self.dtype, sm_scale=self.sm_scale,
            )
        finally:
            self.decode._pin_memory_int_workspace_buffer = own
        self._wrapper = self.decode

    def int_workspace_bytes(self) -> int:
        """Bytes of the decode wrapper's device int workspace (the size its page-locked plan buffer must have)."""
        buf = self.decode._int_workspace_buffer
        return buf.numel() * buf.element_size()

    def plan_prefill(self, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, kv_indices: torch.Tensor,
                     kv_last_page_len_host: torch.Tensor) -> None:
        """Plans causal prefill from pinned host ``qo_indptr`` / ``kv_indptr`` (int32 [B+1]), device
        ``kv_indices`` (int32) and pinned host ``kv_last_page_len`` (int32 [B], ones), one new token or more per
        request. On a CUDA-graph backend (``prefill_graph_buffers``) the first plan fixes the most query rows
        (flashinfer sizes the captured grid from it); later plans may have fewer, never more (ValueError).
        flashinfer copies the plan out of the wrapper's one page-locked buffer asynchronously: the caller waits for
        that copy before it plans again (``extend_whole_graph`` keeps an event)."""
        self.prefill.plan(
            qo_indptr_host, kv_indptr_host, kv_indices, kv_last_page_len_host,
            self.n_head, self.kv_heads, self.head_dim, 1,
            causal=True, q_data_type=self.dtype, kv_data_type=self.dtype, sm_scale=self.sm_scale,
        )
        self._wrapper = self.prefill

    def attend(self, layer: int, q: torch.Tensor, kv_pool, out: torch.Tensor | None = None,
               new_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``out`` given: flashinfer writes into it (without it, ``run`` allocates and zero-fills one per
        layer: a fill kernel per layer). After
        ``plan_ragged`` K and V come from ``new_kv`` ([T, kv_heads, head_dim] each, views taken as they are);
        RuntimeError when it is missing then. After ``plan`` / ``plan_decode`` / ``plan_prefill`` they come from
        ``kv_pool`` (``new_kv`` unused)."""
        if self._wrapper is not None and self._wrapper is self.ragged:
            if new_kv is None:
                raise RuntimeError("planned for ragged prefill: attend needs the new tokens' K/V (new_kv)")
            k, v = new_kv
            return self.ragged.run(q.to(self.dtype), k.to(self.dtype), v.to(self.dtype), out=out)
        return self._wrapper.run(q.to(self.dtype), kv_pool.paged(layer), out=out)
