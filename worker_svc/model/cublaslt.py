"""cuBLASLt through ctypes: a projection ``y = x @ W.T + b`` (optionally tanh-GELU) run with an algorithm chosen
by us, not by the heuristic's first answer (CUDA only).

Why: at decode batch sizes a projection reads far more weight than it computes, and the kernel cuBLAS picks
for ``F.linear`` reads it at about half the bandwidth the lm_head reaches (run 8's Nsight Compute table in
bench/README.md: the ``c_proj`` GEMMs ran 88 CTAs on 132 SMs at 1.79 TB/s). ``cublasLtMatmulAlgoGetHeuristic``
returns several candidates (other tiles, split-K with an in-place or workspace reduction, other cluster
shapes); torch runs only the first. ``LtMatmul.candidates`` lists them and ``LtMatmul.run`` runs any one of
them on the current stream, so a caller can time them (bench/cublaslt_bench.py) and keep the fastest per
(M, K, N). The call is stream-ordered and allocates nothing (the workspace is the caller's), so it is
captured into CUDA graphs like any kernel.

The timed candidates were tried as the model's decode projections (the fastest per decode bucket, torch's GEMM
included) and removed after H200 run 22: no gain, GPU time of a 1B decode step 1.30 -> 1.28 ms (B = 1), 1.81 ->
1.80 (B = 64), 2.90 -> 2.92 (B = 256), noise; bench/cublaslt_bench.py's survey found no candidate faster than
torch's GEMM by more than 2% at M = 64, except the lm_head (x1.09). The module stays for that survey
(bench/cublaslt_bench.py, bench/gemm_bench.py).

Layout (cuBLASLt is column-major): a row-major ``x [M, K]`` is a column-major ``[K, M]`` and a row-major
``W [N, K]`` a column-major ``[K, N]``, so ``y^T [N, M] = op_T(W) @ x^T`` with ``m = N, n = M, k = K``, ``transa =
T``; the column-major ``[N, M]`` result with leading dimension N is the row-major ``y [M, N]``. The bias (length
N = the result's rows) is the ``BIAS`` epilogue; ``gelu=True`` uses ``GELU_BIAS``, cuBLASLt's tanh
approximation (what ``gelu_pytorch_tanh`` computes, applied to the float32 accumulator before rounding).

Constants are those of ``cublasLt.h`` (the same in CUDA 12 and 13). The library is the one torch loaded (the ``nvidia-cublas``
wheel, or the system's); importing this module touches no library, so it imports on a CPU-only machine.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
from dataclasses import dataclass

import torch

_COMPUTE_32F = 68          # cublasComputeType_t CUBLAS_COMPUTE_32F
_R_32F = 0                 # cudaDataType_t
_DTYPES = {torch.bfloat16: 14, torch.float16: 2}   # CUDA_R_16BF, CUDA_R_16F
_OP_T, _OP_N = 1, 0
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER = 3, 4, 7, 8
_EPILOGUE_DEFAULT, _EPILOGUE_BIAS, _EPILOGUE_GELU_BIAS = 1, 4, 36
_PREF_MAX_WORKSPACE_BYTES = 1
# cublasLtMatmulAlgoConfigAttributes_t: what a candidate is, for reports: name -> (attribute, its size in bytes)
_CONFIG_ATTRS = {"algo_id": (0, 4), "tile": (1, 4), "splitk": (2, 4), "reduction": (3, 4), "swizzle": (4, 4),
                 "custom": (5, 4), "stages": (6, 4), "inner_shape": (7, 2), "cluster_shape": (8, 2)}


class LtError(RuntimeError):
    """A cuBLASLt call returned a status other than CUBLAS_STATUS_SUCCESS (the status is in the message)."""


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


@functools.cache
def _lib() -> ctypes.CDLL:
    """libcublasLt, the copy torch uses: the one already mapped into this process (torch's CUDA library links it),
    else one under an ``nvidia/*/lib`` folder of sys.path (the CUDA 12 wheels' ``nvidia/cublas/lib``, CUDA 13's
    ``nvidia/cu13/lib``), else the sonames of CUDA 13 and 12. Raises OSError when none loads."""
    torch.cuda.init()
    with open("/proc/self/maps") as maps:
        mapped = sorted({line.split()[-1] for line in maps if "/libcublasLt.so" in line})
    hits = mapped or [h for base in sys.path if base
                      for h in sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libcublasLt.so*")))]
    for name in (*hits, "libcublasLt.so.13", "libcublasLt.so.12"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError(f"no libcublasLt could be loaded (mapped: {mapped}, found: {hits})")


def _check(status: int, what: str) -> None:
    if status != 0:
        raise LtError(f"{what} returned cuBLAS status {status}")


@functools.cache
def _handle() -> ctypes.c_void_p:
    h = ctypes.c_void_p()
    _check(_lib().cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
    return h


def _layout(dtype_id: int, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
    d = ctypes.c_void_p()
    _check(_lib().cublasLtMatrixLayoutCreate(ctypes.byref(d), ctypes.c_int(dtype_id), ctypes.c_uint64(rows),
                                             ctypes.c_uint64(cols), ctypes.c_int64(ld)), "cublasLtMatrixLayoutCreate")
    return d


def _set(desc: ctypes.c_void_p, attr: int, value) -> None:
    _check(_lib().cublasLtMatmulDescSetAttribute(desc, ctypes.c_int(attr), ctypes.byref(value),
                                                 ctypes.c_size_t(ctypes.sizeof(value))),
           f"cublasLtMatmulDescSetAttribute({attr})")


@dataclass(frozen=True)
class Candidate:
    """One algorithm the heuristic offered: its opaque descriptor, the workspace it needs (bytes), cuBLASLt's
    waves estimate (1.0 = one full wave of CTAs) and its configuration attributes (``_CONFIG_ATTRS``)."""

    algo: bytes
    workspace_bytes: int
    waves: float
    config: dict


class LtMatmul:
    """``y [M, N] = x [M, K] @ W [N, K]^T + b [N]`` (then tanh-GELU when ``gelu``) for one (M, K, N, dtype),
    through cuBLASLt with float32 accumulation. ``workspace_bytes``: the largest workspace a candidate may ask
    for (the caller's buffer passed to ``run`` must be at least this big). Raises LtError on a cuBLASLt
    failure, ValueError for a dtype other than bfloat16 / float16."""

    def __init__(self, m: int, k: int, n: int, dtype: torch.dtype, bias: bool = True, gelu: bool = False,
                 workspace_bytes: int = 32 << 20):
        if dtype not in _DTYPES:
            raise ValueError(f"cuBLASLt projections take bfloat16 / float16, got {dtype}")
        if gelu and not bias:
            raise ValueError("the GELU epilogue here is GELU_BIAS: it needs the bias")
        self.m, self.k, self.n, self.dtype, self.bias, self.gelu = m, k, n, dtype, bias, gelu
        self.workspace_bytes = workspace_bytes
        lib, t = _lib(), _DTYPES[dtype]
        self._desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self._desc), ctypes.c_int(_COMPUTE_32F), ctypes.c_int(_R_32F)),
               "cublasLtMatmulDescCreate")
        _set(self._desc, _DESC_TRANSA, ctypes.c_int32(_OP_T))
        _set(self._desc, _DESC_TRANSB, ctypes.c_int32(_OP_N))
        epi = _EPILOGUE_GELU_BIAS if gelu else (_EPILOGUE_BIAS if bias else _EPILOGUE_DEFAULT)
        _set(self._desc, _DESC_EPILOGUE, ctypes.c_uint32(epi))
        self._a = _layout(t, k, n, k)   # W as column-major [K, N]
        self._b = _layout(t, k, m, k)   # x as column-major [K, M]
        self._d = _layout(t, n, m, n)   # y as column-major [N, M]
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def candidates(self, count: int = 16, bias_ptr: int = 256) -> list[Candidate]:
        """Up to ``count`` algorithms the heuristic offers for this problem, best estimate first.
        ``bias_ptr``: an address with the bias's alignment (the heuristic reads the pointer's alignment only)."""
        lib = _lib()
        if self.bias:
            _set(self._desc, _DESC_BIAS_POINTER, ctypes.c_void_p(bias_ptr))
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        try:
            ws = ctypes.c_uint64(self.workspace_bytes)
            _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, ctypes.c_int(_PREF_MAX_WORKSPACE_BYTES),
                                                            ctypes.byref(ws), ctypes.c_size_t(8)),
                   "cublasLtMatmulPreferenceSetAttribute")
            results = (_Heuristic * count)()
            got = ctypes.c_int(0)
            _check(lib.cublasLtMatmulAlgoGetHeuristic(_handle(), self._desc, self._a, self._b, self._d, self._d,
                                                      pref, ctypes.c_int(count), results, ctypes.byref(got)),
                   "cublasLtMatmulAlgoGetHeuristic")
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        return [Candidate(bytes(r.algo), int(r.workspace_size), float(r.waves), _config(r.algo))
                for r in results[:got.value] if r.state == 0]

    def run(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
            algo: Candidate, workspace: torch.Tensor) -> torch.Tensor:
        """Enqueue ``out = x @ weight.T (+ bias) (GELU)`` on the current stream with ``algo``. ``x [M, K]``,
        ``weight [N, K]``, ``out [M, N]``: contiguous, this object's dtype; ``bias [N]``; ``workspace``: a
        CUDA byte buffer of ``workspace_bytes`` or more. Returns ``out``. Raises LtError when cuBLASLt refuses."""
        if self.bias:
            _set(self._desc, _DESC_BIAS_POINTER, ctypes.c_void_p(bias.data_ptr()))
        a = _Algo.from_buffer_copy(algo.algo)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        _check(_lib().cublasLtMatmul(_handle(), self._desc, ctypes.byref(self._alpha),
                                     ctypes.c_void_p(weight.data_ptr()), self._a, ctypes.c_void_p(x.data_ptr()),
                                     self._b, ctypes.byref(self._beta), ctypes.c_void_p(out.data_ptr()), self._d,
                                     ctypes.c_void_p(out.data_ptr()), self._d, ctypes.byref(a),
                                     ctypes.c_void_p(workspace.data_ptr()), ctypes.c_size_t(workspace.numel()),
                                     stream), "cublasLtMatmul")
        return out


def _config(algo: _Algo) -> dict:
    """The configuration attributes of an algorithm, ids as cublasLt.h numbers them; an attribute this
    library version does not know is left out of the report."""
    out = {}
    for name, (attr, size) in _CONFIG_ATTRS.items():
        v, written = ctypes.c_uint64(0), ctypes.c_size_t(0)
        if _lib().cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), ctypes.c_int(attr), ctypes.byref(v),
                                                       ctypes.c_size_t(size), ctypes.byref(written)) == 0:
            out[name] = int(v.value)
    return out


def graph_seconds(fn, reps: int = 10) -> float:
    """Seconds per replay of a CUDA graph of ``fn()`` (warmed on a side stream, captured, replayed)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / reps


def torch_linear(x: torch.Tensor, linear, gelu: bool) -> torch.Tensor:
    """What the model runs without this module: ``F.linear``, or ``fused.mlp_up`` (bias + tanh-GELU in the GEMM's
    epilogue) when ``gelu``. ``linear``: anything with ``weight`` [N, K] and ``bias`` [N]."""
    from worker_svc.model import fused

    return fused.mlp_up(x, linear) if gelu else torch.nn.functional.linear(x, linear.weight, linear.bias)

