"""Replica failures on two CPU replicas (the launcher's supervisor restarts what is killed): new requests go to the
other replica at once (the gateway takes the replica out of routing within 2 s), the other replica's streams finish,
and the replica rejoins after its restart. A killed scheduler's streams end with an error naming it; a killed
worker's are recomputed on its restarted worker (as with one replica), whose new epoch flushed its pool (a probe
reads 0 for what it held). A cache service restart costs every replica a recompute, nothing fails."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import signal
import threading
import time

import httpx

from tests.deploy.launched import wait_for
from tests.reliability.client import Outcome, generate
from tests.replicas.conftest import TwoReplicas, prompts
from tests.stack import generate as generate_at

LONG = 400  # output tokens of a stream that is still running when its replica is killed


class Streams:
    """``batch`` streamed at once on threads, ``LONG`` tokens each (ignore_eos); ``wait_streaming`` returns when each
    has its first tokens, ``outcomes`` when all ended."""

    def __init__(self, url: str, batch: list[list[int]]) -> None:
        self.batch = batch
        self.holders: list[int] = []  # the replica each runs on (set by spread)
        self.started = [threading.Event() for _ in batch]
        self.pool = concurrent.futures.ThreadPoolExecutor(len(batch))
        self.futures = [self.pool.submit(generate, url, ids, LONG, True, 120.0, streaming=ev)
                        for ids, ev in zip(batch, self.started)]

    def wait_streaming(self, timeout: float = 60.0) -> None:
        wait_for(lambda: all(e.is_set() for e in self.started), timeout, "every stream's first tokens")

    def outcomes(self) -> list[Outcome]:
        out = [f.result(timeout=180) for f in self.futures]
        self.pool.shutdown()
        return out


def spread(replicas: TwoReplicas, seed: int) -> Streams:
    """Streams of 8 distinct prompts, waited on until each is decoding, with some on each replica."""
    streams = Streams(replicas.url, prompts(8, 48, seed))
    streams.wait_streaming()
    holders = [replicas.holder(ids) for ids in streams.batch]
    assert set(holders) == {0, 1}, holders
    streams.holders = holders
    return streams


def replica_state(replicas: TwoReplicas, index: int) -> tuple[str, str]:
    """(state, reason) of replica ``index`` in the gateway's /ready body ("ready", "outage", "unreachable", ...)."""
    states = httpx.get(replicas.url + "/ready", timeout=10).json()["replicas"]
    return states[index]["state"], states[index].get("reason", "")


def out_of_routing_at_once(replicas: TwoReplicas, index: int, killed: float) -> tuple[str, str]:
    """Waits until the gateway no longer routes to replica ``index`` (its /ready state is not "ready"); asserts that
    took < 2 s after ``killed`` (monotonic) and returns (state, reason)."""
    state = wait_for(lambda: (s := replica_state(replicas, index))[0] != "ready" and s, 10, f"replica {index} out")
    assert time.monotonic() - killed < 2.0, time.monotonic() - killed
    return state


def served_by_replica_0_at_once(replicas: TwoReplicas, seed: int) -> None:
    """4 new requests: each answered within 10 s, each by replica 0."""
    batch = prompts(4, 32, seed)
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda ids: generate(replicas.url, ids, 2, stream=False), batch))
    assert all(o.ok for o in outs), [o.error for o in outs]
    assert time.monotonic() - t0 < 10
    assert [replicas.holder(ids) for ids in batch] == [0] * 4


def both_serve_again(replicas: TwoReplicas, seed: int) -> None:
    replicas.wait_ready()
    batch = prompts(8, 32, seed)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda ids: generate(replicas.url, ids, 2, stream=False), batch))
    assert all(o.ok for o in outs), [o.error for o in outs]
    assert {replicas.holder(ids) for ids in batch} == {0, 1}


def test_sigkill_of_worker_1_mid_stream(replicas: TwoReplicas) -> None:
    (before,) = prompts(1, 64, seed=20)  # finished on replica 1 before the kill: cached in pool-1
    assert generate_at(replicas.schedulers[1], input_ids=before, max_new_tokens=2, ignore_eos=True).finish_reason == "length"
    assert replicas.probe(before)[1] >= 63
    epochs = replicas.epochs()
    streams = spread(replicas, seed=21)
    backs = replicas.backs("worker-1")
    os.kill(replicas.run.pids["worker-1"], signal.SIGKILL)
    killed = time.monotonic()
    state, reason = out_of_routing_at_once(replicas, 1, killed)
    assert state == "outage" and "worker service at" in reason, (state, reason)
    served_by_replica_0_at_once(replicas, seed=22)
    replicas.restarted("worker-1", backs)
    # every stream completes: replica 1's are recomputed on its new worker (as with one replica), none is lost
    outs = streams.outcomes()
    assert all(o.ok and len(o.ids) == LONG for o in outs), [(h, o.error) for o, h in zip(outs, streams.holders)]
    wait_for(lambda: replicas.epochs()[1] != epochs[1], 60, "pool-1 registered with the new worker's epoch")
    assert replicas.epochs()[0] == epochs[0]
    assert replicas.probe(before) == [0, 0]  # the new epoch flushed pool-1: nothing stale to route on
    both_serve_again(replicas, seed=23)


def test_sigkill_of_idle_worker_1_flushes_its_pool_before_it_is_routed_again(replicas: TwoReplicas) -> None:
    """No request runs on replica 1 when its worker dies: its scheduler still re-registers the pool with the new
    worker's epoch before the gateway routes to it again, so the probe never offers the dead worker's prefix."""
    (before,) = prompts(1, 64, seed=25)  # cached in pool-1 before the kill
    assert generate_at(replicas.schedulers[1], input_ids=before, max_new_tokens=2, ignore_eos=True).finish_reason == "length"
    assert replicas.probe(before)[1] >= 63
    epochs = replicas.epochs()
    backs = replicas.backs("worker-1")
    os.kill(replicas.run.pids["worker-1"], signal.SIGKILL)
    out_of_routing_at_once(replicas, 1, time.monotonic())
    replicas.restarted("worker-1", backs)
    replicas.wait_ready()  # replica 1 routed again
    assert replicas.epochs()[1] != epochs[1], "pool-1 still registered with the dead worker's epoch"
    assert replicas.probe(before) == [0, 0]  # nothing stale to route on


def starting_worker(replicas: TwoReplicas, index: int, old: int) -> int:
    """The PID of replica ``index``'s worker process started after ``old`` (found by its --listen port in /proc)."""
    port = int(replicas.run.argv[replicas.run.argv.index("--worker-port") + 1]) + 2 * index
    listen = f"127.0.0.1:{port}"

    def found():
        for proc in pathlib.Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == old:
                continue
            try:
                argv = (proc / "cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if "worker_svc" in argv and listen in argv:
                return int(proc.name)
        return None
    return wait_for(found, 30, f"worker-{index}'s new process")


def test_a_worker_killed_again_during_its_restart_is_restarted_again(replicas: TwoReplicas) -> None:
    """The supervisor counts an exit during a restart as one more exit (it gives up only past 5 in 60 s): replica 0
    keeps serving and replica 1 comes back, instead of the launcher stopping both."""
    backs = replicas.backs("worker-1")
    old = replicas.run.pids["worker-1"]
    os.kill(old, signal.SIGKILL)
    new = starting_worker(replicas, 1, old)
    assert f"worker-1 is back (pid {new})" not in replicas.run.text()
    os.kill(new, signal.SIGKILL)  # during its start-up (loading the model)
    wait_for(lambda: replicas.run.proc.poll() is not None or replicas.backs("worker-1") > backs, 120,
             "worker-1 back, or the launcher gone")
    assert replicas.run.proc.poll() is None, replicas.run.text()[-1500:]
    replicas.restarted("worker-1", backs)
    both_serve_again(replicas, seed=27)


def test_sigkill_of_scheduler_1_mid_stream(replicas: TwoReplicas) -> None:
    streams = spread(replicas, seed=30)
    backs = replicas.backs("scheduler-1")
    os.kill(replicas.run.pids["scheduler-1"], signal.SIGKILL)
    out_of_routing_at_once(replicas, 1, time.monotonic())
    served_by_replica_0_at_once(replicas, seed=31)
    for o, h in zip(streams.outcomes(), streams.holders):
        if h == 0:
            assert o.ok and len(o.ids) == LONG, o
        else:  # the stream ends with an error event naming the replica's scheduler
            assert not o.ok and o.error and str(replicas.scheduler_ports[1]) in o.error, o
    replicas.restarted("scheduler-1", backs)
    both_serve_again(replicas, seed=32)


def test_cache_service_restart_mid_stream(replicas: TwoReplicas) -> None:
    """Every stream spanning the restart completes (recomputed); both pools come back empty, then serve."""
    streams = spread(replicas, seed=40)
    backs = replicas.backs("cache")
    os.kill(replicas.run.pids["cache"], signal.SIGKILL)
    replicas.restarted("cache", backs)
    outs = streams.outcomes()
    assert all(o.ok and len(o.ids) == LONG for o in outs), [o.error for o in outs]
    both_serve_again(replicas, seed=41)


def test_a_call_on_a_frozen_scheduler_before_its_first_token_is_retried_on_the_other_replica(
        replicas: TwoReplicas) -> None:
    """SIGSTOP of scheduler 1, then at once 4 requests whose prompts replica 1 holds: the router sends them there
    (its health probe has not noticed yet). When the probe notices (0.5 s interval, 2 s deadline), the calls have
    read nothing: each is retried once on replica 0 and answered, like a call refused with UNAVAILABLE (they were
    503s before: abandoning a call did not retry it). SIGCONT, and replica 1 serves again."""
    held = [ids for ids in prompts(12, 40, seed=40) if generate(replicas.url, ids, 1, stream=False).ok]
    on_1 = [ids for ids in held if replicas.holder(ids) == 1][:4]
    assert len(on_1) >= 2, "the burst should have put some prompts on replica 1"
    pid = replicas.run.pids["scheduler-1"]
    os.kill(pid, signal.SIGSTOP)
    try:
        with concurrent.futures.ThreadPoolExecutor(len(on_1)) as pool:
            outs = list(pool.map(lambda ids: generate(replicas.url, ids, 2, stream=False, timeout=30.0), on_1))
        assert all(o.ok for o in outs), [o.error for o in outs]
        # replica 0 computed them: its pool now holds each prompt (replica 1's held it before)
        assert [replicas.probe(ids)[0] >= len(ids) - 1 for ids in on_1] == [True] * len(on_1)
    finally:
        os.kill(pid, signal.SIGCONT)
    both_serve_again(replicas, seed=41)
