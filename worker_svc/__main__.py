"""``python -m worker_svc --listen HOST:PORT --model-path DIR [...]``: serves codeserve.v1.Worker.

Loads the model, allocates the KV pool, warms the attention kernels, then serves; health
(grpc.health.v1) turns SERVING and a JSON log line ``{"event": "serving", "port": ...}`` is printed.
SIGTERM/SIGINT: NOT_SERVING, drain for a moment, exit 0. The epoch (boot id) is a fresh uuid4 per start.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from common import grpc_server, logs
from worker_svc.build import WorkerOptions, build_engine
from worker_svc.service import SERVICE_NAME, add_to_server

DRAIN_SECONDS = 2.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m worker_svc", description="codeserve GPTBigCode worker")
    ap.add_argument("--listen", default="127.0.0.1:50052", help="host:port to bind (port 0 = any free port)")
    ap.add_argument("--model-path", required=True, help="Hugging Face GPTBigCode checkpoint directory")
    ap.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    kv = ap.add_mutually_exclusive_group()
    kv.add_argument("--kv-tokens", type=int, default=None, help="KV pool capacity in tokens")
    kv.add_argument("--kv-fraction", type=float, default=None, help="fraction of free device memory after weights")
    ap.add_argument("--page-size", type=int, default=1, help="tokens per page: the cache service's allocation unit (the first page is reserved)")
    ap.add_argument("--attention", default="auto", choices=["auto", "torch", "flashinfer"])
    ap.add_argument("--worker-id", default="worker-0")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generator for unseeded sampling")
    ap.add_argument("--cuda-graph-max-batch", type=int, default=256,
                    help="decode batches up to this size replay CUDA graphs (flashinfer on CUDA only; 0 = off)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = logs.configure("worker")
    opts = WorkerOptions(model_path=args.model_path, device=args.device, dtype=args.dtype, kv_tokens=args.kv_tokens,
                         kv_fraction=args.kv_fraction, page_size=args.page_size, attention=args.attention,
                         worker_id=args.worker_id, seed=args.seed, cuda_graph_max_batch=args.cuda_graph_max_batch)
    log.info("loading", model_path=args.model_path, device=args.device, dtype=args.dtype)
    engine = build_engine(opts)
    info = engine.info()
    running = grpc_server.start(lambda s: add_to_server(engine, s, log), [SERVICE_NAME], args.listen)
    log.info("serving", port=running.port, **{k: v for k, v in info.__dict__.items()})
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stop.wait()
    running.set_serving(False, ["", SERVICE_NAME])
    log.info("draining", seconds=DRAIN_SECONDS)
    running.server.stop(grace=DRAIN_SECONDS).wait()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
