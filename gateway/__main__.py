"""``python -m gateway --host 127.0.0.1 --port 8000 --scheduler 127.0.0.1:50053 --model-path DIR
[--model-name NAME] [--api-key KEY]``: serves the HTTP API in front of the scheduler; with
``--replica scheduler=HOST:PORT,cache=HOST:PORT,pool=ID`` (repeated, instead of --scheduler) in front of several
replicas, each call routed by ``--routing`` (gateway.router)."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import pathlib
import signal
import socket
from typing import TYPE_CHECKING

import uvicorn

if TYPE_CHECKING:  # the rest of the gateway is imported in main: parsing the flags stays light for the launcher
    from gateway.scheduler_client import SchedulerClient


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The gateway's flags."""
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--scheduler", default=None,
                        help="scheduler gRPC address host:port (one replica; default 127.0.0.1:50053)")
    parser.add_argument("--replica", action="append", default=[], metavar="scheduler=H:P,cache=H:P,pool=ID",
                        help="a replica: its scheduler's and cache service's addresses and its pool id (pool "
                             "defaults to 'default'); repeat for each replica, instead of --scheduler")
    parser.add_argument("--routing", default="cache_aware", choices=["cache_aware", "round_robin", "least_load"],
                        help="how calls are spread over several replicas (default cache_aware: least of uncached "
                             "prompt tokens + w_q * queued tokens + w_r * requests)")
    parser.add_argument("--route-queued-weight", type=float, default=1.0,
                        help="w_q: cost of one queued prompt token, in uncached prompt tokens (default 1.0: it is "
                             "prefilled before ours)")
    parser.add_argument("--route-requests-weight", type=float, default=16.0,
                        help="w_r: cost of one request the scheduler holds, in uncached prompt tokens (default 16: "
                             "its decode slot next to our prefill)")
    parser.add_argument("--pending-ttl", type=float, default=2.0,
                        help="seconds a routed request counts as pending (cached there for the next prompts, and "
                             "as load) unless its first message comes sooner")
    parser.add_argument("--load-interval", type=float, default=0.25,
                        help="seconds between GetLoad polls of each replica's scheduler (several replicas)")
    parser.add_argument("--cache-probe-timeout", type=float, default=0.5,
                        help="seconds for a cache's ProbePrefix answer; one that misses it routes its replicas "
                             "as 0 cached")
    parser.add_argument("--model-path", required=True, type=pathlib.Path,
                        help="checkpoint directory (config.json, tokenizer.json)")
    parser.add_argument("--model-name", default=None, help="served model name (default: the directory name)")
    parser.add_argument("--api-key", default=os.environ.get("CODESERVE_API_KEY"),
                        help="require Authorization: Bearer KEY (default: $CODESERVE_API_KEY; none = open)")
    parser.add_argument("--max-body-bytes", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--max-n", type=int, default=16)
    parser.add_argument("--health-timeout", type=float, default=10.0, help="seconds for /health_generate")
    parser.add_argument("--request-timeout", type=float, default=None,
                        help="seconds a generation may take before it fails with 503 (default: no limit)")
    parser.add_argument("--probe-interval", type=float, default=0.5,
                        help="seconds between scheduler health probes (0 = off); see --probe-timeout")
    parser.add_argument("--probe-timeout", type=float, default=2.0,
                        help="a scheduler that does not answer a health probe within this many seconds is "
                             "unreachable: /ready 503, new requests 503 at once, requests in flight end with 503")
    parser.add_argument("--drain-seconds", type=float, default=5.0,
                        help="on SIGTERM: seconds requests in flight may take to finish; those still running "
                             "1 s before the end get a 503 (an error event when streaming)")
    parser.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop"],
                        help="the event loop (uvicorn's --loop). uvloop: c64 within noise of asyncio on the H100 (bench/"
                             "README.md, run 23), and a drain test (a stream's 'shutting down' against the health "
                             "probe's UNAVAILABLE) raced once with it in CI: not the default")
    parser.add_argument("--http", default="h11", choices=["h11", "httptools"],
                        help="the HTTP/1.1 parser (uvicorn's --http): h11 (pure Python) or httptools (C)")
    parser.add_argument("--workers", type=int, default=1,
                        help="gateway processes serving the one port (gateway/workers.py): at a wave of stream ends "
                             "and new bodies one process takes them one after the other (default 1)")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    check_ranges(parser, args)
    check_replicas(parser, args)
    return args


def check_replicas(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Sets ``args.replicas`` (ReplicaSpec list): the --replica values, or the one --scheduler (default
    127.0.0.1:50053). A usage error (exit 2) for both flags together, a malformed --replica, the same scheduler
    or (cache, pool) twice, or several replicas with --workers > 1."""
    from gateway.replica_spec import ReplicaSpec

    if args.replica and args.scheduler is not None:
        parser.error("give either --scheduler (one replica) or --replica (one per replica), not both")
    if not args.replica:
        args.replicas = [ReplicaSpec(args.scheduler or "127.0.0.1:50053")]
        return
    try:
        args.replicas = [ReplicaSpec.parse(text) for text in args.replica]
    except ValueError as exc:
        parser.error(f"--replica: {exc}")
    for what, keys in (("scheduler", [r.scheduler for r in args.replicas]),
                       ("cache and pool", [(r.cache, r.pool) for r in args.replicas])):
        dup = next((k for k in keys if keys.count(k) > 1), None)
        if dup is not None:
            parser.error(f"--replica: two replicas have the same {what} {dup}")
    if args.workers > 1 and len(args.replicas) > 1:
        parser.error("--workers > 1 serves one replica only: the routing metrics are kept per process and each "
                     "process would route on its own view of the replicas")


def check_ranges(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (exit 2) naming the flag for a value out of its range: --port 0..65535, --max-body-bytes and
    --max-n >= 1, the timeouts (seconds) finite and > 0, --probe-interval and --drain-seconds finite and >= 0."""
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0..65535 (got {args.port})")
    if not 1 <= args.workers <= 64:
        parser.error(f"--workers must be in 1..64 (got {args.workers})")
    for name in ("max_body_bytes", "max_n"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    for name, low in (("health_timeout", 0), ("request_timeout", 0), ("probe_timeout", 0),
                      ("probe_interval", None), ("drain_seconds", None), ("pending_ttl", 0),
                      ("load_interval", None), ("cache_probe_timeout", 0), ("route_queued_weight", None),
                      ("route_requests_weight", None)):
        value = getattr(args, name)
        if value is None:
            continue
        if not math.isfinite(value) or (value <= 0 if low == 0 else value < 0):
            bound = "> 0" if low == 0 else ">= 0"
            parser.error(f"--{name.replace('_', '-')} must be a finite number {bound} (got {value})")


def main(argv: list[str] | None = None) -> None:
    """Binds the port, then serves it until SIGINT/SIGTERM: in this process, or in ``--workers`` forked ones
    (``gateway/workers.py``; the parent exits with their outcome)."""
    args = parse_args(argv)
    from common.logs import configure

    log = configure("gateway", args.log_level)
    from gateway.workers import MULTIPROC_ENV, run_workers

    # the gateway sets prometheus-client's multiprocess directory itself, for --workers > 1 only: one inherited from
    # the environment would make a single gateway keep (or fail on) files of another run
    os.environ.pop(MULTIPROC_ENV, None)
    sock = bind(args.host, args.port)
    if args.workers == 1:
        serve(args, sock, log)
        return
    code = run_workers(args.workers, lambda: serve(args, sock, log), sock, log)
    log.info("stopped", workers=args.workers, exit_code=code)
    raise SystemExit(code)


def serve(args: argparse.Namespace, sock: socket.socket, log) -> None:
    """Loads the tokenizer and model facts, builds the app and serves ``sock`` until SIGINT/SIGTERM; ``log``: the
    gateway's structlog logger (``common.logs.configure``, inherited by a forked child)."""
    from gateway.app import create_app
    from gateway.replicas import ReplicaSet
    from gateway.settings import GatewaySettings, ModelFacts
    from gateway.tokenizer import GatewayTokenizer

    from common import switch_interval
    switch_s = switch_interval.configure()
    from common import hop_trace
    if (trace := hop_trace.configure("gateway")) is not None:  # CODESERVE_HOP_TRACE=DIR
        log.info("hop_trace", path=trace)
    model_dir = args.model_path.resolve()
    settings = GatewaySettings(
        model_name=args.model_name or model_dir.name,
        model=ModelFacts.from_model_dir(model_dir),
        api_key=args.api_key or None,
        max_body_bytes=args.max_body_bytes,
        max_n=args.max_n,
        health_timeout_s=args.health_timeout,
        request_timeout_s=args.request_timeout,
        probe_interval_s=args.probe_interval,
        probe_timeout_s=args.probe_timeout,
        routing=args.routing,
        route_queued_weight=args.route_queued_weight,
        route_requests_weight=args.route_requests_weight,
        pending_ttl_s=args.pending_ttl,
        load_interval_s=args.load_interval,
        cache_probe_timeout_s=args.cache_probe_timeout,
    )
    tokenizer = GatewayTokenizer.from_file(model_dir)
    replicas = ReplicaSet.build(args.replicas, settings.retry_after_s, settings.probe_interval_s,
                                settings.probe_timeout_s, settings.load_interval_s)
    app = create_app(replicas.replicas[0].client if replicas.single else replicas, tokenizer, settings)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False, loop=args.loop, http=args.http,
                            timeout_graceful_shutdown=args.drain_seconds)
    server = DrainingServer(config, [r.client for r in replicas.replicas], settings.retry_after_s)
    log.info("serving", switch_interval_s=switch_s, host=args.host, port=port, url=f"http://{args.host}:{port}",
             scheduler=replicas.replicas[0].spec.scheduler if replicas.single else None,
             replicas=None if replicas.single else [f"{r.name}={r.spec.scheduler},{r.spec.cache},{r.spec.pool}"
                                                    for r in replicas.replicas],
             routing=None if replicas.single else settings.routing,
             model=settings.model_name, auth=settings.api_key is not None, pid=os.getpid())
    # uvicorn handles SIGINT/SIGTERM (graceful shutdown) once it runs, and at its end re-raises the signal to the
    # handler installed before it; this one makes a requested shutdown exit 0, and a signal that arrives before
    # uvicorn takes them over is not lost: the server stops as soon as it has started.
    def stop_early(*_) -> None:
        server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop_early)
    server.run(sockets=[sock])
    log.info("stopped")


class DrainingServer(uvicorn.Server):
    """uvicorn with an explicit end for the requests that outlive the drain: 1 s before the graceful-shutdown
    timeout, the generations still in flight are abandoned with 503 "gateway is shutting down", so a stream ends
    with an error event and [DONE] (instead of a cut connection) and a whole answer is a 503."""

    def __init__(self, config: uvicorn.Config, clients: list[SchedulerClient], retry_after_s: int) -> None:
        super().__init__(config)
        self.clients, self.retry_after_s = clients, retry_after_s

    async def shutdown(self, sockets=None) -> None:
        from gateway.errors import ApiError

        async def abandon_later() -> None:
            await asyncio.sleep(max(0.0, (self.config.timeout_graceful_shutdown or 0) - 1.0))
            for stream in [s for client in self.clients for s in client.streams]:
                stream.abandon(ApiError(503, "gateway is shutting down; retry the request", "service_unavailable",
                                        retry_after_s=self.retry_after_s))

        task = asyncio.ensure_future(abandon_later())
        try:
            await super().shutdown(sockets)
        finally:
            task.cancel()


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0 = a free port). Raises RuntimeError naming the
    address when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on accepted sockets whose
    # proto is IPPROTO_TCP. With Nagle on, a streamed event written while the previous one is unacknowledged
    # waits for the client's delayed ACK (40 ms on Linux): TTFT and ITL of keep-alive clients paid it.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"cannot bind {host}:{port}: {exc} (is another process holding it?)") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


if __name__ == "__main__":
    main()
