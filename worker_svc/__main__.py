"""``python -m worker_svc --listen HOST:PORT --model-path DIR [...]``: serves codeserve.v1.Worker.

Loads the model, allocates the KV pool, warms the attention kernels, then serves; health
(grpc.health.v1) turns SERVING and a JSON log line ``{"event": "serving", "port": ...}`` is printed.
SIGTERM/SIGINT: NOT_SERVING, drain for a moment, exit 0. The epoch (boot id) is a fresh uuid4 per start.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
import threading

DRAIN_SECONDS = 2.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m worker_svc", description="codeserve GPTBigCode worker")
    ap.add_argument("--listen", default="127.0.0.1:50052", help="host:port to bind (port 0 = any free port)")
    ap.add_argument("--model-path", required=True, help="Hugging Face GPTBigCode checkpoint directory")
    ap.add_argument("--device", default="auto", type=device_name, help="cpu, cuda, cuda:N or auto")
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
    ap.add_argument("--extend-graph-max-tokens", type=int, default=1024,
                    help="other batches of up to this many tokens replay piecewise CUDA graphs, attention eager "
                         "between them (flashinfer on CUDA only; 0 = off)")
    ap.add_argument("--extend-whole-graph", action=argparse.BooleanOptionalAction, default=True,
                    help="extends of one request up to --extend-graph-max-tokens tokens replay one CUDA graph of the "
                         "whole forward, flashinfer's attention inside it (flashinfer on CUDA only; default on: H200 run 11 "
                         "measured 1.2-1.3 ms off each extend; --no-extend-whole-graph: piecewise graphs)")
    ap.add_argument("--ragged-prefill", action=argparse.BooleanOptionalAction, default=True,
                    help="extends that run eagerly (above --extend-graph-max-tokens) and whose requests have no cached "
                         "prefix read K/V straight from the projection output with flashinfer's ragged prefill "
                         "instead of gathering them from the pool (flashinfer on CUDA only; --no-ragged-prefill: the "
                         "paged prefill for every extend)")
    ap.add_argument("--prepare-ahead", action=argparse.BooleanOptionalAction, default=True,
                    help="a multi-step decode Forward sent while the one it follows is on the device builds its step "
                         "metadata then, not after that one's commit (worker_svc/multistep.py: Prepared; "
                         "--no-prepare-ahead: built at its launch, for the A/B)")
    ap.add_argument("--launch-behind", action=argparse.BooleanOptionalAction, default=True,
                    help="such a Forward is also launched behind the one it follows on the device, when the device "
                         "reaches that one's step --launch-lead-steps from its end, before its commit (worker_svc/engine.py: _launch_behind; "
                         "on CUDA when every step replays a decode graph; needs --prepare-ahead; --no-launch-behind for the A/B)")
    ap.add_argument("--launch-lead-steps", type=int, default=1,
                    help="a Forward launched behind another starts its launch when the device starts the step this "
                         "many from that one's end (1, default: its last step). 2: a 256-row launch (~3-4 ms of host "
                         "work on the H100 host, a step ~3.3 ms) ends before the one ahead does (H100, session 29: c256 "
                         "decode gaps -50 ms a phase), but an arrival's extend reaching the worker in that step waits for "
                         "the whole Forward launched behind (c64 -1.1k tok/s, TTFT p50 +40 ms). 0: 2 for Forwards of "
                         "more than 64 rows, 1 for the others (worker_svc/multistep.py: lead_steps; H100 session 33, one run: c64 "
                         "17,934 / c256 24,842 against 18,423 / 29,141 tok/s at 1)")
    ap.add_argument("--hold-commit-ms", type=float, default=0.0,
                    help="a multi-step Forward's commit waits up to this long for a Forward that arrived to launch "
                         "behind it and is still preparing, so that one launches behind it rather than at its turn "
                         "after the commit (worker_svc/pending.py; 0, default: off, until a GPU run measures it)")
    ap.add_argument("--switch-interval-us", type=float, default=None,
                    help="this process's thread switch interval in microseconds (over CODESERVE_SWITCH_INTERVAL_US, "
                         "which sets every service's; unset: CPython's 5 ms): common/switch_interval.py")
    ap.add_argument("--extend-ahead", action=argparse.BooleanOptionalAction, default=True,
                    help="an eager extend whose items bring their prefixes (fresh prompts) or continue a prompt "
                         "(launched behind only) is validated, laid out and "
                         "copied to the device when it arrives, while the Forward ahead of it runs, not at its turn "
                         "(worker_svc/extend_ahead.py; --no-extend-ahead: at its turn, for the A/B)")
    ap.add_argument("--extend-behind", action=argparse.BooleanOptionalAction, default=True,
                    help="such an extend that follows another one still on the device is launched behind it, before "
                         "that one's read-back and commit (worker_svc/extend_behind.py; needs --extend-ahead; "
                         "--no-extend-behind: at its turn, for the A/B)")
    ap.add_argument("--splitk-rows", type=int, default=None,
                    help="CUDA, float16 / bfloat16 models: projections of batches up to this many rows through the split-K Triton GEMM "
                         "(worker_svc/model/skinny_gemm.py; 0 = cuBLAS for all; default: 16 for models of "
                         "n_embd <= 1024, else 0, as measured on the H200)")
    ap.add_argument("--resident-rows", type=int, default=None,
                    help="CUDA, float16 / bfloat16 models: projections of batches up to this many rows (at most 4) "
                         "through the resident-weight Triton kernel, whose CTAs read their weights before the kernel "
                         "ahead ends (worker_svc/model/resident_gemv.py; 0 = off; default: build.auto_resident_rows)")
    ap.add_argument("--resident-mm-rows", type=int, default=None,
                    help="CUDA, float16 / bfloat16 models: the small projections (16 MB or less) of batches above "
                         "--resident-rows up to this many rows (at most 64) through the resident-weight tensor-core "
                         "Triton GEMM (worker_svc/model/resident_gemm.py; 0 = off; default: build.auto_resident_mm_rows)")
    ap.add_argument("--decode-attention", default="auto", choices=["auto", "flashinfer", "triton"],
                    help="the decode CUDA graphs' attention: flashinfer's tensor-core decode, or the Triton multi-query "
                         "kernel (worker_svc/attention/mqa_decode.py; no per-step plan); auto (default): triton for "
                         "every bucket of multi-query models of n_embd <= 1024, for buckets up to 64 rows up to n_embd "
                         "2048, flashinfer above, as measured on the H200 (worker_svc/build.py: triton_decode_max_batch)")
    ap.add_argument("--extend-attention", default="auto", choices=["auto", "fa2", "fa3"],
                    help="flashinfer's paged prefill implementation in the whole extend graphs (one request's extend "
                         "over its cached prefix): fa2 (the KV split over CTAs in graph mode), fa3 (on sm90: one CTA "
                         "per query tile, the KV not split); auto (default): fa2 for buckets up to 128 tokens, "
                         "flashinfer's choice above, as measured on the H200 (extend_whole_graph.prefill_backend_for)")
    ap.add_argument("--pdl", action=argparse.BooleanOptionalAction, default=True,
                    help="CUDA: the Triton kernels as programmatic dependent launches (--no-pdl: plain launches)")
    args = ap.parse_args(argv)
    check_ranges(ap, args)
    return args


def device_name(text: str) -> str:
    """``--device``'s value: cpu, cuda, cuda:N or auto; anything else is a usage error (argparse names the flag)."""
    if not re.fullmatch(r"cpu|auto|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda, cuda:N or auto (got {text!r})")
    return text


def check_ranges(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (exit 2) naming the flag for a value out of its range: --page-size >= 1, --kv-tokens >= the
    page size (the pool holds one whole page besides the reserved one), --kv-fraction finite in (0, 1],
    --cuda-graph-max-batch and --extend-graph-max-tokens >= 0, --seed within torch's seed range [-2**63, 2**64). Imports nothing heavy: the
    launcher checks its settings with this parser before it starts anything."""
    if args.page_size < 1:
        ap.error(f"--page-size must be >= 1 (got {args.page_size})")
    if args.kv_tokens is not None and args.kv_tokens < args.page_size:
        ap.error(f"--kv-tokens must be >= the page size {args.page_size} (got {args.kv_tokens})")
    if args.kv_fraction is not None and not (math.isfinite(args.kv_fraction) and 0 < args.kv_fraction <= 1):
        ap.error(f"--kv-fraction must be in (0, 1] (got {args.kv_fraction})")
    if args.cuda_graph_max_batch < 0:
        ap.error(f"--cuda-graph-max-batch must be >= 0 (got {args.cuda_graph_max_batch})")
    if args.extend_graph_max_tokens < 0:
        ap.error(f"--extend-graph-max-tokens must be >= 0 (got {args.extend_graph_max_tokens})")
    if args.splitk_rows is not None and not 0 <= args.splitk_rows <= 256:
        ap.error(f"--splitk-rows must be in [0, 256] (got {args.splitk_rows})")
    if args.resident_rows is not None and not 0 <= args.resident_rows <= 4:
        ap.error(f"--resident-rows must be in [0, 4] (got {args.resident_rows})")
    if args.resident_mm_rows is not None and not 0 <= args.resident_mm_rows <= 64:
        ap.error(f"--resident-mm-rows must be in [0, 64] (got {args.resident_mm_rows})")
    if not -2**63 <= args.seed < 2**64:
        ap.error(f"--seed must be in [-2**63, 2**64) (got {args.seed})")
    if args.launch_lead_steps < 0:
        ap.error(f"--launch-lead-steps must be >= 0 (got {args.launch_lead_steps})")
    if not 0 <= args.hold_commit_ms <= 1000:
        ap.error(f"--hold-commit-ms must be in [0, 1000] (got {args.hold_commit_ms})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from common import grpc_server, logs
    from worker_svc.build import WorkerOptions, build_engine
    from worker_svc.service import SERVICE_NAME, add_to_server

    log = logs.configure("worker")
    from common import switch_interval
    switch_s = switch_interval.configure(args.switch_interval_us)
    from common import hop_trace
    if (trace := hop_trace.configure("worker")) is not None:  # CODESERVE_HOP_TRACE=DIR
        log.info("hop_trace", path=trace)
    opts = WorkerOptions(model_path=args.model_path, device=args.device, dtype=args.dtype, kv_tokens=args.kv_tokens,
                         kv_fraction=args.kv_fraction, page_size=args.page_size, attention=args.attention,
                         worker_id=args.worker_id, seed=args.seed, cuda_graph_max_batch=args.cuda_graph_max_batch,
                         extend_graph_max_tokens=args.extend_graph_max_tokens, splitk_rows=args.splitk_rows,
                         resident_rows=args.resident_rows, resident_mm_rows=args.resident_mm_rows, pdl=args.pdl, decode_attention=args.decode_attention, extend_attention=args.extend_attention,
                         extend_whole_graph=args.extend_whole_graph, ragged_prefill=args.ragged_prefill,
                         prepare_ahead=args.prepare_ahead, launch_behind=args.launch_behind,
                         launch_lead_steps=args.launch_lead_steps, hold_commit_ms=args.hold_commit_ms,
                         extend_ahead=args.extend_ahead, extend_behind=args.extend_behind)
    log.info("loading", model_path=args.model_path, device=args.device, dtype=args.dtype)
    engine = build_engine(opts)
    info = engine.info()
    from common import gc_pauses
    gc_pauses.PauseLog("worker").install()  # collections >= 10 ms logged (none seen while serving: session 29)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    # before the server reports SERVING: a SIGTERM right after "serving" must drain, not kill (seen: rc -15
    # in tests/worker/test_service.py::test_cli_serves_and_stops_on_sigterm under load)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    from worker_svc.forward_log import ENV as FORWARD_LOG_ENV, DeviceOrigin, ForwardLog
    forward_log = None
    if path := os.environ.get(FORWARD_LOG_ENV):  # CODESERVE_FORWARD_LOG=PATH: the Forward timeline
        forward_log = ForwardLog(path)
        engine.origin = DeviceOrigin(engine.device)
        log.info("forward_log", path=path)
    running = grpc_server.start(lambda s: add_to_server(engine, s, log, forward_log), [SERVICE_NAME], args.listen)
    log.info("serving", switch_interval_s=switch_s, port=running.port, **{k: v for k, v in info.__dict__.items()})
    stop.wait()
    running.set_serving(False, ["", SERVICE_NAME])
    log.info("draining", seconds=DRAIN_SECONDS)
    running.server.stop(grace=DRAIN_SECONDS).wait()
    lingering = grpc_server.lingering_threads(running, seconds=3.0)
    log.info("stopped")
    if lingering:  # a handler still inside a Forward after the drain: say which, then exit all the same
        log.error("lingering_threads", threads=lingering)
    # Exit without the interpreter's teardown: its C++ static destructors (torch's thread pools, gRPC's core) can
    # race threads that are still winding down and abort the process ("terminate called without an active
    # exception", rc -6 after "stopped": tests/reliability/test_drain.py in a fresh-clone CI run). Every file this
    # process writes (logs, the Forward timeline, hop marks) is written a line at a time.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
