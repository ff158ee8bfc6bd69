"""python -m scheduler_svc --listen HOST:PORT --cache HOST:PORT --worker HOST:PORT --model-path DIR [...]"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import math
import os
import signal
import sys
import threading
import time

from scheduler_svc.overlap_mode import DEFAULT_OVERLAP_MODE, OVERLAP_MODES
from scheduler_svc.policy import POLICIES

INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1

# The parser imports nothing heavy (the rest is imported in main): the launcher checks its settings with it
# before it starts anything.


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scheduler_svc", description=__doc__)
    p.add_argument("--listen", default="127.0.0.1:50053")
    p.add_argument("--cache", default="127.0.0.1:50051", help="cache service host:port")
    p.add_argument("--worker", default="127.0.0.1:50052", help="worker service host:port")
    p.add_argument("--model-path", required=True, help="checkpoint directory (its tokenizer.json is used)")
    p.add_argument("--pool-id", default="default")
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--chunk-size", type=int, default=512, help="prefill tokens per round (chunked prefill)")
    p.add_argument("--policy", choices=POLICIES, default="fcfs")
    p.add_argument("--max-queued-requests", type=int, default=1024)
    p.add_argument("--max-queued-tokens", type=int, default=0,
                   help="bound on the tokens of waiting requests (0 = none); past it new requests are "
                        "RESOURCE_EXHAUSTED while others wait")
    p.add_argument("--progress-timeout", type=float, default=30.0,
                   help="seconds without a completed batch while work waits or runs before health is NOT_SERVING")
    p.add_argument("--outage-timeout", type=float, default=30.0,
                   help="seconds the cache or worker may stay unreachable before queued requests fail with UNAVAILABLE")
    p.add_argument("--worker-stall-timeout", type=float, default=10.0,
                   help="seconds the worker may leave its health checks (probed every 1 s, 2 s deadline) unanswered "
                        "before it counts as frozen: requests in flight, running and waiting fail with UNAVAILABLE, "
                        "new ones at once, until it answers again (0 = off)")
    p.add_argument("--owner", default="scheduler-0", help="stable session owner name at the cache service")
    p.add_argument("--lease-seconds", type=float, default=30.0)
    p.add_argument("--connect-timeout", type=float, default=120.0,
                   help="seconds to wait for the cache and worker at start-up")
    p.add_argument("--drain-seconds", type=float, default=5.0)
    p.add_argument("--decode-steps", type=int, default=0,
                   help="decode steps per Forward (multi-step decode); 0 = auto: 8 on a CUDA worker, 1 otherwise")
    p.add_argument("--adaptive-steps", action=argparse.BooleanOptionalAction, default=True,
                   help="with --decode-steps > 1: fewer steps per decode Forward while requests arrive often (their "
                        "first token waits less behind the Forward in flight), --decode-steps when none came "
                        "recently (scheduler_svc/step_budget.py)")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                   help="overlapped decode: in steady decode send Forward N+1 before processing N's reply")
    p.add_argument("--mixed-chunk", action=argparse.BooleanOptionalAction, default=False,
                   help="decoding requests ride in extend batches, one step each, so no decode stalls for a prefill "
                        "(lower ITL p99, less throughput: bench/README.md run 6)")
    p.add_argument("--chain-admissions", action=argparse.BooleanOptionalAction, default=True,
                   help="overlapped decode goes on through admissions (an arrival's first decode joins the next "
                        "chained Forward); off: an admission drains the decode in flight first")
    p.add_argument("--chain-after-extend", action=argparse.BooleanOptionalAction, default=True,
                   help="the first decode Forward after an extend that ends every prefill is sent while that extend "
                        "runs (chained behind it); off: the extend's reply is applied first")
    p.add_argument("--arrival-gate", action=argparse.BooleanOptionalAction, default=True,
                   help="arrivals admitted while a Forward runs wait for a reply (or a whole chunk of them) once "
                        "two extends are queued at the worker, so a burst is prefilled in full chunks")
    p.add_argument("--chunk-pipeline", action=argparse.BooleanOptionalAction, default=True,
                   help="chunked prefill pipelined: send a long prompt's next chunk while the one before it runs, "
                        "so the worker does not idle between chunks")
    p.add_argument("--early-match", action=argparse.BooleanOptionalAction, default=True,
                   help="send an arrival's admission Match from the thread that received it, while it waits for the "
                        "loop (fcfs only; scheduler_svc/early_match.py)")
    p.add_argument("--deliver-after-send", action=argparse.BooleanOptionalAction, default=True,
                   help="hand the stream messages of a chained decode Forward to their streams once the next Forward "
                        "is sent, not while it is built (scheduler_svc/outbox.py; --no-deliver-after-send for the A/B)")
    p.add_argument("--chain-depth", type=int, choices=(1, 2), default=1,
                   help="decode Forwards the overlapped chain keeps queued at the worker: 1 sends N+2 once N's reply "
                        "is applied; 2 as soon as N's reply is in, before it is applied (queued mode; "
                        "scheduler_svc/chain.py chain_ahead)")
    p.add_argument("--overlap-mode", choices=OVERLAP_MODES, default=DEFAULT_OVERLAP_MODE,
                   help="when overlapped decode sends Forward N+1: queued = at once, waiting at the worker behind N "
                        "(an arrival's extend that reaches the worker before N+1 started still goes first); "
                        "just-in-time = when N's reply is in (an arrival's extend goes first)")
    args = p.parse_args(argv)
    check_ranges(p, args)
    return args


def check_ranges(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (exit 2) naming the flag for a value out of its range: counts >= 1 and within their wire
    type (int32; --max-queued-tokens int64), --max-queued-tokens and
    --decode-steps >= 0 (0 = no bound / auto); times in seconds finite, > 0 (progress, outage, lease) or >= 0
    (worker stall: 0 = off; connect, drain)."""
    for name, low, high in (("max_running_requests", 1, INT32_MAX), ("chunk_size", 1, INT32_MAX),
                            ("max_queued_requests", 1, INT32_MAX), ("max_queued_tokens", 0, INT64_MAX),
                            ("decode_steps", 0, INT32_MAX)):
        if not low <= getattr(args, name) <= high:  # high: the wire type (ServerInfoResponse, ForwardItem)
            p.error(f"--{name.replace('_', '-')} must be in {low}..{high} (got {getattr(args, name)})")
    for name, positive in (("progress_timeout", True), ("outage_timeout", True), ("lease_seconds", True),
                           ("worker_stall_timeout", False), ("connect_timeout", False), ("drain_seconds", False)):
        value = getattr(args, name)
        if not math.isfinite(value) or (value <= 0 if positive else value < 0):
            p.error(f"--{name.replace('_', '-')} must be a finite number {'> 0' if positive else '>= 0'} (got {value})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from codeserve.v1 import scheduler_pb2_grpc
    from common import aio_server, grpc_server, logs
    from scheduler_svc.cache_client import CacheClient
    from scheduler_svc.detokenizer import load_tokenizer
    from scheduler_svc.errors import DependencyUnavailable, PoolHeld
    from scheduler_svc.liveness import WorkerLiveness
    from scheduler_svc.scheduler import Scheduler, SchedulerConfig
    from scheduler_svc.service import SERVICE_NAME, SchedulerServicer

    log = logs.configure("scheduler")
    from common import switch_interval
    switch_s = switch_interval.configure()
    from common import hop_trace
    if (trace := hop_trace.configure("scheduler")) is not None:  # CODESERVE_HOP_TRACE=DIR
        log.info("hop_trace", path=trace)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack to stderr
    tokenizer = load_tokenizer(args.model_path)
    cfg = SchedulerConfig(pool_id=args.pool_id, max_running_requests=args.max_running_requests,
                          chunk_size=args.chunk_size, policy=args.policy, max_queued_requests=args.max_queued_requests,
                          progress_timeout=args.progress_timeout,
                          outage_timeout=args.outage_timeout, owner=args.owner, lease_seconds=args.lease_seconds,
                          decode_steps=max(args.decode_steps, 1), adaptive_steps=args.adaptive_steps,
                          overlap=args.overlap, overlap_mode=args.overlap_mode, chain_depth=args.chain_depth,
                          mixed_chunk=args.mixed_chunk,
                          chunk_pipeline=args.chunk_pipeline, chain_admissions=args.chain_admissions,
                          arrival_gate=args.arrival_gate,
                          chain_after_extend=args.chain_after_extend, early_match=args.early_match, deliver_after_send=args.deliver_after_send)
    from scheduler_svc.worker_client import WorkerClient

    liveness = None
    if args.worker_stall_timeout > 0:
        liveness = WorkerLiveness.for_target(args.worker, stall_timeout_s=args.worker_stall_timeout,
                                             timeout_s=min(2.0, args.worker_stall_timeout))
    sched = Scheduler(CacheClient(args.cache, args.pool_id), WorkerClient(args.worker), cfg, log, liveness=liveness)
    deadline = time.monotonic() + args.connect_timeout
    while True:
        try:
            sched.connect()
            break
        except PoolHeld as exc:  # another scheduler serves this pool: say so and exit, never retry (a flush loop)
            log.error("pool_held", error=str(exc))
            return 2
        except DependencyUnavailable as exc:
            if time.monotonic() > deadline:
                log.error("connect_failed", error=str(exc))
                return 2
            log.warning("waiting_for_dependency", error=str(exc))
            time.sleep(1.0)
    if args.decode_steps == 0:  # auto: the worker's device decides
        sched.cfg = dataclasses.replace(cfg, decode_steps=8 if sched.info.device.startswith("cuda") else 1)

    if liveness is not None:
        liveness.start()
    loop = threading.Thread(target=sched.run, name="scheduler-loop", daemon=True)
    loop.start()
    servicer = SchedulerServicer(sched, tokenizer, log, max_queued_tokens=args.max_queued_tokens)
    stop = threading.Event()  # handlers before SERVING: a SIGTERM right after start-up drains, not kills
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # Generate streams and health run on the server's event loop; GetLoad, Abort, FlushCache, ServerInfo on its
    # threads (a GetLoad waits up to POOL_READ_TIMEOUT_S on a cache that does not answer: room for the gateways' polls)
    server = aio_server.start_aio(lambda s: scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, s),
                                  [SERVICE_NAME], args.listen, max_workers=64)
    names = ["", SERVICE_NAME]
    log.info("serving", switch_interval_s=switch_s, port=server.port, listen=args.listen, cache=args.cache,
             worker=args.worker,
             n_positions=sched.info.n_positions, capacity=sched.capacity, chunk_size=cfg.chunk_size, policy=cfg.policy,
             decode_steps=sched.cfg.decode_steps, adaptive_steps=cfg.adaptive_steps,
             overlap=cfg.overlap, overlap_mode=cfg.overlap_mode, chain_depth=cfg.chain_depth, mixed_chunk=cfg.mixed_chunk,
             chunk_pipeline=cfg.chunk_pipeline, chain_admissions=cfg.chain_admissions, chain_after_extend=cfg.chain_after_extend,
             arrival_gate=cfg.arrival_gate,
             early_match=cfg.early_match, deliver_after_send=cfg.deliver_after_send,
             worker_stall_timeout=args.worker_stall_timeout)

    serving = True
    logged_stats, next_stats = None, 0.0
    while not stop.wait(0.25):
        if time.monotonic() >= next_stats and sched.stats != logged_stats:  # counters for bench/ (cumulative)
            logged_stats, next_stats = dict(sched.stats), time.monotonic() + 2.0
            log.info("loop_stats", **logged_stats)
        reason = sched.unhealthy_reason()
        if (not reason) != serving:
            serving = not reason
            server.set_serving(serving, names)
            log.warning("health", serving=serving, reason=reason)
        if not loop.is_alive():
            log.error("loop_died", reason=sched.stopped_reason)
            server.set_serving(False, names)
            server.stop(grace=1.0, timeout=2.0)
            return 1

    log.info("draining", drain_seconds=args.drain_seconds)
    server.set_serving(False, names)
    servicer.draining.set()
    drain_deadline = time.monotonic() + args.drain_seconds
    while time.monotonic() < drain_deadline and sum(sched.queue_lengths()[:2]) > 0:
        time.sleep(0.05)
    sched.stop("shutting down (SIGTERM)")
    loop.join(timeout=5.0)
    if not loop.is_alive() and not servicer.wait_calls_ended(1.0):  # streams ended before the probe is refused
        log.warning("streams_still_open", calls=servicer.open_calls())
    server.stop(grace=1.0, timeout=2.0)
    lingering = grpc_server.lingering_threads(server, seconds=3.0)
    log.info("stopped")
    if lingering:  # the drain is over: log what still runs, and exit instead of waiting for it forever
        log.error("lingering_threads", threads=lingering)
    # Exit without the interpreter's teardown, as the worker does: its garbage collection of gRPC channels can block
    # on a lock a gRPC thread holds (the scheduler hung after "stopped" in a fresh-clone CI run of session 30,
    # tests/reliability/test_drain.py, faulthandler: grpc/_channel.py __del__ -> threading __enter__). Every file this
    # process writes (logs, hop marks) is written a line at a time.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
