"""Session-wide test settings.

Without CUDA, Triton kernels can only run in Triton's interpreter. ``@triton.jit`` reads ``TRITON_INTERPRET`` when a
function is decorated, and triton.language's own helpers (``tl.zeros``, ``tl.cdiv``) are decorated when it is first
imported: if any test imported it before an interpreter test set the variable, that test's kernels fail with
"Cannot call @triton.jit'd outside of the scope of a kernel". Set it before anything imports Triton
(requirements-dev.txt pins Triton; without it the interpreter tests skip, naming it). tests/worker/test_kernel_static.py
compiles real kernels for sm_90 in a process of its own, without the variable.

grpcio runs as every service process runs it (``common/grpc_env.py``: its EventEngine client and listener off), set
before anything imports grpc.
"""

import os

import common.grpc_env  # noqa: F401  (before grpc is imported)

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
