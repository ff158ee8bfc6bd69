"""A stand-in for the cache service's ``ProbePrefix`` (what the gateway's router asks), served by a real gRPC server
on a free port; the rest of the Cache service answers UNIMPLEMENTED. ``cached[pool_id]`` is the cached prefix each
pool reports (whole pages of ``page_size``, capped at the prompt length); ``error`` = (code, details) fails every
probe; ``requests`` records each ProbePrefixRequest."""

from __future__ import annotations

import threading

import grpc

from codeserve.v1 import cache_pb2, cache_pb2_grpc
from common.grpc_server import RunningServer, start


class FakeCache(cache_pb2_grpc.CacheServicer):
    def __init__(self, page_size: int = 1) -> None:
        self.page_size = page_size
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.cached: dict[str, int] = {}
            self.error: tuple[grpc.StatusCode, str] | None = None
            self.requests: list[cache_pb2.ProbePrefixRequest] = []

    def ProbePrefix(self, request, context):
        with self.lock:
            self.requests.append(request)
        if self.error is not None:
            context.abort(self.error[0], self.error[1])
        pools = []
        for pool in request.pool_ids:
            cached = min(self.cached.get(pool, 0), len(request.token_ids))
            pools.append(cache_pb2.PoolProbe(pool_id=pool, epochs=["e1"],
                                             cached_tokens=cached - cached % self.page_size,
                                             fundable_tokens=1000, capacity=1000, page_size=self.page_size))
        return cache_pb2.ProbePrefixResponse(pools=pools)


def serve_cache(fake: FakeCache) -> RunningServer:
    """Starts a real gRPC server for ``fake`` on 127.0.0.1:0."""
    return start(lambda server: cache_pb2_grpc.add_CacheServicer_to_server(fake, server), ["codeserve.v1.Cache"],
                 "127.0.0.1:0")
