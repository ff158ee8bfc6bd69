"""Client side of the cache service's rich error: the AllocationShortfall detail of RESOURCE_EXHAUSTED."""

from __future__ import annotations

import grpc
from grpc_status import rpc_status

from codeserve.v1 import cache_pb2


def decode_shortfall(err: grpc.RpcError) -> cache_pb2.AllocationShortfall | None:
    """The AllocationShortfall detail (asked, freed by eviction, still evictable, why they differ) packed
    in ``err``'s google.rpc.Status; None when the status carries no such detail."""
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(cache_pb2.AllocationShortfall.DESCRIPTOR):
            shortfall = cache_pb2.AllocationShortfall()
            detail.Unpack(shortfall)
            return shortfall
    return None
