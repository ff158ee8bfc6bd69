"""An in-process cache service for the scheduler's loop tests: the real CacheServicer over a real gRPC server on a
free port, and the scheduler's CacheClient of pool "default" on it."""

from __future__ import annotations

import contextlib
from typing import Iterator

from cache_svc.core import CacheCore
from cache_svc.service import SERVICE_NAME, CacheServicer
from codeserve.v1 import cache_pb2_grpc
from common import grpc_server
from scheduler_svc.cache_client import CacheClient


@contextlib.contextmanager
def cache_service(lease_seconds: float = 30.0) -> Iterator[tuple[CacheCore, CacheClient]]:
    """Yields (the service's CacheCore, to inspect; a CacheClient of pool "default" on it); closes the client and
    stops the server after."""
    core = CacheCore(lease_seconds=lease_seconds)
    running = grpc_server.start(lambda s: cache_pb2_grpc.add_CacheServicer_to_server(CacheServicer(core), s),
                                [SERVICE_NAME], "127.0.0.1:0")
    cache = CacheClient(f"127.0.0.1:{running.port}", "default")
    try:
        yield core, cache
    finally:
        cache.close()
        running.server.stop(0)
