"""A wave's end at the scheduler's Generate streams: the threaded gRPC server against one grpc.aio event loop.

N streams are open (a client process reads them all on one asyncio loop). Each round a busy thread (the scheduler's
loop) puts one message on every stream's queue and then stays busy for ``--busy-ms`` (building the next Forward),
as at the end of a wave of c64 where 64 last messages go out at once. Measured: when each client got its message,
in ms after the put (first / p50 / last of N, per round; rounds after the first).

- ``threads``: grpc's threaded server, a handler thread per stream blocked on a ``queue.SimpleQueue`` (the
  scheduler's servicer before session 26);
- ``aio``: ``common/aio_server.py``'s server, each stream's handler on one event loop reading a
  ``scheduler_svc.stream_queue.LoopQueue``, the round's messages handed over with ``put_all`` (the outbox's release).

Prints the absolute figures and the ratio of the last arrival's p50 over rounds (threads / aio); ``--json-out``.
``python -m bench.stream_wave_bench [--streams 64] [--rounds 12] [--busy-ms 30] [--json-out F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import queue
import statistics
import threading
import time
from concurrent import futures

import grpc

from common.aio_server import start_aio
from scheduler_svc.stream_queue import LoopQueue, put_all

SERVICE, METHOD = "bench.Wave", "Stream"
PAYLOAD = b"m" * 48


def _client(port: int, streams: int, rounds: int, conn) -> None:
    async def main() -> None:
        chan = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        call = chan.unary_stream(f"/{SERVICE}/{METHOD}")
        got: list[list[float]] = [[] for _ in range(rounds)]

        async def one() -> None:
            k = 0
            async for _ in call(b""):
                got[k].append(time.monotonic())
                k += 1
        await asyncio.gather(*(one() for _ in range(streams)))
        conn.send(got)
    asyncio.run(main())


def _busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _threads_server(rounds: int, queues: list, max_workers: int):
    def handler(request, context):
        q: queue.SimpleQueue = queue.SimpleQueue()
        queues.append(q)
        for _ in range(rounds):
            yield q.get()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        SERVICE, {METHOD: grpc.unary_stream_rpc_method_handler(handler)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return port, lambda: server.stop(0), lambda: [q.put(PAYLOAD) for q in list(queues)]


def _aio_server(rounds: int, queues: list):
    async def handler(request, context):
        q = LoopQueue(asyncio.get_running_loop())
        queues.append(q)
        for _ in range(rounds):
            yield await q.get()
    running = start_aio(lambda s: s.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        SERVICE, {METHOD: grpc.unary_stream_rpc_method_handler(handler)}),)), [SERVICE])
    return running.port, lambda: running.stop(None, 5.0), lambda: put_all([(q, PAYLOAD) for q in list(queues)])


def run_arm(kind: str, streams: int, rounds: int, busy_s: float) -> list[dict]:
    """One arm: per round (the first left out) first / p50 / last arrival in ms after the put."""
    queues: list = []
    if kind == "threads":
        port, stop, put = _threads_server(rounds, queues, streams + 8)
    else:
        port, stop, put = _aio_server(rounds, queues)
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_client, args=(port, streams, rounds, child))
    proc.start()
    deadline = time.monotonic() + 60
    while len(queues) < streams:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{kind}: only {len(queues)} of {streams} streams opened in 60 s")
        time.sleep(0.01)
    put_at = []
    for _ in range(rounds):
        time.sleep(0.1)  # the streams settle (the previous round's messages all read)
        put_at.append(time.monotonic())
        put()
        _busy(busy_s)
    if not parent.poll(60):
        proc.kill()
        stop()
        raise RuntimeError(f"{kind}: the client did not read every stream's {rounds} messages within 60 s")
    got = parent.recv()
    proc.join(30)
    stop()
    out = []
    for r in range(1, rounds):
        d = sorted((t - put_at[r]) * 1e3 for t in got[r])
        out.append({"first_ms": d[0], "p50_ms": d[len(d) // 2], "last_ms": d[-1]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--busy-ms", type=float, default=30.0)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args(argv)
    result = {"streams": args.streams, "busy_ms": args.busy_ms, "switch_interval_s": __import__("sys").getswitchinterval()}
    for kind in ("threads", "aio", "threads", "aio"):  # alternated: each arm twice
        rounds = run_arm(kind, args.streams, args.rounds, args.busy_ms / 1e3)
        result.setdefault(kind, []).extend(rounds)
        s = {k: statistics.median(r[k] for r in rounds) for k in ("first_ms", "p50_ms", "last_ms")}
        print(f"{kind:8s} median over {len(rounds)} rounds: first {s['first_ms']:.1f}  p50 {s['p50_ms']:.1f}  "
              f"last {s['last_ms']:.1f} ms")
    last = {k: statistics.median(r["last_ms"] for r in result[k]) for k in ("threads", "aio")}
    result["last_ms_median"] = last
    print(f"last arrival, median over rounds: threads {last['threads']:.1f} ms, aio {last['aio']:.1f} ms "
          f"(x{last['threads'] / last['aio']:.2f})")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
