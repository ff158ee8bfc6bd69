"""Reusable test helpers: the gRPC back end (cache, worker, scheduler) as real subprocesses on free ports,
and a collecting Generate client.

    from tests.stack import Backend, generate
    with Backend.start(tmp_path, kv_tokens=2048, chunk_size=64) as be:   # waits for grpc health SERVING
        out = generate(be.scheduler, input_ids=[1, 2, 3], max_new_tokens=8)
        out.token_ids, out.text, out.finish_reason, out.cached_tokens ...
        be.idle_check()        # flush, then available == capacity and the integrity check is empty

``Backend.start`` accepts any launcher.config.StackConfig field (kv_tokens, chunk_size, page_size,
max_running_requests, policy, progress_timeout, ...); ports are always free ones. ``be.stack`` is the
launcher Stack (``kill(name)``, ``start_one(name)``, ``log_tail(name)``); ``be.stack.start_one("gateway")``
adds the gateway.
"""

from __future__ import annotations

import dataclasses
import pathlib
import threading
import time
from dataclasses import dataclass, field

import grpc

from codeserve.v1 import cache_pb2, cache_pb2_grpc, common_pb2, scheduler_pb2, scheduler_pb2_grpc
from common.grpc_server import channel
from launcher.config import StackConfig
from launcher.stack import Stack

BACKEND = ("cache", "worker", "scheduler")


@dataclass
class Output:
    """A Generate stream collected: concatenated token ids / text / logprobs, first-message prompt facts,
    last-message finish facts, and every raw message."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[common_pb2.TopLogprobs] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prompt_token_ids: list[int] = field(default_factory=list)
    prompt_logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    matched_stop: str = ""
    completion_tokens: int = 0
    messages: list[scheduler_pb2.GenerateResponse] = field(default_factory=list)


def collect(stream) -> Output:
    """Reads a Generate response stream to its end (raises grpc.RpcError on an error status)."""
    out = Output()
    for i, msg in enumerate(stream):
        out.messages.append(msg)
        if i == 0:
            out.prompt_tokens, out.cached_tokens = msg.prompt_tokens, msg.cached_tokens
            out.prompt_token_ids = list(msg.prompt_token_ids)
            out.prompt_logprobs = list(msg.prompt_logprobs)
        out.token_ids += msg.token_ids
        out.text += msg.text
        out.logprobs += msg.logprobs
        out.top_logprobs += msg.top_logprobs
        if msg.finish_reason:
            out.finish_reason, out.matched_stop = msg.finish_reason, msg.matched_stop
            out.completion_tokens = msg.completion_tokens
    return out


def request(text: str | None = None, input_ids: list[int] | None = None, temperature: float = 0.0,
            **kw) -> scheduler_pb2.GenerateRequest:
    """A GenerateRequest from text or token ids; other keywords are GenerateRequest fields."""
    req = scheduler_pb2.GenerateRequest(sampling=common_pb2.SamplingParams(temperature=temperature), **kw)
    if input_ids is not None:
        req.input_ids.ids.extend(input_ids)
    elif text is not None:
        req.text = text
    return req


def generate(stub: scheduler_pb2_grpc.SchedulerStub, timeout: float = 120.0, **kw) -> Output:
    """One Generate call collected (see ``request`` for the keywords)."""
    return collect(stub.Generate(request(**kw), timeout=timeout))


def generate_many(stub, requests: list[dict], timeout: float = 300.0) -> list[Output]:
    """Sends all requests at once (one thread each) and returns their outputs in order."""
    outs: list[Output | BaseException | None] = [None] * len(requests)

    def one(i: int) -> None:
        try:
            outs[i] = generate(stub, timeout=timeout, **requests[i])
        except BaseException as exc:  # re-raised below in the caller's thread
            outs[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for o in outs:
        if isinstance(o, BaseException):
            raise o
    return outs  # type: ignore[return-value]


@dataclass
class Backend:
    """A running cache + worker + scheduler. ``scheduler`` and ``cache`` are stubs on open channels."""

    stack: Stack
    scheduler: scheduler_pb2_grpc.SchedulerStub
    cache: cache_pb2_grpc.CacheStub
    pool_id: str = "default"
    _channels: list = field(default_factory=list)

    @classmethod
    def start(cls, log_dir: pathlib.Path, timeout: float = 180.0, scheduler_args: tuple[str, ...] = (),
              **overrides) -> "Backend":
        """Starts the three services on free ports (CPU, fp32, 8192 KV tokens unless overridden);
        ``scheduler_args`` are extra scheduler flags (e.g. ("--outage-timeout", "3")). Raises StartupError."""
        base = StackConfig(http_port=0, cache_port=0, worker_port=0, scheduler_port=0, device="cpu",
                           dtype="float32", kv_tokens=8192)
        stack = Stack(dataclasses.replace(base, **overrides), pathlib.Path(log_dir))
        try:
            stack.start(timeout=timeout, only=BACKEND[:2])
            stack.start_one("scheduler", stack.commands()["scheduler"] + list(scheduler_args),
                            timeout)
        except BaseException:
            stack.stop()
            raise
        sched_chan, cache_chan = channel(stack.target("scheduler")), channel(stack.target("cache"))
        return cls(stack, scheduler_pb2_grpc.SchedulerStub(sched_chan), cache_pb2_grpc.CacheStub(cache_chan),
                   _channels=[sched_chan, cache_chan])

    def stop(self) -> dict[str, int]:
        for chan in self._channels:
            chan.close()
        return self.stack.stop()

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def counters(self) -> cache_pb2.Counters:
        reply = self.cache.GetPool(cache_pb2.GetPoolRequest(pool_id=self.pool_id), timeout=10)
        return reply.pools[0].counters

    def load(self) -> scheduler_pb2.GetLoadResponse:
        return self.scheduler.GetLoad(scheduler_pb2.GetLoadRequest(), timeout=10)

    def wait_idle(self, timeout: float = 30.0) -> scheduler_pb2.GetLoadResponse:
        """Waits until the scheduler has nothing running or waiting; raises TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            load = self.load()
            if load.running == 0 and load.waiting == 0:
                return load
            if time.monotonic() > deadline:
                raise TimeoutError(f"scheduler not idle after {timeout} s: {load}")
            time.sleep(0.05)

    def idle_check(self) -> cache_pb2.Counters:
        """Waits for idle, flushes, and asserts no leaked slot: available == capacity, integrity empty."""
        self.wait_idle()
        self.scheduler.FlushCache(scheduler_pb2.FlushCacheRequest(), timeout=10)
        c = self.counters()
        violations = self.cache.CheckIntegrity(cache_pb2.CheckIntegrityRequest(pool_id=self.pool_id), timeout=10)
        assert list(violations.violations) == [], violations.violations
        assert c.available == c.capacity, f"leaked slots: {c}"
        return c


def status_of(call) -> tuple[grpc.StatusCode, str]:
    """(code, details) of a failed call: ``status_of(lambda: generate(...))``; AssertionError when it succeeds."""
    try:
        call()
    except grpc.RpcError as err:
        return err.code(), err.details()
    raise AssertionError("the call succeeded")
