"""``worker_svc.bench``'s choice of the decode projections' kernels: its GEMM flags (the split-K GEMM's rows,
projections, L2 prefetch; the resident-weight GEMV's rows and looping grid) and the model set up with them as the
worker would be, or as an A/B arm asks."""

from __future__ import annotations

import argparse

from worker_svc.build import auto_resident_mm_rows, auto_resident_rows, auto_splitk_rows
from worker_svc.model import resident_gemm
from worker_svc.model.resident_gemv import MAX_ROWS


def add_args(ap: argparse.ArgumentParser) -> None:
    """The GEMM flags of the worker bench."""
    ap.add_argument("--splitk-rows", type=int, default=None,
                    help="projections of batches up to this many rows through the split-K Triton GEMM "
                         "(model/skinny_gemm.py); 0 = cuBLAS; default: the worker's (build.auto_splitk_rows)")
    ap.add_argument("--resident-rows", type=int, default=None,
                    help=f"projections of batches up to this many rows (at most {MAX_ROWS}) through the resident-weight "
                         "kernel (model/resident_gemv.py); 0 = off; default: the worker's (build.auto_resident_rows; "
                         "0 with --splitk-only or --prefetch-blocks)")
    ap.add_argument("--resident-stream", type=int, default=None,
                    help="with resident rows: the projections of 16 MB or more through a grid of this many CTAs an SM, "
                         "each looping over its tiles with the next slab loaded ahead (model/resident_gemv.choose; "
                         "0: one CTA a tile; default: the worker's, resident_gemv.STREAM_PER_SM, where the kernels run)")
    ap.add_argument("--resident-mm-rows", type=int, default=None,
                    help=f"the small projections (16 MB or less) of batches above the resident rows up to this many "
                         f"(at most {resident_gemm.MAX_ROWS}) through the resident-weight tensor-core GEMM "
                         "(model/resident_gemm.py); 0 = off; default: the worker's (build.auto_resident_mm_rows; 0 with "
                         "--splitk-only or --prefetch-blocks)")
    ap.add_argument("--resident-mm-shape", default=None,
                    help="with --resident-mm-rows: WARPSxCOLUMNS of its CTAs (resident_gemm.choose's warps, block_n: "
                         "4 or 8 warps, a power of two of 16-128 columns; default: the worker's, resident_gemm.SHAPE)")
    ap.add_argument("--prefetch-blocks", type=int, default=-1,
                    help="with split-K and PDL: the K blocks of its weight slab each CTA prefetches into L2 before "
                         "it waits for the kernel ahead (-1: all, as the worker runs)")
    ap.add_argument("--splitk-only", default="",
                    help="with --splitk-rows: only these projections through the split-K GEMM, comma-separated from "
                         "c_attn, attn.c_proj, c_fc, mlp.c_proj (default: all); the others take torch's GEMM")


def set_up(ap: argparse.ArgumentParser, args: argparse.Namespace, cfg, model) -> None:
    """Turns ``model``'s fused kernels on (``args.fused``, ``args.pdl``) with the GEMMs ``args`` name, filling in the
    worker's defaults (``args.splitk_rows``, ``args.resident_rows``, ``args.resident_mm_rows`` are set). Exits through ``ap.error`` for a
    combination that cannot run."""
    if args.splitk_rows is None:  # as the worker runs (before run 12 this bench ran cuBLAS and no PDL by default)
        args.splitk_rows = auto_splitk_rows(cfg)
    split_k_arm = args.splitk_only or args.prefetch_blocks != -1  # these measure split-K at every row
    if args.resident_rows is None:  # the worker's defaults but in the split-K experiments
        args.resident_rows = 0 if split_k_arm else auto_resident_rows(cfg, args.pdl)
    if args.resident_mm_rows is None:
        args.resident_mm_rows = 0 if split_k_arm else auto_resident_mm_rows(cfg, args.pdl)
    if not 0 <= args.resident_rows <= MAX_ROWS:
        ap.error(f"--resident-rows must be in [0, {MAX_ROWS}] (got {args.resident_rows})")
    if not 0 <= args.resident_mm_rows <= resident_gemm.MAX_ROWS:
        ap.error(f"--resident-mm-rows must be in [0, {resident_gemm.MAX_ROWS}] (got {args.resident_mm_rows})")
    model.use_fused_kernels(norms=args.fused != "none", gelu=args.fused in ("gelu", "all"), kv=args.fused == "all",
                            splitk_rows=args.splitk_rows, pdl=args.pdl, resident_rows=args.resident_rows,
                            resident_mm_rows=args.resident_mm_rows)
    if args.splitk_only:
        names = args.splitk_only.split(",")
        blk = model.transformer.h[0]
        lin = {"c_attn": blk.attn.c_attn, "attn.c_proj": blk.attn.c_proj, "c_fc": blk.mlp.c_fc,
               "mlp.c_proj": blk.mlp.c_proj}
        if model.mm is None or args.splitk_rows <= 0 or not set(names) <= set(lin):
            ap.error(f"--splitk-only needs --splitk-rows > 0 (CUDA, Triton) and names from {', '.join(lin)}")
        model.mm.only = {tuple(lin[nm].weight.shape) for nm in names}
    if (model.mm is None or args.splitk_rows <= 0) and args.prefetch_blocks != -1:
        ap.error("--prefetch-blocks needs the split-K GEMMs (--splitk-rows > 0, CUDA, Triton)")
    shape = mm_shape(ap, args.resident_mm_shape)
    if model.mm is not None:
        model.mm.prefetch_blocks = args.prefetch_blocks
        if args.resident_stream is not None:
            model.mm.stream_per_sm = args.resident_stream
        args.resident_stream = model.mm.stream_per_sm  # (the JSON records what ran)
        if shape is not None:
            model.mm.mm_shape = shape
            model.mm.ws = model.mm.workspace()
    elif args.resident_stream or shape is not None:
        ap.error("--resident-stream and --resident-mm-shape need the resident kernels (--resident-rows or "
                 "--resident-mm-rows > 0, CUDA, Triton, a float16 / bfloat16 model)")
    else:
        args.resident_stream = 0


def mm_shape(ap: argparse.ArgumentParser, text: str | None) -> tuple[int, int] | None:
    """``--resident-mm-shape`` WARPSxCOLUMNS as (warps, columns), None when not given; exits through ``ap.error``
    unless warps are in ``resident_gemm.WARPS`` and columns in ``resident_gemm.COLUMNS``."""
    if text is None:
        return None
    warps, _, cols = text.partition("x")
    if not (warps.isdigit() and cols.isdigit() and int(warps) in resident_gemm.WARPS
            and int(cols) in resident_gemm.COLUMNS):
        ap.error(f"--resident-mm-shape must be WARPSxCOLUMNS with warps in {resident_gemm.WARPS} and columns in "
                 f"{resident_gemm.COLUMNS} (got {text!r})")
    return int(warps), int(cols)
