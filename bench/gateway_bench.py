"""The gateway's own cost per streamed request: the real gateway process between our load generator and a paced
stand-in for the scheduler, its CPU seconds per request read from /proc.

At c64 on the GPU (1,024 in / 256 out) the gateway takes every request's body and streams ~33 events per request
from one Python process; at a wave boundary 64 streams end and 64 requests arrive at once, and run 21's hop trace
measured client_sent -> http_in p50 67 ms there (bench/README.md, run 21). This bench isolates that process: the
stand-in (``PacedScheduler``, a subclass of the gateway tests' fake) answers each Generate with the first token
after ``--first-ms`` and then ``--tokens-per-message`` tokens on a shared clock tick of ``--tick-ms`` (all streams
at once, as a multi-step decode Forward delivers them), so the load's shape is the real one and nothing but the
gateway and the client does work.

    python -m bench.gateway_bench [--requests 128] [--concurrency 16] [--prompt 1024] [--output 256]
        [--flags FLAGS] [--baseline-ref REF | --baseline-flags FLAGS] [--rounds 2] [--out bench/results/cpu-gateway]

``--baseline-ref``: the gateway of that git revision (a worktree under /tmp) runs the same load in the same run,
alternated with this checkout's ``--rounds`` times; the ratio of CPU per request is printed. ``--baseline-flags``:
the baseline is this checkout's gateway with those extra flags (``--loop uvloop --http httptools``); ``--flags``: the
extra flags of this checkout's arm (``--workers 2``: the CPU is summed over the forked children). Writes
OUT/gateway_bench.json. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def serve_paced(tokenizer_path: str, tick_s: float, per_message: int, first_s: float) -> None:
    """Runs the paced stand-in on a free port (printed on stdout) until killed."""
    from codeserve.v1 import scheduler_pb2, scheduler_pb2_grpc
    from common.grpc_server import start
    from gateway.tokenizer import GatewayTokenizer
    from tests.gateway.fake_scheduler import FakeScheduler

    class PacedScheduler(FakeScheduler):
        """Generate: the first token after ``first_s``, then ``per_message`` tokens a tick of ``tick_s``."""

        def _generate(self, request, ids, context, ended):
            n = request.max_new_tokens
            toks = [100 + i % 200 for i in range(n)]
            ended.wait(first_s)
            yield scheduler_pb2.GenerateResponse(request_id=request.request_id, prompt_tokens=len(ids),
                                                  token_ids=toks[:1], text=self.tokenizer.decode(toks[:1]))
            sent = 1
            while sent < n:
                now = time.monotonic()
                ended.wait((int(now / tick_s) + 1) * tick_s - now)
                if not context.is_active():
                    return
                chunk = toks[sent:sent + per_message]
                msg = scheduler_pb2.GenerateResponse(request_id=request.request_id, token_ids=chunk,
                                                     text=self.tokenizer.decode(chunk))
                sent += len(chunk)
                if sent >= n:
                    msg.finish_reason, msg.completion_tokens = "length", n
                yield msg

    fake = PacedScheduler(GatewayTokenizer.from_file(tokenizer_path), 1 << 20)
    running = start(lambda s: scheduler_pb2_grpc.add_SchedulerServicer_to_server(fake, s), ["codeserve.v1.Scheduler"],
                    "127.0.0.1:0", max_workers=1024)
    print(running.port, flush=True)
    threading.Event().wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds so far of a process and its children that are alive (a gateway of ``--workers``:
    the parent and its forked children; /proc/PID/stat fields 14 and 15, /proc/PID/task/PID/children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return own + sum(cpu_seconds(int(k)) for k in kids)


def one_round(src: Path, flags: list[str], model: Path, sched_port: int, payloads: list[dict], concurrency: int,
              procs: int, port: int) -> dict:
    """Starts the gateway of checkout ``src`` with the extra command-line ``flags``, runs the load, stops it; returns
    its CPU per request and the load's summary."""
    import httpx

    from bench import loadgen

    env = {**os.environ, "PYTHONPATH": str(src)}
    gw = subprocess.Popen([sys.executable, "-m", "gateway", "--scheduler", f"127.0.0.1:{sched_port}",
                           "--model-path", str(model), "--port", str(port), "--log-level", "warning", *flags],
                          cwd=src, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline or gw.poll() is not None:
                    raise RuntimeError(f"the gateway of {src} did not start")
                time.sleep(0.1)
        loadgen.run(url, payloads[:concurrency], concurrency, procs=procs)  # warm-up: imports, first requests
        c0, t0 = cpu_seconds(gw.pid), time.monotonic()
        records = loadgen.run(url, payloads, concurrency, procs=procs)
        c1, t1 = cpu_seconds(gw.pid), time.monotonic()
    finally:
        gw.terminate()
        gw.wait(10)
    s = loadgen.summarize(records)
    if s["errors"]:
        raise RuntimeError(f"{s['errors']} requests failed: {[r.error for r in records if r.error][:3]}")
    return {"cpu_ms_per_request": (c1 - c0) / len(payloads) * 1e3, "gateway_busy": (c1 - c0) / (t1 - t0),
            "wall_s": t1 - t0, **{k: s[k] for k in ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--procs", type=int, default=1, help="client processes")
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens (input_ids)")
    ap.add_argument("--output", type=int, default=256, help="output tokens (ignore_eos)")
    ap.add_argument("--tick-ms", type=float, default=17.0, help="one decode Forward of the stand-in")
    ap.add_argument("--tokens-per-message", type=int, default=8, help="decode steps per Forward")
    ap.add_argument("--first-ms", type=float, default=30.0, help="the stand-in's time to first token")
    ap.add_argument("--baseline-ref", default=None, help="a git revision whose gateway runs the same load")
    ap.add_argument("--baseline-flags", default=None,
                    help="the baseline arm: this checkout's gateway with these extra flags (e.g. '--loop uvloop "
                         "--http httptools'); excludes --baseline-ref")
    ap.add_argument("--flags", default="", help="extra flags of this checkout's gateway (e.g. '--workers 2')")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/cpu-gateway")
    ap.add_argument("--serve-paced", nargs=4, metavar=("TOKENIZER", "TICK_S", "PER_MESSAGE", "FIRST_S"),
                    help=argparse.SUPPRESS)  # the stand-in's own process
    args = ap.parse_args()
    if args.baseline_ref and args.baseline_flags is not None:
        ap.error("--baseline-ref and --baseline-flags exclude each other")
    if args.serve_paced:
        tok, tick, per, first = args.serve_paced
        serve_paced(tok, float(tick), int(per), float(first))
        return
    from worker_svc.model.default import ensure_default_model

    model = Path(ensure_default_model())
    sched = subprocess.Popen([sys.executable, "-m", "bench.gateway_bench", "--serve-paced", str(model / "tokenizer.json"),
                              str(args.tick_ms / 1e3), str(args.tokens_per_message), str(args.first_ms / 1e3)],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    arms = {"this": (ROOT, shlex.split(args.flags))}
    if args.baseline_flags is not None:
        arms["baseline"] = (ROOT, shlex.split(args.baseline_flags))
    if args.baseline_ref:
        wt = Path(f"/tmp/codeserve-gateway-bench-{args.baseline_ref.replace('/', '_')}")
        if not wt.exists():
            subprocess.run(["git", "worktree", "add", "--detach", str(wt), args.baseline_ref], cwd=ROOT, check=True,
                           capture_output=True)
        arms["baseline"] = (wt, [])
    try:
        port = int(sched.stdout.readline())
        rng = random.Random(0)
        payloads = [{"input_ids": [rng.randrange(5, 400) for _ in range(args.prompt)],
                     "sampling_params": {"max_new_tokens": args.output, "temperature": 0.0, "ignore_eos": True}}
                    for _ in range(args.requests)]
        rows = []
        for r in range(args.rounds):
            for name, (src, flags) in arms.items():
                row = {"arm": name, "round": r, **one_round(src, flags, model, port, payloads, args.concurrency,
                                                             args.procs, 18777)}
                rows.append(row)
                print(f"{name:8s} round {r}: gateway CPU {row['cpu_ms_per_request']:6.2f} ms a request, busy "
                      f"{row['gateway_busy']:.0%}, TTFT p50 {row['ttft_p50_ms']:.1f} ms, {row['output_tok_s']:.0f} tok/s",
                      flush=True)
    finally:
        sched.terminate()
        sched.wait(10)
    mean = {a: sum(r["cpu_ms_per_request"] for r in rows if r["arm"] == a) / args.rounds for a in arms}
    if "baseline" in mean:
        base = args.baseline_ref or args.baseline_flags
        print(f"CPU per request: this {mean['this']:.2f} ms, baseline ({base}) {mean['baseline']:.2f} ms, "
              f"x{mean['baseline'] / mean['this']:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gateway_bench.json").write_text(json.dumps({"args": {k: v for k, v in vars(args).items()
                                                                       if k not in ("out", "serve_paced")},
                                                              "rows": rows, "mean_cpu_ms": mean}, indent=1))


if __name__ == "__main__":
    main()
