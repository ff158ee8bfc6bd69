"""Fixtures: a real Cache gRPC server on 127.0.0.1:0 over a CacheCore with a controllable clock."""

from __future__ import annotations

import uuid

import pytest

from cache_svc.core import CacheCore
from cache_svc.service import SERVICE_NAME, CacheServicer
from codeserve.v1 import cache_pb2, cache_pb2_grpc
from common import grpc_server


class FakeClock:
    """Monotonic seconds that only move when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def core(clock: FakeClock) -> CacheCore:
    return CacheCore(lease_seconds=30.0, clock=clock)


@pytest.fixture
def server(core: CacheCore):
    running = grpc_server.start(
        lambda s: cache_pb2_grpc.add_CacheServicer_to_server(CacheServicer(core), s), [SERVICE_NAME], "127.0.0.1:0"
    )
    yield running
    running.server.stop(0).wait()


@pytest.fixture
def stub(server) -> cache_pb2_grpc.CacheStub:
    chan = grpc_server.channel(f"127.0.0.1:{server.port}")
    yield cache_pb2_grpc.CacheStub(chan)
    chan.close()


def op() -> str:
    """A fresh operation id."""
    return uuid.uuid4().hex


def register(stub, pool_id: str = "p", capacity: int = 64, page_size: int = 1, epoch: str = "e1",
             members: list[tuple[str, str, int]] | None = None) -> cache_pb2.RegisterPoolResponse:
    members = members or [("w0", epoch, capacity)]
    return stub.RegisterPool(cache_pb2.RegisterPoolRequest(
        op_id=op(), pool_id=pool_id, page_size=page_size,
        members=[cache_pb2.PoolMember(worker_id=w, epoch=e, capacity_tokens=c) for w, e, c in members]))
