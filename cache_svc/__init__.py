"""The cache service: per KV pool, the radix prefix tree and the token-slot allocator bookkeeping.

Plain classes (``CacheCore``, ``Pool``, ``RadixTree``, ``PageAllocator``) hold the logic; ``service.py``
is a thin gRPC servicer over them. See docs/cache.md for the semantics.
"""

import common.grpc_env  # noqa: F401  (first: grpcio's settings before grpc is imported)
