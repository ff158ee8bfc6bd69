"""End-to-end serving benchmark: the whole stack (cache, worker, scheduler, gateway as real processes)
driven over HTTP with streaming, side by side with transformers' static-batch ``generate``.

    python -m bench.serve_bench --out DIR [--gpu] [--phases hf,c64,c1,c16,c256,prefix,k1,nooverlap,mixed,nopipe,fixedk,nochain,jit]

``--gpu``: random-weight starcoderbase-1b checkpoint in bfloat16 (``worker_svc.model.default --shape``),
CUDA worker (flashinfer, CUDA-graph decode), 1,024 prompt tokens and 256 output tokens (ignore_eos). Without
it (CPU rehearsal): the default model and small lengths. Phases, in this order (results are written after
each, so a run cut short still leaves data):

- ``hf``: transformers' own paths on the same checkpoint and lengths, each in its own process with a time
  limit (``bench.hf_baseline``, ``--hf-baselines``): static-batch ``generate`` of 64 prompts with a static
  cache + torch.compile (``static_compiled``) and with the default DynamicCache (``static_dynamic_cache``),
  continuous-batching ``generate_batch`` of 64 and 256 requests (``generate_batch_64``/``_256``); and the
  device copy bandwidth. A baseline that fails or runs past ``--hf-timeout`` is recorded with a typed
  error and the others still run; the final table gives our tok/s over each, and over issue 5's
  reference figure (``bench/hf_phase.py``);
- ``cN``: N concurrent streams of fixed lengths (2N requests for N <= 64, N for more; times ``--rounds``: one
  c64 phase of 128 requests lasts ~2 s on the H200 and moves 15-25% between runs, results/h200-run11/call3);
- ``prefix``: TTFT against the cached fraction: prompts of P tokens of which a share f is one of 4 common
  prefixes (warmed first), the rest unique;
- ``k1``: concurrency 64 again with ``--decode-steps 1`` (one decode step per Forward) for comparison.
- ``nooverlap``: concurrency 64 again with the scheduler's ``--no-overlap`` (it waits for each Forward's reply
  before sending the next), same ``--decode-steps``.
- ``nopipe``: concurrency 64 and 256 again with ``--no-chunk-pipeline`` (each extend waits for the reply of the
  one before it).
- ``fixedk``: concurrency 1 and 64 again with ``--no-adaptive-steps`` (every decode Forward K steps, whatever
  arrives).
- ``nochain``: concurrency 64 again with ``--no-chain-admissions`` (an admission drains the decode in flight).
- ``jit``: concurrency 64 and 256 again with the scheduler's ``--overlap-mode just-in-time`` (decode Forward
  N+1 sent when N's reply is in, instead of the default ``queued``: waiting at the worker behind N, arrivals'
  extends inserted ahead of it), same ``--decode-steps``: a same-run comparison of the two overlap designs
  (throughput, TTFT, share of the step outside the worker).

Decode figures come from the scheduler's cumulative ``loop_stats`` log line (decode Forwards, steps, wall
seconds of the decode rounds, the worker's forward seconds): time outside the worker's forward = wall -
forward. The bandwidth limit of a decode step = (weight bytes + KV bytes read) / copy bandwidth. The worker
writes its Forward timeline to ``OUT/forwards.tsv`` (``worker_svc/forward_log.py``); each phase's results hold
``timeline``, the figures of its window (``bench/forward_timeline.py``: the device's busy share, time per kind, the
gaps between Forwards), and the table's ``busy`` column is that share.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

from bench import forward_timeline, hf_phase, loadgen
from common import hop_trace
from launcher.config import StackConfig, commands
from launcher.stack import Stack

ROOT = pathlib.Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(f"[serve_bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Bench:
    def __init__(self, args):
        self.args = args
        self.out = pathlib.Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.forward_log = self.out / "forwards.tsv"  # the worker's Forward timeline (CODESERVE_FORWARD_LOG)
        self.results: dict = {"config": vars(args), "phases": {}}
        self.stack: Stack | None = None
        self.rng = random.Random(0)
        self.sent = 0  # requests built so far (their ids with --hop-trace)
        if args.gpu:
            self.input_len, self.output_len, self.vocab_lo, self.vocab_hi = 1024, 256, 100, 49000
        else:
            self.input_len, self.output_len, self.vocab_lo, self.vocab_hi = args.cpu_input_len, args.cpu_output_len, 100, 1000

    def save(self) -> None:
        (self.out / "serve_bench.json").write_text(json.dumps(self.results, indent=1))

    # ---- set-up --------------------------------------------------------------------------------------
    def model(self) -> str:
        if not self.args.gpu:
            from worker_svc.model.default import ensure_default_model
            return str(ensure_default_model())
        path = pathlib.Path(self.args.model_dir)
        if not (path / "config.json").exists():
            t = time.monotonic()
            subprocess.run([sys.executable, "-m", "worker_svc.model.default", "--shape", self.args.shape, "--dtype",
                            "bfloat16", "--device", "cuda", "--out", str(path)], check=True, cwd=ROOT)
            log(f"checkpoint {self.args.shape} written in {time.monotonic() - t:.1f} s")
        return str(path)

    def start_stack(self, model: str, decode_steps: int) -> None:
        a = self.args
        from worker_svc.forward_log import ENV as FORWARD_LOG_ENV
        self.forward_log.unlink(missing_ok=True)
        os.environ[FORWARD_LOG_ENV] = str(self.forward_log)  # the worker's Forward timeline (each phase's window)
        cfg = StackConfig(model_path=model, http_port=0, cache_port=0, worker_port=0, scheduler_port=0,
                          device="cuda" if a.gpu else "cpu", dtype="bfloat16" if a.gpu else "float32",
                          kv_tokens=a.kv_tokens, chunk_size=a.chunk_size, max_running_requests=a.max_running,
                          max_queued_requests=4096, progress_timeout=120.0)
        self.stack = Stack(cfg, self.out / "logs", model_path=model)
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        argv = commands(self.stack.cfg, model)
        for name in ("cache", "worker", "scheduler", "gateway"):
            extra = (["--decode-steps", str(decode_steps), *a.scheduler_flags.split()] if name == "scheduler"
                     else a.worker_flags.split() if name == "worker" else a.gateway_flags.split() if name == "gateway"
                     else [])
            self.stack.start_one(name, argv[name] + extra, timeout=600)
            log(f"{name} ready after {time.monotonic() - t:.1f} s")
        self.decode_steps = decode_steps

    def variant(self, flags: list[str], suffix: str, concurrencies: tuple[int, ...]) -> None:
        """The fixed-length phases at ``concurrencies`` (named ``c<N>_<suffix>``) with the scheduler restarted
        with ``flags``; the default scheduler is back for the phases after it."""
        self.restart_scheduler(self.decode_steps, flags)
        try:
            for conc in concurrencies:
                self.fixed(conc, f"c{conc}_{suffix}")
        finally:
            self.restart_scheduler(self.decode_steps)

    def restart_scheduler(self, decode_steps: int, extra: list[str] | None = None) -> None:
        self.stack.kill("scheduler", signal.SIGTERM)
        argv = (commands(self.stack.cfg, self.stack.model_path)["scheduler"] + ["--decode-steps", str(decode_steps)]
                + self.args.scheduler_flags.split() + (extra or []))
        self.stack.start_one("scheduler", argv, timeout=120)
        self.decode_steps = decode_steps
        self.wait_gateway()

    def wait_gateway(self) -> None:
        """Until the gateway sees the (new) scheduler: GET /ready is 200 (at most 30 s)."""
        import httpx

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.stack.url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        log("gateway /ready not 200 after 30 s; going on")

    def restart_backend_k1(self) -> None:
        """After a failed multi-step warm-up: fresh worker and scheduler with one decode step per Forward."""
        for name in ("scheduler", "worker"):
            self.stack.kill(name, signal.SIGKILL)
        argv = commands(self.stack.cfg, self.stack.model_path)
        self.stack.start_one("worker", argv["worker"], timeout=600)
        self.stack.start_one("scheduler", argv["scheduler"] + ["--decode-steps", "1"], timeout=120)
        self.decode_steps = 1
        self.wait_gateway()

    # ---- workloads -----------------------------------------------------------------------------------
    def payload(self, ids: list[int], max_new: int) -> dict:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0.0,
                                                      "ignore_eos": True}}
        if self.args.hop_trace:  # an id of ours, so the client's hops join the services' (common/hop_trace.py)
            self.sent += 1
            body["rid"] = f"sb-{self.sent}"
        return body

    def random_ids(self, n: int) -> list[int]:
        return [self.rng.randrange(self.vocab_lo, self.vocab_hi) for _ in range(n)]

    def stats(self) -> dict:
        """The scheduler's latest cumulative loop_stats (waits for a fresh line: logged every 2 s)."""
        time.sleep(2.4)
        path = self.out / "logs" / "scheduler.log"
        for line in reversed(path.read_text(errors="replace").splitlines()):
            if '"loop_stats"' in line:
                return json.loads(line)
        return {}

    def drive(self, name: str, payloads: list[dict], concurrency: int, extra: dict | None = None) -> dict:
        before = self.stats()
        t0 = time.monotonic_ns()
        recs = loadgen.run(self.stack.url, payloads, concurrency, procs=self.args.client_procs)
        t1 = time.monotonic_ns()
        summary = loadgen.summarize(recs)
        after = self.stats()
        d = {k: after.get(k, 0) - before.get(k, 0) for k in (
            "decode_batches", "decode_steps", "decode_wall_seconds", "decode_forward_seconds", "generation_tokens",
            "batches", "decode_alloc_seconds", "decode_rpc_seconds", "decode_process_seconds", "decode_chained",
            "decode_after_extend", "decode_past_extends", "decode_chained_ahead", "decode_dropped")}
        if d["decode_steps"]:
            d["decode_step_ms"] = round(1000 * d["decode_wall_seconds"] / d["decode_steps"], 3)
            d["worker_forward_step_ms"] = round(1000 * d["decode_forward_seconds"] / d["decode_steps"], 3)
            d["outside_worker_share"] = round(1 - d["decode_forward_seconds"] / d["decode_wall_seconds"], 4)
        summary.update(concurrency=concurrency, decode_steps_flag=self.decode_steps, scheduler=d, **(extra or {}))
        fwds = forward_timeline.within(forward_timeline.read(str(self.forward_log)), t0, t1)
        if fwds:  # the device's busy share and the gaps between Forwards in this phase (bench/forward_timeline.py)
            summary["timeline"] = forward_timeline.summarize(fwds)
            summary["timeline"].update(forward_timeline.head_tail(fwds, [(r.sent, r.done) for r in recs if not r.error]))
        self.results["phases"][name] = summary
        self.save()
        tl = {k: round(v, 1) if k.endswith("_ms") else round(v, 3) for k, v in summary.get("timeline", {}).items()
              if k in ("head_ms", "tail_ms", "wall_ms", "busy_share")}
        log(f"{name}: {json.dumps({k: summary.get(k) for k in ('ok', 'errors', 'output_tok_s', 'ttft_p50_ms', 'itl_p50_ms', 'tpot_p50_ms')})} "
            f"timeline {json.dumps(tl)} scheduler {json.dumps(d)}")
        if summary.get("errors"):
            log(f"{name}: first error {summary.get('first_error')}")
        return summary

    def fixed(self, concurrency: int, name: str | None = None) -> dict:
        n = (2 * concurrency if concurrency <= 64 else concurrency) * self.args.rounds
        if concurrency == 1:
            n = self.args.c1_requests
        payloads = [self.payload(self.random_ids(self.input_len), self.output_len) for _ in range(n)]
        return self.drive(name or f"c{concurrency}", payloads, concurrency,
                          {"input_len": self.input_len, "output_len": self.output_len})

    def warmup(self) -> bool:
        payloads = [self.payload(self.random_ids(self.input_len), 32) for _ in range(8)]
        recs = loadgen.run(self.stack.url, payloads, 8, procs=1)
        errs = [r.error for r in recs if r.error or r.tokens != 32]
        if errs:
            log(f"warm-up failed with --decode-steps {self.decode_steps}: {errs[:2]}")
        return not errs

    def prefix(self) -> None:
        a = self.args
        total, out_len = (2048, 16) if a.gpu else (256, 8)
        curve = []
        for frac in (float(x) for x in a.prefix_fractions.split(",")):
            shared = int(total * frac)
            prefixes = [self.random_ids(shared) for _ in range(4)]
            if shared:  # warm the 4 prefixes (their KV is cached after these finish)
                loadgen.run(self.stack.url, [self.payload(p + self.random_ids(8), 1) for p in prefixes], 4)
            payloads = [self.payload(prefixes[i % 4] + self.random_ids(total - shared), out_len) for i in range(32)]
            s = self.drive(f"prefix_f{frac}", payloads, 8, {"prompt_len": total, "shared_fraction": frac})
            curve.append({"shared_fraction": frac, "cached_fraction": round(s.get("cached_tokens_mean", 0) / total, 3),
                          "ttft_p50_ms": s.get("ttft_p50_ms"), "ttft_p99_ms": s.get("ttft_p99_ms")})
        self.results["prefix_curve"] = curve
        self.save()

    def hf(self, model: str) -> None:
        """The transformers baselines (``bench.hf_phase.run_baselines``); results["hf"] is saved after each."""
        a = self.args
        self.results["hf"] = {"reference_tok_s": hf_phase.HF_REFERENCE_TOK_S, "baselines": {}}
        hf_phase.run_baselines(self.results["hf"], a.hf_baselines.split(","), model=model, out=self.out,
                               input_len=self.input_len, output_len=self.output_len, hf_batch=a.hf_batch,
                               gpu=a.gpu, timeout=a.hf_timeout, on_result=lambda: self.save(), log=log)

    # ---- derived figures -------------------------------------------------------------------------------
    def derive(self) -> None:
        r, hf = self.results, self.results.get("hf")
        if hf:
            for ph in r["phases"].values():
                if ph.get("ok"):
                    ph["over_hf"] = hf_phase.over_baselines(ph["output_tok_s"], hf)
        if hf and "copy_bandwidth_Bps" in hf:
            bw, wbytes = hf["copy_bandwidth_Bps"], hf["param_bytes"]
            kv_bytes = self.kv_bytes_per_token
            for name, ph in r["phases"].items():
                sch = ph.get("scheduler", {})
                if sch.get("decode_steps") and kv_bytes and not name.startswith("prefix"):
                    b = ph["concurrency"]
                    ctx = ph.get("input_len", 0) + ph.get("output_len", 0) / 2
                    limit_ms = 1000 * (wbytes + b * ctx * kv_bytes) / bw  # bytes read / copy bandwidth (read + write)
                    sch["bandwidth_limit_step_ms"] = round(limit_ms, 3)
                    sch["step_over_limit"] = round(sch["decode_step_ms"] / limit_ms, 2)
                    sch["worker_step_over_limit"] = round(sch["worker_forward_step_ms"] / limit_ms, 2)
        self.save()

    def table(self) -> str:
        rows = [f"{'phase':<14}{'ok':>5}{'tok/s':>10}{'xHF':>6}{'TTFT p50':>10}{'p99':>9}{'ITL p50':>9}{'p99':>8}"
                f"{'TPOT p50':>9}{'p99':>8}{'step ms':>9}{'fwd ms':>8}{'outside':>8}{'x limit':>8}{'busy':>6}"]
        for name, p in self.results["phases"].items():
            s = p.get("scheduler", {})
            f = lambda k, d=p: d.get(k, float("nan"))  # noqa: E731
            rows.append(f"{name:<14}{p.get('ok', 0):>5}{f('output_tok_s'):>10.1f}"
                        f"{(p.get('over_hf') or {}).get('static_compiled') or float('nan'):>6.2f}"
                        f"{f('ttft_p50_ms'):>10.1f}{f('ttft_p99_ms'):>9.1f}{f('itl_p50_ms'):>9.2f}{f('itl_p99_ms'):>8.1f}"
                        f"{f('tpot_p50_ms'):>9.2f}{f('tpot_p99_ms'):>8.2f}{f('decode_step_ms', s):>9.2f}"
                        f"{f('worker_forward_step_ms', s):>8.2f}{f('outside_worker_share', s):>8.3f}{f('step_over_limit', s):>8.2f}"
                        f"{f('busy_share', p.get('timeline', {})):>6.3f}")
        hf = self.results.get("hf")
        if hf:
            rows += hf_phase.hf_table(hf, self.results["phases"])
        for c in self.results.get("prefix_curve", []):
            rows.append(f"prefix: shared {c['shared_fraction']:.2f} cached {c['cached_fraction']:.3f} "
                        f"TTFT p50 {c['ttft_p50_ms']} ms p99 {c['ttft_p99_ms']} ms")
        return "\n".join(rows)

    def guard(self, name: str, fn) -> None:
        """Runs one phase; a failure is recorded in the results (``phase_errors``) and the next phase runs."""
        try:
            fn()
        except Exception as exc:  # a benchmark phase that failed is reported, never silently dropped
            log(f"phase {name} failed: {type(exc).__name__}: {exc}")
            self.results.setdefault("phase_errors", {})[name] = f"{type(exc).__name__}: {exc}"[:2000]
            self.save()

    def run(self) -> None:
        a = self.args
        phases = a.phases.split(",")
        model = self.model()
        if a.hf_from:  # the baselines of an earlier `--phases hf` run (same machine), for the ratios
            if "hf" in phases:
                raise ValueError("--hf-from and the hf phase both give the baselines: use one")
            self.results["hf"] = {**json.loads(pathlib.Path(a.hf_from).read_text())["hf"], "loaded_from": a.hf_from}
        if "hf" in phases:
            self.guard("hf", lambda: self.hf(model))
            if phases == ["hf"]:  # the transformers baselines alone: no stack
                print(self.table(), flush=True)
                (self.out / "serve_bench_table.txt").write_text(self.table() + "\n")
                return
        self.start_stack(model, a.decode_steps)
        info = json.loads(subprocess.run([sys.executable, "-c", "import json,grpc;from codeserve.v1 import worker_pb2,"
                                          "worker_pb2_grpc as g;from google.protobuf.json_format import MessageToDict as d;"
                                          f"print(json.dumps(d(g.WorkerStub(grpc.insecure_channel('{self.stack.target('worker')}'))"
                                          ".Info(worker_pb2.InfoRequest()))))"],
                                         capture_output=True, text=True, check=True, cwd=ROOT).stdout)
        self.results["worker_info"] = info
        self.kv_bytes_per_token = int(info.get("kvBytesPerToken", 0))
        if not self.warmup():
            if a.decode_steps == 1:
                raise RuntimeError("warm-up failed with one decode step per Forward")
            self.results["multistep_failed"] = True
            self.restart_backend_k1()
            if not self.warmup():
                raise RuntimeError("warm-up failed with one decode step per Forward")
        for ph in phases:
            if ph.startswith("c") and ph[1:].isdigit():
                self.guard(ph, lambda: self.fixed(int(ph[1:])))
            elif ph == "prefix":
                self.guard(ph, self.prefix)
            elif ph == "k1" and self.decode_steps != 1:
                self.guard(ph, lambda: (self.restart_scheduler(1), self.fixed(64, "c64_k1")))
            elif ph == "nooverlap":  # same K, the scheduler waits for each Forward before the next; then back
                self.guard(ph, lambda: self.variant(["--no-overlap"], "nooverlap", (64,)))
            elif ph == "mixed":  # same K, decoding requests ride in extend batches (mixed chunks); then back
                self.guard(ph, lambda: self.variant(["--mixed-chunk"], "mixed", (64, 256)))
            elif ph == "nopipe":  # same K, each extend waits for the reply of the one before (chunk pipeline off)
                self.guard(ph, lambda: self.variant(["--no-chunk-pipeline"], "nopipe", (64, 256)))
            elif ph == "fixedk":  # same K in every decode Forward, arrivals or not (adaptive steps off)
                self.guard(ph, lambda: self.variant(["--no-adaptive-steps"], "fixedk", (1, 64)))
            elif ph == "nochain":  # an admission drains the decode in flight first (the chain's admissions off)
                self.guard(ph, lambda: self.variant(["--no-chain-admissions"], "nochain", (64,)))
            elif ph == "jit":  # same K, N+1 sent when N's reply is in (the default queues it behind N); then back
                self.guard(ph, lambda: self.variant(["--overlap-mode", "just-in-time"], "jit", (64, 256)))
            self.derive()
        print(self.table(), flush=True)
        (self.out / "serve_bench_table.txt").write_text(self.table() + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for JSON results and service logs")
    ap.add_argument("--gpu", action="store_true", help="CUDA worker, starcoderbase-1b shape, bf16, 1024 in / 256 out")
    ap.add_argument("--shape", default="starcoderbase-1b")
    ap.add_argument("--model-dir", default="/tmp/codeserve-bench-model")
    ap.add_argument("--phases", default="hf,c64,c1,c16,c256,prefix,k1")
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--kv-tokens", type=int, default=None)
    ap.add_argument("--chunk-size", type=int, default=None)
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--client-procs", type=int, default=None)
    ap.add_argument("--hf-batch", type=int, default=64, help="prompts in the static-batch generate baselines")
    ap.add_argument("--hf-baselines", default=",".join(hf_phase.HF_BASELINES),
                    help=f"transformers baselines of the hf phase, in order (of {', '.join(hf_phase.HF_BASELINES)})")
    ap.add_argument("--hf-timeout", type=float, default=240.0, help="seconds each hf baseline process may run")
    ap.add_argument("--hf-from", default=None, help="serve_bench.json of an earlier --phases hf run on this machine: "
                    "its baselines give the ratios (to run the hf phase and the stack as two commands)")
    ap.add_argument("--worker-flags", default="", help="extra worker flags, space-separated (e.g. --no-extend-whole-graph)")
    ap.add_argument("--gateway-flags", default="", help="extra gateway flags, space-separated (e.g. --loop uvloop)")
    ap.add_argument("--scheduler-flags", default="", help="extra scheduler flags, space-separated (e.g. "
                    "--no-deliver-after-send)")
    ap.add_argument("--c1-requests", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="cN phases (N > 1) send this many times their requests "
                    "(longer phases for an A/B)")
    ap.add_argument("--prefix-fractions", default="0,0.5,0.75,0.9,0.97", help="shared shares of the prompt (prefix phase)")
    ap.add_argument("--hop-trace", default=None, help="trace every request's hops, the client's included, into this "
                    "directory (common/hop_trace.py; python -m bench.hop_report DIR --last client_done)")
    ap.add_argument("--cpu-input-len", type=int, default=64)
    ap.add_argument("--cpu-output-len", type=int, default=16)
    args = ap.parse_args(argv)
    if args.kv_tokens is None:
        args.kv_tokens = 800_000 if args.gpu else 65_536
    if args.chunk_size is None:
        args.chunk_size = 8192 if args.gpu else 512
    if args.client_procs is None:
        args.client_procs = 8 if args.gpu else 1
    if args.hop_trace:  # the services inherit it; the client processes open their own files (bench/loadgen.py)
        os.environ[hop_trace.ENV] = str(pathlib.Path(args.hop_trace).resolve())
        hop_trace.configure("client")
    bench = Bench(args)
    try:
        bench.run()
    finally:
        if bench.stack is not None:
            bench.stack.stop()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
