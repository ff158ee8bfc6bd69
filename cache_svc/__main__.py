"""python -m cache_svc --listen 127.0.0.1:50051 [--lease-seconds 30]

Serves the Cache service (plus grpc.health.v1 and reflection); logs one JSON line with "event": "serving"
and the port when ready. SIGTERM/SIGINT: health NOT_SERVING, drain briefly, exit 0.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The cache's flags. A lease that is not a finite number > 0, or a drain that is not a finite number >= 0,
    is a usage error (exit 2) naming the flag. Imports nothing beyond argparse (the launcher checks its settings
    with this parser before it starts anything)."""
    parser = argparse.ArgumentParser(prog="python -m cache_svc", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:50051", help="host:port to bind (port 0 = any free port)")
    parser.add_argument("--lease-seconds", type=float, default=30.0, help="default session lease in seconds")
    parser.add_argument("--drain-seconds", type=float, default=2.0, help="grace period on SIGTERM")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if not (math.isfinite(args.lease_seconds) and args.lease_seconds > 0):
        parser.error(f"--lease-seconds must be > 0 (got {args.lease_seconds})")
    if not (math.isfinite(args.drain_seconds) and args.drain_seconds >= 0):
        parser.error(f"--drain-seconds must be >= 0 (got {args.drain_seconds})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from cache_svc.core import CacheCore
    from cache_svc.service import SERVICE_NAME, CacheServicer
    from codeserve.v1 import cache_pb2_grpc
    from common import grpc_server, logs

    log = logs.configure("cache", args.log_level)
    from common import switch_interval
    switch_s = switch_interval.configure()
    from common import hop_trace
    if (trace := hop_trace.configure("cache")) is not None:  # CODESERVE_HOP_TRACE=DIR
        log.info("hop_trace", path=trace)
    core = CacheCore(lease_seconds=args.lease_seconds)
    stop = threading.Event()

    def on_signal(signum, _frame) -> None:
        log.info("stopping", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)  # before SERVING: a SIGTERM right after start-up drains
    signal.signal(signal.SIGINT, on_signal)
    running = grpc_server.start(
        lambda server: cache_pb2_grpc.add_CacheServicer_to_server(CacheServicer(core), server),
        [SERVICE_NAME], args.listen,
    )
    log.info("serving", switch_interval_s=switch_s, port=running.port, listen=args.listen,
             lease_seconds=args.lease_seconds)
    stop.wait()
    running.set_serving(False, ["", SERVICE_NAME])
    running.server.stop(args.drain_seconds).wait()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
