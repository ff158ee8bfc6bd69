"""What the decode graphs' Triton kernels compile to for the H100 / H200 (sm_90), on a machine with no GPU.

Each kernel configuration the 1B and tiny decode graphs launch (``mqa_decode_part`` and its merge per batch bucket
as ``decode_config`` chooses them, the fused add + LayerNorm, the K/V write) is compiled by Triton for sm_90 with
the specialization its real launch gets (16-byte aligned pointers; integer arguments that are multiples of 16
marked so, arguments equal to 1 folded to constants: ``triton.backends.compiler.BaseBackend``'s rules), then read
with the ``cuobjdump`` Triton ships: registers a thread, shared memory, local memory (spills) and the SASS
instruction mix (asynchronous copies ``LDGSTS``, plain global loads ``LDG``, tensor-core ``HGMMA`` / ``HMMA``,
barriers). From registers, shared memory and warps it derives the CTAs an SM can hold (the CUDA occupancy rules for
compute capability 9.0: 65,536 registers an SM allocated in 256-register warp units, 228 KB of shared memory with
1 KB reserved a CTA, 64 warps, 32 CTAs) and, with the grid, the warps resident an SM: the figure run 23's Nsight
Compute profile found at 11.9% for the decode attention at B = 64.

Device time is scarce (bench/README.md, runs 22-24): this answers "how many registers, does it spill, how many
CTAs fit, did the pipeliner make the loads asynchronous" before a run. It measures nothing about speed.

    python -m bench.kernel_static [--shapes starcoderbase-1b,tiny_starcoder_py] [--batches 1,16,32,64] [--sms 132]
        [--gemms] [--attn-warps N --attn-stages N --attn-block-n N --attn-splits N] [--skeleton KERNEL]
        [--json OUT]

Needs Triton (its ptxas and cuobjdump compile and read sm_90 code on the CPU); no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

# CUDA occupancy limits of compute capability 9.0 (CUDA C++ Programming Guide, "Compute Capabilities" table)
REGS_PER_SM, REG_UNIT, MAX_WARPS, MAX_CTAS, SMEM_PER_SM, SMEM_RESERVED = 65536, 256, 64, 32, 233472, 1024


@dataclass
class Static:
    """One compiled kernel configuration: ``regs`` a thread, ``smem`` bytes a CTA (static + dynamic), ``local``
    bytes a thread of local memory (spills), SASS counts, ``ctas_per_sm`` the occupancy limit and ``warps_per_sm``
    what the grid of ``grid_ctas`` CTAs leaves resident on ``sms`` SMs (at most the limit)."""

    kernel: str
    case: str
    warps: int
    stages: int
    regs: int
    smem: int
    local: int
    ldgsts: int
    ldg: int
    stg: int
    mma: int
    bar: int
    skeleton: str
    ctas_per_sm: int
    grid_ctas: int
    warps_per_sm: float


def ctas_per_sm(regs: int, smem: int, warps: int) -> int:
    """CTAs of ``warps`` warps, ``regs`` registers a thread and ``smem`` bytes of shared memory one SM holds
    (compute capability 9.0)."""
    reg_warp = math.ceil(regs * 32 / REG_UNIT) * REG_UNIT
    # registers are allocated per SM sub-partition (4 of 16,384), whole warps in each (CUDA's occupancy calculator)
    by_regs = (REGS_PER_SM // 4 // reg_warp) * 4 // warps if regs else MAX_CTAS
    by_smem = SMEM_PER_SM // (smem + SMEM_RESERVED)
    return max(0, min(by_regs, by_smem, MAX_WARPS // warps, MAX_CTAS))


def compile_sm90(kernel, values: dict, constexprs: dict, warps: int, stages: int):
    """``kernel`` (a ``triton.jit`` function) compiled for sm_90: ``values`` gives each runtime argument a
    representative value (a ``"*bf16"``-style string for a pointer, an int, or a float), ``constexprs`` the
    constants. Pointers and multiples of 16 are marked 16-divisible and ints equal to 1 folded, as a launch
    specializes them. Raises KeyError naming an argument given no value."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, attrs, consts = {}, {}, dict(constexprs)
    for i, name in enumerate(kernel.arg_names):
        if name in consts:
            sig[name] = "constexpr"
            continue
        v = values[name]
        if isinstance(v, str):
            sig[name], attrs[(i,)] = v, [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[name] = "fp32"
        elif v == 1:
            sig[name], consts[name] = "constexpr", 1
        else:
            sig[name] = "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))


SKELETON_OPS = ("LDG", "LDGSTS", "LDGDEPBAR", "DEPBAR", "STS", "LDS", "LDSM", "STG", "HMMA", "HGMMA", "BAR", "BRA",
                "MUFU")


def sass_ops(sass: str) -> list[str]:
    """The opcodes (without modifiers or predicates) of ``cuobjdump -sass`` output, in program order; a
    ``DEPBAR.LE SB0, n`` (wait until at most n groups of asynchronous copies are in flight) as ``DEPBAR<=n``."""
    ops = []
    for op, rest in re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([^;]*);", sass):
        wait = re.match(r"\.LE SB0, (0x[0-9a-f]+)", rest) if op == "DEPBAR" else None
        ops.append(f"DEPBAR<={int(wait.group(1), 16)}" if wait else op)
    return ops


def skeleton(ops: list[str]) -> str:
    """The memory, synchronization, tensor-core and branch opcodes of ``ops`` with runs counted (``24xLDG 8xSTS
    BAR 14xHMMA ...``): where a loop issues its loads against its math and waits (``DEPBAR`` after ``LDGSTS``)."""
    runs: list[list] = []
    for op in ops:
        if op.split("<")[0] in SKELETON_OPS:
            if runs and runs[-1][0] == op:
                runs[-1][1] += 1
            else:
                runs.append([op, 1])
    return " ".join(op if n == 1 else f"{n}x{op}" for op, n in runs)


def read_cubin(compiled) -> dict:
    """Registers, shared and local memory, and SASS instruction counts of ``compiled`` (``cuobjdump``). Raises
    subprocess.CalledProcessError when cuobjdump fails."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    usage = {k: int(v) for k, v in re.findall(r"\b(REG|SHARED|LOCAL):(\d+)", res)}
    ops = sass_ops(sass)
    count = lambda *names: sum(1 for op in ops if op in names)  # noqa: E731
    return {"regs": usage.get("REG", 0), "smem": usage.get("SHARED", 0) + compiled.metadata.shared,  # static + dynamic
            "local": usage.get("LOCAL", 0), "ldgsts": count("LDGSTS"), "ldg": count("LDG"), "stg": count("STG"),
            "mma": count("HGMMA", "HMMA"), "bar": count("BAR"), "skeleton": skeleton(ops)}


def decode_cases(shape: str, batches: list[int], sms: int, attn: dict | None = None, gemms: bool = False):
    """(kernel, case name, values, constexprs, warps, stages, grid CTAs) of each kernel a decode step of ``shape``
    launches at each batch in ``batches`` (deduplicated by the caller). ``attn``: ``DecodeConfig`` fields forced
    over ``decode_config``'s choice (a what-if: warps, stages, block_n, splits); ``gemms``: also the split-K GEMM
    (``skinny_gemm.choose``'s configuration) of each projection at every batch, a survey: the worker runs it for
    models of n_embd <= 1024 and batches up to ``build.auto_splitk_rows`` rows (16 since run 25); and at batches of
    up to ``resident_gemv.MAX_ROWS`` rows the resident-weight GEMV, one CTA a tile and the looping grid
    (``stream_per_sm`` 2) where ``choose`` gives one."""
    from dataclasses import replace

    from worker_svc.attention import mqa_decode
    from worker_svc.model import fused, greedy, resident_gemm, resident_gemv, skinny_gemm
    from worker_svc.model.default import model_config

    cfg = model_config(shape)
    e, heads = cfg["n_embd"], cfg["n_head"]
    d = e // heads
    kernels = mqa_decode._kernels()
    part, merge = kernels[0], kernels[1]
    add_ln, next_pow2 = fused._kernel()
    write_kv = fused._kv_kernel()[0]
    bh = mqa_decode.block_heads(heads)
    for b in batches:
        c = replace(mqa_decode.decode_config(b, sms, d), **(attn or {}))
        direct = c.splits == 1
        values = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", idx_ptr="*i32", indptr_ptr="*i32", o_ptr="*fp32",
                      lse_ptr="*fp32", out_ptr="*bf16", new_ptr="*bf16", scale_log2=0.1,
                      stride_qb=e + 2 * d, stride_qh=d, stride_kv=d, stride_ob=c.splits * bh * d,
                      stride_os=0 if direct else bh * d, stride_outb=e, stride_outh=d, stride_new=e + 2 * d, H=heads,
                      SPLITS=c.splits)
        consts = dict(D=d, BLOCK_H=bh, BLOCK_N=c.block_n, DIRECT=direct, PDL=True, WRITE=True)  # as served (fuse_kv)
        yield part, f"{shape} B={b} splits={c.splits}", values, consts, c.warps, c.stages, b * c.splits
        if not direct:
            mvals = dict(o_ptr="*fp32", lse_ptr="*fp32", out_ptr="*bf16", stride_ob=c.splits * bh * d,
                         stride_os=bh * d, stride_outb=e, stride_outh=d, SPLITS=c.splits)
            mconsts = dict(D=d, BLOCK_H=bh, BLOCK_S=max(2, 1 << (c.splits - 1).bit_length()), PDL=True)
            yield merge, f"{shape} B={b} splits={c.splits}", mvals, mconsts, 2, 1, b * heads
        if gemms:
            inner = cfg["n_inner"] or 4 * e
            for name, k, n, gelu in (("c_attn", e, e + 2 * d, False), ("attn.c_proj", e, e, False),
                                     ("c_fc", e, inner, True), ("mlp.c_proj", inner, e, False)):
                g = skinny_gemm.choose(b, k, n, sms)
                kps = -(-(-(-k // g.split)) // g.block_k) * g.block_k
                vals = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16", ws_ptr="*fp32",
                            cnt_ptr="*i32", M=b, N=n, K=k, k_per_split=kps, SPLIT=-(-k // kps))
                consts = dict(HAS_BIAS=True, GELU=gelu, PDL=True, PREFETCH=-1, BLOCK_M=g.block_m, BLOCK_N=g.block_n,
                              BLOCK_K=g.block_k)
                grid = -(-n // g.block_n) * vals["SPLIT"] * -(-b // g.block_m)
                yield skinny_gemm._kernel(), f"{shape} B={b} {name} split={vals['SPLIT']}", vals, consts, g.warps, \
                    g.stages, grid
                if b > resident_gemv.MAX_ROWS and resident_gemm.takes(n, k):  # the resident tensor-core GEMM
                    r = resident_gemm.choose(b, k, n)
                    vals = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16", ws_ptr="*fp32",
                                cnt_ptr="*i32", M=b, N=n, K=k, KS=r.ks, stride_x=k)
                    consts = dict(HAS_BIAS=True, GELU=gelu, PDL=True, BLOCK_M=r.block_m, BLOCK_N=r.block_n,
                                  K_PAD=r.k_pad)
                    yield resident_gemm._kernel(), f"{shape} B={b} {name} resident_mm split={r.split}", vals, consts, \
                        r.warps, 1, -(-n // r.block_n) * r.split
                if b <= resident_gemv.MAX_ROWS:  # the resident-weight GEMV: one CTA a tile, and the looping grid
                    for stream in (0, 2):
                        r = resident_gemv.choose(k, n, sms, stream_per_sm=stream)
                        if stream and not r.ctas:
                            continue
                        tiles = -(-n // r.block_n)
                        vals = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16", M=b, N=n, K=k,
                                    stride_x=k, stride_y=n, TILES=tiles)
                        consts = dict(HAS_BIAS=True, GELU=gelu, PDL=True, ROWS=resident_gemv.next_pow2(b),
                                      BLOCK_N=r.block_n, K_PAD=r.k_pad, LOOP=r.ctas > 0)
                        yield resident_gemv._kernel(), f"{shape} B={b} {name} ctas={r.ctas or tiles}", vals, consts, \
                            r.warps, 1, r.ctas or tiles
    block = next_pow2(e)
    vals = dict(h_ptr="*bf16", x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", sum_ptr="*bf16", y_ptr="*bf16",
                n_cols=e, eps=1e-5)
    yield add_ln, f"{shape} n_embd={e}", vals, dict(BLOCK=block, PDL=True), min(16, max(4, block // 512)), 1, \
        max(batches)
    vals = dict(qkv_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", slot_ptr="*i64", stride_row=e + 2 * d, k_col=e,
                width=d)
    yield write_kv, f"{shape} head_dim={d}", vals, dict(BLOCK=next_pow2(d), PDL=True), 1, 1, max(batches)
    chunk_argmax, combine = greedy._kernels()  # the graphs' greedy pick (model/greedy.py), logits in bf16
    chunks = -(-cfg["vocab_size"] // greedy.BLOCK)
    vals = dict(x_ptr="*bf16", val_ptr="*fp32", idx_ptr="*i32", nan_ptr="*i32", V=cfg["vocab_size"],
                stride_x=cfg["vocab_size"], CHUNKS=chunks)
    yield chunk_argmax, f"{shape} vocab={cfg['vocab_size']}", vals, dict(BLOCK=greedy.BLOCK), 4, 1, \
        max(batches) * chunks
    vals = dict(val_ptr="*fp32", idx_ptr="*i32", nan_ptr="*i32", out_ptr="*i64", CHUNKS=chunks)
    yield combine, f"{shape} chunks={chunks}", vals, dict(BLOCK_C=max(16, 1 << (chunks - 1).bit_length())), 1, 1, \
        max(batches)


def survey(shapes: list[str], batches: list[int], sms: int, attn: dict | None = None,
           gemms: bool = False) -> list[Static]:
    """Every distinct kernel configuration of ``shapes``' decode steps at ``batches``, compiled and read
    (``attn``, ``gemms``: ``decode_cases``')."""
    out, seen = [], set()
    for shape in shapes:
        for kernel, case, values, consts, warps, stages, grid in decode_cases(shape, batches, sms, attn, gemms):
            key = (kernel.__name__, tuple(sorted(consts.items())), tuple(sorted(values.items())), warps, stages)
            if key in seen:
                continue
            seen.add(key)
            r = read_cubin(compile_sm90(kernel, values, consts, warps, stages))
            limit = ctas_per_sm(r["regs"], r["smem"], warps)
            out.append(Static(kernel.__name__, case, warps, stages, ctas_per_sm=limit, grid_ctas=grid,
                              warps_per_sm=round(min(limit, grid / sms) * warps, 2), **r))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="starcoderbase-1b,tiny_starcoder_py")
    ap.add_argument("--batches", default="1,16,32,64")
    ap.add_argument("--sms", type=int, default=132, help="SMs of the card (H100 SXM and H200: 132)")
    ap.add_argument("--gemms", action="store_true", help="also the split-K GEMMs of each projection, and at batches of "
                    "up to 4 rows the resident-weight GEMV (model/resident_gemv.py), one CTA a tile and looping, above 4 the "
                    "resident tensor-core GEMM of the small projections (model/resident_gemm.py)")
    for field in ("warps", "stages", "block_n", "splits"):
        ap.add_argument(f"--attn-{field.replace('_', '-')}", type=int, default=0,
                        help=f"the decode attention's {field} forced (a what-if; 0: decode_config's)")
    ap.add_argument("--skeleton", default="", help="print the SASS skeleton (loads, waits, math, branches in "
                    "program order: ``skeleton``) of the kernels whose name contains this")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    attn = {f: getattr(args, "attn_" + f) for f in ("warps", "stages", "block_n", "splits") if getattr(args, "attn_" + f)}
    rows = survey(args.shapes.split(","), [int(b) for b in args.batches.split(",")], args.sms, attn, args.gemms)
    print(f"{'kernel':<18} {'case':<36} {'warps':>5} {'st':>2} {'regs':>4} {'smem':>6} {'spill':>5} {'ldgsts':>6} "
          f"{'ldg':>4} {'mma':>4} {'CTAs/SM':>7} {'grid':>5} {'warps/SM':>8} {'occ%':>5}")
    for r in rows:
        print(f"{r.kernel:<18} {r.case:<36} {r.warps:>5} {r.stages:>2} {r.regs:>4} {r.smem:>6} {r.local:>5} "
              f"{r.ldgsts:>6} {r.ldg:>4} {r.mma:>4} {r.ctas_per_sm:>7} {r.grid_ctas:>5} {r.warps_per_sm:>8} "
              f"{100 * r.warps_per_sm / MAX_WARPS:>5.1f}")
    for r in rows:
        if args.skeleton and args.skeleton in r.kernel:
            print(f"\n{r.kernel} {r.case} (warps {r.warps}, stages {r.stages}):\n  {r.skeleton}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
