"""Round trip of a synchronous gRPC ``.future()`` call, one after the other, with and without
``common.poller_keeper.PollerKeeper`` on the channel (and a blocking call as the floor): how much the event thread
grpcio starts per call when no other non-blocking call is open costs (the scheduler sends its Forwards so).

    python -m bench.future_call_bench --out bench/results/cpu-host-overhead/future_call.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common import grpc_server
from common.poller_keeper import PollerKeeper


def per_call_us(call, n: int) -> float:
    """Median over 5 rounds of the mean microseconds of ``n`` sequential ``call()``s."""
    rounds = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            call()
        rounds.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(rounds)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    server = grpc_server.start(lambda s: None, [], "127.0.0.1:0")
    chan = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub, req = health_pb2_grpc.HealthStub(chan), health_pb2.HealthCheckRequest()
    try:
        stub.Check(req)
        future = lambda: stub.Check.future(req).result()  # noqa: E731
        out = {"future_us": per_call_us(future, args.calls), "blocking_us": per_call_us(lambda: stub.Check(req), args.calls)}
        keeper = PollerKeeper(chan)
        while not keeper.held:
            time.sleep(0.01)
        out["future_kept_us"] = per_call_us(future, args.calls)
        keeper.close()
    finally:
        chan.close()
        server.server.stop(0)
    out["ratio_kept_vs_plain"] = out["future_kept_us"] / out["future_us"]
    print(f"future() {out['future_us']:.0f} us, with PollerKeeper {out['future_kept_us']:.0f} us "
          f"({out['ratio_kept_vs_plain']:.2f}x), blocking {out['blocking_us']:.0f} us")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
