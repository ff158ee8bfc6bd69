"""All four services as real processes for the reliability tests: a Backend (cache, worker, scheduler) plus
the gateway over real HTTP, with helpers to kill / stop / restart one of them and to check the pool at idle.

    sys_ = System.start(log_dir, scheduler_args=("--outage-timeout", "8"), gateway_args=("--request-timeout", "5"),
                        kv_tokens=4096, max_running_requests=4)
    sys_.post("/v1/completions", {...})        # httpx.Response
    sys_.kill("scheduler"); sys_.restart("scheduler")
    sys_.settle()                              # idle: integrity empty, available + evictable == capacity, then flushed
"""

from __future__ import annotations

import dataclasses
import pathlib
import signal
import time
from dataclasses import dataclass, field

import httpx

from codeserve.v1 import cache_pb2, scheduler_pb2
from launcher.config import commands
from tests.stack import Backend


def wait_for(pred, timeout: float, what: str, interval: float = 0.05):
    """Polls ``pred`` until it returns a truthy value (returned); AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout} s")
        time.sleep(interval)


@dataclass
class System:
    """cache + worker + scheduler + gateway. ``argv`` holds each service's full command line (with the extra
    flags), so a restart uses the same settings."""

    be: Backend
    argv: dict[str, list[str]]
    http: httpx.Client
    stopped: set[str] = field(default_factory=set)

    @classmethod
    def start(cls, log_dir: pathlib.Path, scheduler_args: tuple[str, ...] = (), gateway_args: tuple[str, ...] = (),
              **overrides) -> "System":
        be = Backend.start(log_dir, scheduler_args=scheduler_args, **overrides)
        try:
            argv = commands(be.stack.cfg, be.stack.model_path)
            argv["scheduler"] += list(scheduler_args)
            argv["gateway"] += list(gateway_args)
            be.stack.start_one("gateway", argv["gateway"])
        except BaseException:
            be.stop()
            raise
        return cls(be, argv, httpx.Client(base_url=be.stack.url, timeout=60))

    # ---- processes -----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.be.stack.url

    @property
    def model_path(self) -> str:
        return self.be.stack.model_path

    def pid(self, name: str) -> int:
        return self.be.stack.procs[name].pid

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Sends ``sig``; SIGKILL/SIGTERM wait for the exit. SIGSTOP / SIGCONT are remembered for cleanup."""
        if sig == signal.SIGSTOP:
            self.stopped.add(name)
        if sig == signal.SIGCONT:
            self.stopped.discard(name)
        self.be.stack.kill(name, sig)

    def restart(self, name: str, timeout: float = 60.0) -> float:
        """Starts ``name`` again with its own flags and waits until ready; returns the seconds it took."""
        t0 = time.monotonic()
        self.be.stack.start_one(name, self.argv[name], timeout)
        return time.monotonic() - t0

    def exit_code(self, name: str) -> int | None:
        return self.be.stack.procs[name].poll()

    def stop(self) -> dict[str, int]:
        for name in list(self.stopped):
            self.kill(name, signal.SIGCONT)
        self.http.close()
        return self.be.stop()

    # ---- HTTP ----------------------------------------------------------------------------------------
    def post(self, path: str, payload: dict, timeout: float = 60.0) -> httpx.Response:
        return self.http.post(path, json=payload, timeout=timeout)

    def status(self, path: str, timeout: float = 10.0) -> int:
        """HTTP status of GET ``path``; 0 when the connection fails or times out."""
        try:
            return self.http.get(path, timeout=timeout).status_code
        except httpx.TransportError:
            return 0

    # ---- pool ----------------------------------------------------------------------------------------
    def counters(self) -> cache_pb2.Counters:
        return self.be.counters()

    def integrity(self) -> list[str]:
        reply = self.be.cache.CheckIntegrity(cache_pb2.CheckIntegrityRequest(pool_id=self.be.pool_id), timeout=10)
        return list(reply.violations)

    def settle(self, timeout: float = 60.0) -> cache_pb2.Counters:
        """Waits for idle; asserts integrity empty, available + evictable == capacity (nothing owned or
        locked), then flushes and asserts available == capacity. Returns the counters after the flush."""
        for name in ("cache", "worker", "scheduler", "gateway"):
            assert self.exit_code(name) is None, f"{name} exited with {self.exit_code(name)}"
        self.be.wait_idle(timeout)
        assert self.integrity() == []
        wait_for(lambda: (c := self.counters()).available + c.evictable == c.capacity, 10,
                 "available + evictable == capacity at idle")
        self.be.scheduler.FlushCache(scheduler_pb2.FlushCacheRequest(), timeout=10)
        c = self.counters()
        assert c.available == c.capacity, f"leaked slots after flush: {c}"
        assert self.integrity() == []
        return c

