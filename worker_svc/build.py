"""Builds an Engine from command-line settings: device, dtype, weights, KV pool, attention backend."""

from __future__ import annotations

import pathlib
import uuid
from dataclasses import dataclass

import torch

from worker_svc.attention import flashinfer_backend
from worker_svc.attention.base import AttentionBackend
from worker_svc.attention.torch_ref import TorchAttention
from worker_svc.engine import Engine
from worker_svc.kv_pool import KVPool, geometry
from worker_svc.model.config import ModelConfig
from worker_svc.model.loader import DTYPES, load_model

DEFAULT_CPU_KV_TOKENS = 65536
DEFAULT_GPU_KV_FRACTION = 0.85


@dataclass(frozen=True)
class WorkerOptions:
    """Settings of one worker. ``kv_tokens`` / ``kv_fraction``: at most one; neither = the device default
    (CPU: 65,536 tokens; CUDA: 0.85 of free memory after weights)."""

    model_path: str
    device: str = "auto"
    dtype: str = "auto"
    kv_tokens: int | None = None
    kv_fraction: float | None = None
    page_size: int = 1
    attention: str = "auto"
    worker_id: str = "worker-0"
    seed: int = 0
    cuda_graph_max_batch: int = 256  # decode batches up to this size replay CUDA graphs (flashinfer only); 0 = off
    extend_graph_max_tokens: int = 1024  # other batches up to this many tokens replay piecewise graphs; 0 = off
    extend_whole_graph: bool = True  # one-request extends up to extend_graph_max_tokens: one graph of the forward
    splitk_rows: int | None = None  # CUDA: batches up to this many rows through model/skinny_gemm; None: auto_splitk_rows
    resident_rows: int | None = None  # CUDA: batches up to this many rows through model/resident_gemv; None: auto
    resident_mm_rows: int | None = None  # CUDA: ... then up to this many through model/resident_gemm; None: auto
    pdl: bool = True  # CUDA: the Triton kernels as programmatic dependent launches (weights prefetched to L2)
    decode_attention: str = "auto"  # the decode graphs' attention: flashinfer, triton (attention/mqa_decode), or auto
    ragged_prefill: bool = True  # eager extends without a cached prefix: flashinfer's ragged prefill (attention/ragged)
    prepare_ahead: bool = True  # a chained multi-step Forward builds its step metadata while the one ahead runs
    launch_behind: bool = True  # ... and is launched behind it on the device before its commit (Engine._launch_behind)
    launch_lead_steps: int = 1  # ... once the device starts the step this many from the end of the one ahead
    hold_commit_ms: float = 0.0  # > 0: a multi-step commit waits up to this long for a Forward coming behind it
    extend_ahead: bool = True  # an eager extend of items with their prefixes is validated and laid out at arrival
    extend_behind: bool = True  # ... and launched behind the extend ahead of it before that one's commit
    extend_attention: str = "auto"  # the whole extend graphs' flashinfer prefill: fa2, fa3, auto (prefill_backend_for)


def resolve_device(name: str) -> torch.device:
    """auto -> cuda when available, else cpu. Raises ValueError for cuda without CUDA."""
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda:0")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto -> bfloat16 on CUDA, float32 on CPU. Raises ValueError for unknown names."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {sorted(DTYPES)} or auto")
    return DTYPES[name]


def make_backend(name: str, cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
                 cuda_graph_max_batch: int = 0, whole_graph_tokens: int = 0) -> AttentionBackend:
    """auto -> flashinfer on CUDA (fp16/bf16) when it imports, else torch. Raises ValueError/RuntimeError
    when an explicit choice cannot run here.

    flashinfer: the one float workspace of the worker is allocated here, sized for eager batches, for
    CUDA-graph decode up to ``cuda_graph_max_batch`` and for whole extend graphs up to ``whole_graph_tokens``
    (0: none; ``attention.workspace``); the graphs share it (``make_graphs``, ``make_whole_graphs``). Call this
    before sizing the KV pool, so the pool is sized after it."""
    scale = cfg.head_dim ** -0.5 if cfg.scale_attn_weights else 1.0
    if name == "auto":
        ok = device.type == "cuda" and dtype != torch.float32 and flashinfer_backend.available()
        name = "flashinfer" if ok else "torch"
    if name == "torch":
        return TorchAttention(cfg.n_head, cfg.kv_heads, cfg.head_dim, scale)
    if name == "flashinfer":
        from worker_svc.attention.workspace import allocate_workspace
        from worker_svc.cuda_graph import buckets

        from worker_svc.extend_graph import token_buckets

        graph_batches = buckets(cuda_graph_max_batch) if cuda_graph_max_batch > 0 else ()
        extend_tokens = token_buckets(whole_graph_tokens) if whole_graph_tokens > 0 else ()
        workspace = allocate_workspace(cfg.n_head, cfg.kv_heads, cfg.head_dim, device, graph_batches, extend_tokens)
        return flashinfer_backend.FlashInferAttention(cfg.n_head, cfg.kv_heads, cfg.head_dim, scale, dtype, device,
                                                      workspace)
    raise ValueError(f"unknown attention backend {name!r}; choose auto, torch or flashinfer")


def free_bytes(device: torch.device) -> int:
    """Free memory of ``device`` in bytes (CUDA: mem_get_info; CPU: MemAvailable of /proc/meminfo)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read MemAvailable from /proc/meminfo")


def auto_splitk_rows(cfg) -> int:
    """Rows up to which the decode projections use the split-K GEMMs with PDL by default: 16 for models of
    n_embd <= 1024, else 0 (cuBLAS). H200 run 9 (bench/results/h200-run9/call3, call4; GPU time of a decode step,
    graph replay): tiny_starcoder_py (768) B = 1 / 64 / 256: 0.78 / 1.04 / 1.50 ms with cuBLAS, 0.64 / 0.98 / 1.49
    with them (then up to 64 rows); starcoderbase-1b (2048): 1.43 / 1.85 / 2.80 with cuBLAS, 1.57 / 1.94 / 4.33 with
    them. H200 run 25 (bench/results/h200-run25/call6.txt, with the Triton attention and the fused kernels since):
    tiny B = 1 / 16 / 64 split-K 0.62-0.63 / 0.71-0.72 / 0.89, cuBLAS 0.66 / 0.74 / 0.87-0.88; split-K up to 16 rows
    B = 24 / 32 / 48 / 64: 0.79 / 0.79 / 0.86-0.87 / 0.87 against 0.79 / 0.80 / 0.87 / 0.89 up to 64. With PDL on,
    the resident kernels take these rows first (``auto_resident_rows``, ``auto_resident_mm_rows``: up to 32 rows on
    such models since run 32), so split-K runs them only with ``--no-pdl`` or those set lower."""
    return 16 if cfg.n_embd <= 1024 else 0


def auto_resident_rows(cfg, pdl: bool) -> int:
    """Rows up to which the decode projections use ``model/resident_gemv`` (weights read before the kernel ahead
    ends) by default: 0 without ``pdl`` (its gain is the overlap PDL gives: unmeasured without), else 4 for models
    of n_embd <= 1024, 1 up to 2048, 0 above (unmeasured). Run 31 on an H100
    (bench/results/h200-run31/call1, ``worker_svc.bench --resident-rows 0 / 4``, GPU time of a decode step, two
    alternated runs alike): tiny_starcoder_py B = 1 / 2 / 4: 0.65 / 0.66 / 0.69 ms -> 0.41 / 0.45 / 0.59;
    starcoderbase-1b: 1.42 / 1.43 / 1.48 -> 1.16 / 1.46 / 1.92 (a row is one more pass of FMAs over the 1B's
    registers: it loses from 2 rows)."""
    if not pdl:
        return 0
    if cfg.n_embd <= 1024:
        return 4
    return 1 if cfg.n_embd <= 2048 else 0


def auto_resident_mm_rows(cfg, pdl: bool) -> int:
    """Rows up to which the small decode projections use ``model/resident_gemm`` (the weights read before the kernel
    ahead ends, tensor cores) above ``auto_resident_rows`` by default: 0 without ``pdl``, 32 for models of n_embd <=
    1024, else 0. Run 32 on an H100 (bench/results/h200-run32/call3, call4; ``worker_svc.bench``, GPU time of a
    decode step, CTAs of 8 warps x 32 columns): tiny_starcoder_py B = 8 / 16 / 32 / 64: 0.71 / 0.74 / 0.79 / 0.89 ms
    (split-K up to 16 rows, cuBLAS above) -> 0.57 / 0.60 / 0.70 / 0.89; starcoderbase-1b B = 2 / 4 / 8 / 16: 1.44 /
    1.49 / 1.51 / 1.61 -> 1.40 / 1.47 / 1.50 / 1.61 (8 x 64; call 2: B = 32 / 64 1.71 / 1.90 -> 1.78 / 2.07): within
    3% where it does not lose, so not for the 1B."""
    if not pdl:
        return 0
    return 32 if cfg.n_embd <= 1024 else 0


def triton_decode_max_batch(cfg, decode_attention: str, max_batch: int) -> int:
    """Decode-graph buckets of up to this many rows take the Triton multi-query attention (``attention/mqa_decode``),
    the larger ones flashinfer's. ``decode_attention``: ``flashinfer`` (0), ``triton`` (``max_batch``) or ``auto``:
    for multi-query models, every bucket when n_embd <= 1024, buckets up to 64 rows when n_embd <= 2048 (the 1B),
    none for larger ones (3B-15B: not measured with it in the decode graphs) nor for other models.
    Raises ValueError for another name. H200 run 12 (bench/results/h200-run12/call4, ``worker_svc.bench`` K = 8,
    context 1,152, the worker's defaults, GPU time of a decode step, flashinfer -> triton): tiny_starcoder_py (768)
    B = 1 / 64 / 256: 0.64 / 0.98 / 1.49 -> 0.64 / 0.89 / 1.32 ms; starcoderbase-1b (2048): 1.40 / 1.85 / 2.82 ->
    1.31 / 1.85 / 2.89 (its 128-wide heads: the kernel gains where it splits a request's KV many ways)."""
    if decode_attention == "flashinfer":
        return 0
    if decode_attention == "triton":
        return max_batch
    if decode_attention != "auto":
        raise ValueError(f"decode_attention must be auto, flashinfer or triton (got {decode_attention!r})")
    if cfg.kv_heads != 1:
        return 0
    if cfg.n_embd <= 1024:
        return max_batch
    return min(max_batch, 64) if cfg.n_embd <= 2048 else 0


def build_engine(opts: WorkerOptions) -> Engine:
    """Loads the model and allocates the KV pool; the engine's epoch is a fresh uuid4 (boot id).

    Raises ValueError / FileNotFoundError / RuntimeError with the reason when the settings cannot work.
    """
    if opts.kv_tokens is not None and opts.kv_fraction is not None:
        raise ValueError("give at most one of --kv-tokens and --kv-fraction")
    device = resolve_device(opts.device)
    dtype = resolve_dtype(opts.dtype, device)
    cfg, model = load_model(opts.model_path, dtype=dtype, device=device)
    # CUDA with Triton: residual add + LayerNorm and the GELU epilogue fused, small batches' split-K GEMMs
    model.use_fused_kernels(splitk_rows=auto_splitk_rows(cfg) if opts.splitk_rows is None else opts.splitk_rows,
                            pdl=opts.pdl,
                            resident_rows=auto_resident_rows(cfg, opts.pdl) if opts.resident_rows is None
                            else opts.resident_rows,
                            resident_mm_rows=auto_resident_mm_rows(cfg, opts.pdl) if opts.resident_mm_rows is None
                            else opts.resident_mm_rows)
    whole_tokens = opts.extend_graph_max_tokens if opts.extend_whole_graph else 0
    triton_max = triton_decode_max_batch(cfg, opts.decode_attention, opts.cuda_graph_max_batch)
    # the Triton decode graphs keep their own merge workspace: flashinfer's is sized for eager batches when no
    # bucket runs flashinfer
    ws_graph_batch = opts.cuda_graph_max_batch if triton_max < opts.cuda_graph_max_batch else 0
    backend = make_backend(opts.attention, cfg, dtype, device, ws_graph_batch, whole_tokens)
    kv_tokens, kv_fraction = opts.kv_tokens, opts.kv_fraction
    if kv_tokens is None and kv_fraction is None:
        if device.type == "cuda":
            kv_fraction = DEFAULT_GPU_KV_FRACTION
        else:
            kv_tokens = DEFAULT_CPU_KV_TOKENS
    geom = geometry(cfg, dtype, kv_tokens=kv_tokens, kv_fraction=kv_fraction,
                    free_bytes=free_bytes(device) if kv_fraction is not None else None, page_size=opts.page_size)
    pool = KVPool(cfg, geom, dtype, device)
    engine = Engine(cfg, model, pool, backend, epoch=uuid.uuid4().hex, worker_id=opts.worker_id,
                    model_path=str(pathlib.Path(opts.model_path).resolve()), seed=opts.seed,
                    ragged_prefill=opts.ragged_prefill, prepare_ahead=opts.prepare_ahead,
                    launch_behind=opts.launch_behind, launch_lead_steps=opts.launch_lead_steps,
                    hold_commit_s=opts.hold_commit_ms / 1000, extend_ahead=opts.extend_ahead,
                    extend_behind=opts.extend_behind)
    engine.warmup()
    engine.graphs = make_graphs(opts.cuda_graph_max_batch, cfg, model, pool, backend, opts.decode_attention)
    engine.whole_graphs = make_whole_graphs(whole_tokens, cfg, model, pool, backend, opts.extend_attention)
    engine.extend_graphs = make_extend_graphs(opts.extend_graph_max_tokens, model, pool, backend)
    return engine


def make_whole_graphs(max_tokens: int, cfg: ModelConfig, model, pool: KVPool, backend: AttentionBackend,
                      prefill_backend: str = "auto"):
    """Whole extend graphs (``extend_whole_graph.WholeExtendGraphs``) up to ``max_tokens`` tokens when the backend
    is flashinfer (CUDA) and ``max_tokens`` > 0, else None. The backend's workspace must have been sized for them
    (``make_backend(..., whole_graph_tokens=max_tokens)``); a smaller one raises RuntimeError here.
    ``prefill_backend``: flashinfer's paged prefill implementation inside them (``WorkerOptions.extend_attention``)."""
    if max_tokens <= 0 or backend.name != "flashinfer":
        return None
    from worker_svc.attention.workspace import workspace_bytes
    from worker_svc.extend_graph import token_buckets
    from worker_svc.extend_whole_graph import WholeExtendGraphs

    props = torch.cuda.get_device_properties(pool.device)
    need = workspace_bytes(cfg.n_head, cfg.kv_heads, cfg.head_dim, props.multi_processor_count, (), props.major,
                           token_buckets(max_tokens))
    if backend.workspace.numel() < need:
        raise RuntimeError(f"the flashinfer workspace holds {backend.workspace.numel()} bytes, whole extend graphs "
                           f"up to {max_tokens} tokens need {need}: build the backend with "
                           f"whole_graph_tokens={max_tokens}")
    return WholeExtendGraphs(model, pool, max_tokens, sm_scale=backend.sm_scale, workspace=backend.workspace,
                             prefill_backend=prefill_backend)


def make_extend_graphs(max_tokens: int, model, pool: KVPool, backend: AttentionBackend):
    """Piecewise extend graphs (``extend_graph.ExtendGraphs``) up to ``max_tokens`` tokens when the backend is
    flashinfer (CUDA) and ``max_tokens`` > 0, else None."""
    if max_tokens <= 0 or backend.name != "flashinfer":
        return None
    from worker_svc.extend_graph import ExtendGraphs

    return ExtendGraphs(model, pool, max_tokens)


def make_graphs(max_batch: int, cfg: ModelConfig, model, pool: KVPool, backend: AttentionBackend,
                decode_attention: str = "flashinfer"):
    """Captured decode graphs when the backend is flashinfer and ``max_batch`` > 0, else None. The graphs'
    flashinfer buckets share the backend's workspace, which must have been sized for ``max_batch``
    (``make_backend``); a smaller one raises RuntimeError here, at start-up, instead of at the first large decode
    batch. ``decode_attention``: the graphs' attention, ``flashinfer``, ``triton`` or ``auto``
    (``triton_decode_max_batch``: which buckets take the Triton kernel; ``cuda_graph.DecodeGraphs``)."""
    if max_batch <= 0 or backend.name != "flashinfer":
        return None
    from worker_svc.attention.workspace import workspace_bytes
    from worker_svc.cuda_graph import DecodeGraphs, buckets

    triton_max = triton_decode_max_batch(cfg, decode_attention, max_batch)
    props = torch.cuda.get_device_properties(pool.device)
    need = workspace_bytes(cfg.n_head, cfg.kv_heads, cfg.head_dim, props.multi_processor_count,
                           buckets(max_batch) if triton_max < max_batch else (), props.major)
    if backend.workspace.numel() < need:
        raise RuntimeError(f"the flashinfer workspace holds {backend.workspace.numel()} bytes, CUDA graphs up to "
                           f"batch {max_batch} need {need}: build the backend with cuda_graph_max_batch={max_batch}")
    return DecodeGraphs(cfg, model, pool, backend.sm_scale, backend.workspace, max_batch=max_batch,
                        triton_max_batch=triton_max)
