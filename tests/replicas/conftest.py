"""Two CPU replicas of the default model behind one gateway, as a user starts them: a real
``python -m launcher --replicas 2`` (its supervisor restarts a killed worker, scheduler or cache), shared by the
tests of this folder; after each test every scheduler is idle, the gateway's /flush_cache empties every pool, and
each pool's integrity check is empty with available == capacity (no leaked slot). At the end a Ctrl-C stops the
launcher and every process with exit code 0."""

from __future__ import annotations

import pathlib
import random
import re

import httpx
import pytest

from codeserve.v1 import cache_pb2, cache_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from common.grpc_server import channel
from launcher.ports import REPLICA_STRIDE
from tests.deploy.launched import Launched, launched, wait_for

REPLICAS = 2
POOLS = [f"pool-{i}" for i in range(REPLICAS)]
VOCAB = 1024  # the default model's


class TwoReplicas:
    """The running stack: ``run`` (the launcher), ``url`` (the gateway), ``model_path`` (the default model), a stub of the one cache service and of
    each replica's scheduler (``schedulers[i]``, pool ``POOLS[i]``)."""

    def __init__(self, run: Launched) -> None:
        self.run, self.url = run, run.url
        port = {name: int(run.argv[run.argv.index(f"--{name}-port") + 1]) for name in ("cache", "scheduler")}
        self._cache_chan = channel(f"127.0.0.1:{port['cache']}")
        self.cache = cache_pb2_grpc.CacheStub(self._cache_chan)
        worker = pathlib.Path(f"/proc/{run.pids['worker-0']}/cmdline").read_bytes().decode().split("\0")
        self.model_path = worker[worker.index("--model-path") + 1]
        self.scheduler_ports = [port["scheduler"] + REPLICA_STRIDE * i for i in range(REPLICAS)]
        self._chans = [channel(f"127.0.0.1:{p}") for p in self.scheduler_ports]
        self.schedulers = [scheduler_pb2_grpc.SchedulerStub(c) for c in self._chans]

    def close(self) -> None:
        for chan in [self._cache_chan, *self._chans]:
            chan.close()

    def probe(self, ids: list[int]) -> list[int]:
        """Cached tokens of ``ids`` in each pool, in replica order (Cache.ProbePrefix: the truth, read-only)."""
        reply = self.cache.ProbePrefix(cache_pb2.ProbePrefixRequest(token_ids=ids, pool_ids=POOLS), timeout=10)
        assert [p.pool_id for p in reply.pools] == POOLS
        return [p.cached_tokens for p in reply.pools]

    def epochs(self) -> list[list[str]]:
        reply = self.cache.ProbePrefix(cache_pb2.ProbePrefixRequest(token_ids=[1], pool_ids=POOLS), timeout=10)
        return [list(p.epochs) for p in reply.pools]

    def holder(self, ids: list[int]) -> int:
        """The replica whose pool holds ``ids`` (all but at most its last token); AssertionError unless exactly one."""
        cached = self.probe(ids)
        holders = [i for i, c in enumerate(cached) if c >= len(ids) - 1]
        assert len(holders) == 1, f"{len(ids)} tokens cached {cached} per pool"
        return holders[0]

    def restarted(self, name: str, before: int, timeout: float = 120.0) -> int:
        """Waits until the launcher printed ``name is back`` more than ``before`` times; records and returns the PID."""
        def back():
            found = re.findall(rf"^{re.escape(name)} is back \(pid (\d+)\)", self.run.text(), re.M)
            return len(found) > before and int(found[-1])
        pid = wait_for(back, timeout, f"{name}'s restart")
        self.run.pids[name] = pid
        return pid

    def backs(self, name: str) -> int:
        return len(re.findall(rf"^{re.escape(name)} is back", self.run.text(), re.M))

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the gateway's /ready is 200 listing every replica as "ready" (routed again)."""
        def ready():
            reply = httpx.get(self.url + "/ready", timeout=5)
            return reply.status_code == 200 and all(r["state"] == "ready" for r in reply.json()["replicas"])
        wait_for(ready, timeout, "every replica ready")

    def wait_idle(self) -> None:
        """Until every scheduler has nothing running or waiting (at most 60 s each)."""
        for i, s in enumerate(self.schedulers):
            wait_for(lambda: (lambda l: l.running == 0 and l.waiting == 0)(
                s.GetLoad(scheduler_pb2.GetLoadRequest(), timeout=10)), 60, f"replica {i} idle")

    def idle_check(self) -> None:
        """Every scheduler idle, /flush_cache (every replica), then per pool: integrity empty, available == capacity."""
        self.wait_idle()
        reply = httpx.post(self.url + "/flush_cache", timeout=30)
        assert reply.status_code == 200, reply.text
        for pool in POOLS:
            violations = self.cache.CheckIntegrity(cache_pb2.CheckIntegrityRequest(pool_id=pool), timeout=10)
            assert list(violations.violations) == [], (pool, violations.violations)
            (status,) = self.cache.GetPool(cache_pb2.GetPoolRequest(pool_id=pool), timeout=10).pools
            assert status.counters.available == status.counters.capacity, (pool, status.counters)


@pytest.fixture(scope="session")
def replicas(tmp_path_factory: pytest.TempPathFactory):
    """Chunk size 64 (long prompts take the chunked path), a small KV pool per replica (8192 tokens)."""
    tmp: pathlib.Path = tmp_path_factory.mktemp("replicas")
    with launched(tmp, "--replicas", "2", "--kv-tokens", "8192", "--chunk-size", "64",
                  "--max-running-requests", "32") as run:
        stack = TwoReplicas(run)
        stack.wait_ready()
        yield stack
        stack.close()
        run.interrupt()  # Ctrl-C: the launcher and every process of both replicas exit 0


@pytest.fixture(autouse=True)
def idle_after(replicas: TwoReplicas):
    yield
    replicas.idle_check()


def prompts(count: int, length: int, seed: int) -> list[list[int]]:
    """``count`` token-id prompts of ``length`` tokens, pairwise distinct from their first token (no shared prefix)."""
    rng = random.Random(seed)
    firsts = rng.sample(range(3, VOCAB), count)
    return [[first] + [rng.randrange(3, VOCAB) for _ in range(length - 1)] for first in firsts]
