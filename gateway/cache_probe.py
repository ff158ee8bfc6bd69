"""The router's question to the cache services: how much of this prompt is cached in each replica's pool?

One ``Cache.ProbePrefix`` call per distinct cache address covers every pool of the asked replicas held there
(read-only at the cache: no lock, no node split, no LRU touch). The answer is the pool's real radix tree, so the
router keeps no copy of it that could drift (evictions, flushes, a restarted worker's new epoch all show in the
next probe).

A cache address that does not answer (within ``timeout_s``) or answers an error is not the request's failure: its
replicas are routed as 0 cached tokens, and the probe's outcome says so (``ProbeOutcome.errors``) for the
decision's log line.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Sequence

import grpc

from codeserve.v1 import cache_pb2, cache_pb2_grpc
from common.grpc_server import MAX_MESSAGE_BYTES
from gateway.replicas import Replica


@dataclass
class ProbeOutcome:
    """``cached``: replica index -> cached prompt tokens (whole pages) in its pool, for replicas whose cache
    answered; ``errors``: cache address -> why its probe failed (its replicas are missing from ``cached``)."""

    cached: dict[int, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


class CacheProbe:
    """A grpc.aio channel and Cache stub per distinct cache address (created lazily, in the serving loop)."""

    def __init__(self, timeout_s: float = 0.5) -> None:
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, cache_pb2_grpc.CacheStub] = {}

    def _stub(self, address: str) -> cache_pb2_grpc.CacheStub:
        if address not in self._stubs:
            channel = grpc.aio.insecure_channel(address, options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ])
            self._channels[address] = channel
            self._stubs[address] = cache_pb2_grpc.CacheStub(channel)
        return self._stubs[address]

    async def probe(self, namespace: str, ids: Sequence[int], replicas: Sequence[Replica]) -> ProbeOutcome:
        """Probes ``ids`` in the pools of ``replicas`` (those with a cache address), all cache addresses at once.
        Each replica's ``page_size`` is updated from its pool's answer. Never raises for a cache's failure."""
        by_cache: dict[str, list[Replica]] = {}
        for r in replicas:
            if r.spec.cache is not None:
                by_cache.setdefault(r.spec.cache, []).append(r)
        outcome = ProbeOutcome()

        async def one(address: str, group: list[Replica]) -> None:
            request = cache_pb2.ProbePrefixRequest(namespace=namespace, token_ids=list(ids),
                                                   pool_ids=[r.spec.pool for r in group])
            try:
                reply = await self._stub(address).ProbePrefix(request, timeout=self.timeout_s, wait_for_ready=False)
            except grpc.aio.AioRpcError as exc:
                outcome.errors[address] = f"{exc.code().name}: {exc.details()}"
                return
            pools = {p.pool_id: p for p in reply.pools}
            for r in group:
                pool = pools.get(r.spec.pool)
                if pool is None:
                    outcome.errors[address] = f"the answer has no pool {r.spec.pool!r}"
                    continue
                r.page_size = max(1, pool.page_size)
                outcome.cached[r.index] = pool.cached_tokens

        await asyncio.gather(*(one(a, g) for a, g in by_cache.items()))
        return outcome

    async def close(self) -> None:
        """Closes every channel."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()
