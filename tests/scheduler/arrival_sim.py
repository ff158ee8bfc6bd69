"""TTFT of arrivals against overlapped multi-step decode, with the worker's time simulated (not a test: a
measurement to run by hand; the CPU model's compute would drown what it shows).

    python -m tests.scheduler.arrival_sim [--step-ms 2.3] [--extend-us-per-token 4] [--decode-steps 8]
        [--new 16] [--prompt-len 2048] [--concurrency 8] [--requests 32] [--fractions 0,0.5,0.9,0.97] [--think-ms 0] [--no-overlap]
        [--overlap-mode queued|just-in-time] [--rtt-ms 0] [--background N --probes 40]
        [--chunk-size 8192] [--chunk-pipeline | --no-chunk-pipeline] [--long N] [--json PATH]
        [--background N --rate R --seconds S] [--no-adaptive-steps] [--run-weight 0.25] [--decode-forward-ms 0]
        [--extend-forward-ms 0.3] [--hop-trace DIR] [--typists N --seconds S] [--no-early-match]
        [--no-deliver-after-send] [--message-us 0]

The real scheduler loop (``Scheduler.run`` in a thread) and the real cache service (in-process gRPC server)
drive a simulated worker that runs Forwards one at a time in ``after_seq`` order and sleeps for their
duration: ``step-ms`` per decode step (plus ``decode-forward-ms`` a decode Forward), ``extend-us-per-token``
per computed prompt token (plus ``extend-forward-ms``, 0.3, an extend Forward), answering a fixed token. Defaults are the H200 prefix workload of bench/serve_bench.py (2,048-token
prompts of which a share f is one of 4 common prefixes, 16 output tokens, concurrency 8, K = 8); requests
go straight to the scheduler (no gateway, no HTTP); ``think-ms`` spreads the arrivals (closed-loop clients
otherwise stay in lockstep). Prints TTFT p50/p99 per shared fraction.

``--long N`` (chunked prefill pipelined, ``scheduler_svc/chunk_ahead.py``): N prompts of ``prompt-len`` tokens
(several chunks of ``chunk-size``), 1 output token, first one at a time (TTFT, prefill tokens/s = prompt tokens /
TTFT), then ``concurrency`` clients at once (prefill tokens/s = all prompt tokens / wall); each phase also
reports the simulated worker's busy share (time inside its runs / wall: the rest is the worker idle between
Forwards). ``--json PATH`` writes the settings and the figures.

Probe mode (``--background N``): N long requests decode; steady decode tokens/s is measured over 2 s with no
arrivals, then probes (``prompt-len`` tokens, 1 output token) arrive one at a time (``--probes``, 5-50 ms
apart, closed loop) or, with ``--rate R``, open loop: a Poisson stream of R probes a second for ``--seconds``
(each in its own thread, whatever the others' state: the editor's keystrokes do not wait for answers), with
the background's decode tokens/s measured over the same time. ``--json PATH`` writes the figures.

Typist mode (``--typists N``, the editor workload of bench/editor_bench.py without HTTP and the model): each
typist has a file (``prompt-len`` tokens before the cursor, 100 after it); every 50-150 ms it types 1-2 tokens,
sends a completion of ``--new`` tokens for the file so far (PSM-like: what follows the cursor is recomputed each
time) and aborts the one before it; after 5-15 keystrokes it waits for the last one and pauses 0.3-0.8 s. For
``--seconds``. Prints TTFT p50/p90 of the completions whose first token came before their abort, aborts a second,
and the loop's counters (batches, chained decodes, extends sent ahead).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time

import structlog

from cache_svc.core import CacheCore
from cache_svc.service import SERVICE_NAME as CACHE_SERVICE, CacheServicer
from codeserve.v1 import cache_pb2_grpc, scheduler_pb2, worker_pb2
from common import grpc_server, hop_trace
from scheduler_svc.cache_client import CacheClient
from scheduler_svc.detokenizer import load_tokenizer
from scheduler_svc.output import OutputStream
from scheduler_svc.overlap_mode import DEFAULT_OVERLAP_MODE, OVERLAP_MODES
from scheduler_svc.request import StreamEnd
from scheduler_svc.scheduler import Scheduler, SchedulerConfig
from scheduler_svc.step_budget import RUN_WEIGHT
from scheduler_svc.validate import build_request
from tests.scheduler.fake_worker import LaterReply, forward_response
from worker_svc.model.default import ensure_default_model
from worker_svc.ordering import ForwardOrder

TOKEN = 77


class SimWorker:
    """Runs Forwards one at a time in the worker's real order (``ForwardOrder``: a Forward with after_seq waits
    for that one, one with before_seq is inserted ahead of that one if it has not started), sleeping for their
    duration. ``rtt_s``: the worker-side cost of one asynchronous Forward outside the GPU (half before it can
    run: transfer and parsing, half after: the reply), so hiding it shows."""

    def __init__(self, step_s: float, token_s: float, capacity: int, rtt_s: float = 0.0,
                 decode_forward_s: float = 0.0, extend_forward_s: float = 3e-4) -> None:
        self.step_s, self.token_s, self.capacity, self.rtt_s = step_s, token_s, capacity, rtt_s
        self.decode_forward_s, self.extend_forward_s = decode_forward_s, extend_forward_s
        self.epoch = ""
        self._engine = threading.Lock()
        self.order = ForwardOrder()
        self.busy_s = 0.0  # seconds inside runs (the simulated GPU busy), cumulative
        self.extends: list[int] = []  # the tokens of each extend run, in run order

    def info(self) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(worker_id="sim", epoch="e1", model_name="sim", n_positions=1 << 16, vocab_size=1000,
                                     eos_token_id=0, capacity_tokens=self.capacity, page_size=1,
                                     pool_slots=self.capacity + 1)

    def _run(self, request: worker_pb2.ForwardRequest) -> worker_pb2.ForwardResponse:
        self.order.insert_before(request.seq, request.before_seq, request.after_seq)
        self.order.wait_for(request.after_seq, request.seq)
        with self._engine:
            steps = max([it.decode_steps for it in request.items] + [1])
            tokens = sum(len(it.input_ids) for it in request.items if not it.input_from_last_sample)
            extend = any(it.has_prefix or len(it.input_ids) > 1 for it in request.items)
            t0 = time.perf_counter()
            device_s = tokens * self.token_s if extend else steps * self.step_s  # the steps; the rest is fixed
            time.sleep(device_s + (self.extend_forward_s if extend else self.decode_forward_s))
            reply = forward_response(request.items, TOKEN, forward_seconds=time.perf_counter() - t0,
                                     device_seconds=device_s)
            self.busy_s += reply.forward_seconds
            if extend:
                self.extends.append(tokens)
        self.order.done(request.seq)
        return reply

    def forward(self, items, seq: int = 0):
        return self._run(self.prepare(items, seq))

    def prepare(self, items, seq: int, after_seq: int = 0, before_seq: int = 0) -> worker_pb2.ForwardRequest:
        return worker_pb2.ForwardRequest(expected_epoch=self.epoch, items=items, seq=seq, after_seq=after_seq,
                                         before_seq=before_seq)

    def send(self, request: worker_pb2.ForwardRequest) -> LaterReply:
        pending = LaterReply()

        def serve() -> None:
            time.sleep(self.rtt_s / 2)
            reply = self._run(request)
            time.sleep(self.rtt_s / 2)
            pending.answer(reply)

        threading.Thread(target=serve, daemon=True).start()
        return pending

    def release(self, request_ids) -> int:
        return len(request_ids)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--step-ms", type=float, default=2.3)
    ap.add_argument("--extend-us-per-token", type=float, default=4.0)
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--fractions", default="0,0.5,0.9,0.97")
    ap.add_argument("--think-ms", type=float, default=0.0, help="each client waits uniform [0, think] ms before a request")
    ap.add_argument("--background", type=int, default=0, help="probe mode: this many long requests keep decode "
                    "steady while single probes (prompt-len tokens, 1 output token) arrive one at a time")
    ap.add_argument("--probes", type=int, default=40)
    ap.add_argument("--rate", type=float, default=0.0, help="probe mode: open-loop Poisson arrivals, probes a second "
                    "(0: closed loop, --probes one at a time)")
    ap.add_argument("--seconds", type=float, default=5.0, help="how long the open-loop arrivals (--rate) last")
    ap.add_argument("--json", default="", help="write the figures (and the settings) to this file")
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--adaptive-steps", action=argparse.BooleanOptionalAction, default=True,
                    help="fewer decode steps per Forward while arrivals come (scheduler_svc/step_budget.py)")
    ap.add_argument("--run-weight", type=float, default=RUN_WEIGHT, help="the step budget's RUN_WEIGHT "
                    "(scheduler_svc/step_budget.py), to sweep it")
    ap.add_argument("--extend-forward-ms", type=float, default=0.3, help="fixed cost of an extend Forward at the "
                    "simulated worker (on top of extend-us-per-token per computed token)")
    ap.add_argument("--hop-trace", default="", help="trace each request's hops (common/hop_trace.py) into this "
                    "directory and print the time between them (bench/hop_report.py)")
    ap.add_argument("--decode-forward-ms", type=float, default=0.0, help="fixed cost of a decode Forward at the "
                    "worker on top of its steps (host work, read-back), serial with the GPU time")
    ap.add_argument("--overlap-mode", choices=OVERLAP_MODES, default=DEFAULT_OVERLAP_MODE)
    ap.add_argument("--rtt-ms", type=float, default=0.0, help="worker-side cost of an asynchronous Forward outside "
                    "its run, half before and half after (transfer, parsing, reply)")
    ap.add_argument("--chunk-size", type=int, default=8192)
    ap.add_argument("--arrival-gate", action=argparse.BooleanOptionalAction, default=True,
                    help="scheduler_svc/arrival_gate.py (--no-arrival-gate: every arrival planned at once)")
    ap.add_argument("--chunk-pipeline", action=argparse.BooleanOptionalAction, default=True,
                    help="send a prompt's next chunk (or the next admissions) while the extend before it runs")
    ap.add_argument("--early-match", action=argparse.BooleanOptionalAction, default=True,
                    help="the scheduler's early Match (scheduler_svc/early_match.py)")
    ap.add_argument("--deliver-after-send", action=argparse.BooleanOptionalAction, default=True,
                    help="the scheduler's outbox (scheduler_svc/outbox.py)")
    ap.add_argument("--message-us", type=float, default=0.0, help="Python work (us, GIL held) each stream message costs "
                    "its reader thread besides its serialization (what the servicer thread and gRPC do per message)")
    ap.add_argument("--mixed-chunk", action=argparse.BooleanOptionalAction, default=False,
                    help="decoding requests ride in extend batches (the scheduler's --mixed-chunk)")
    ap.add_argument("--typists", type=int, default=0, help="typist mode: this many simulated typists (module doc)")
    ap.add_argument("--long", type=int, default=0, help="long-prompt mode: this many prompts of prompt-len tokens, "
                    "one at a time, then concurrency at once (TTFT, prefill tokens/s, worker busy share)")
    a = ap.parse_args()
    tok = load_tokenizer(str(ensure_default_model()))
    core = CacheCore(lease_seconds=30.0)
    server = grpc_server.start(lambda s: cache_pb2_grpc.add_CacheServicer_to_server(CacheServicer(core), s),
                               [CACHE_SERVICE], "127.0.0.1:0")
    worker = SimWorker(a.step_ms / 1e3, a.extend_us_per_token / 1e6, capacity=1_000_000, rtt_s=a.rtt_ms / 1e3,
                       decode_forward_s=a.decode_forward_ms / 1e3, extend_forward_s=a.extend_forward_ms / 1e3)
    if a.hop_trace:
        hop_trace.configure("scheduler", a.hop_trace)
    sched = Scheduler(CacheClient(f"127.0.0.1:{server.port}", "default"), worker,
                      SchedulerConfig(decode_steps=a.decode_steps, adaptive_steps=a.adaptive_steps, overlap=a.overlap,
                                      overlap_mode=a.overlap_mode, chunk_size=a.chunk_size, max_running_requests=256,
                                      chunk_pipeline=a.chunk_pipeline, mixed_chunk=a.mixed_chunk,
                                      early_match=a.early_match, deliver_after_send=a.deliver_after_send,
                                      arrival_gate=a.arrival_gate),
                      structlog.get_logger())
    sched.budget.run_weight = a.run_weight
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # warnings and up only
    sched.connect()
    threading.Thread(target=sched.run, daemon=True).start()
    rng = random.Random(0)
    counter = iter(range(1 << 30))

    def one(prompt: list[int], new: int = a.new) -> float:
        req = build_request(scheduler_pb2.GenerateRequest(request_id=f"q{next(counter)}", max_new_tokens=new,
                                                          input_ids=scheduler_pb2.TokenIds(ids=prompt), ignore_eos=True),
                            tok, sched.info, sched.capacity)
        req.stream = OutputStream(req, tok, sched.info.eos_token_id, outbox=sched.outbox)
        t0 = time.perf_counter()
        hop_trace.mark(req.rid, "client_sent")
        sched.submit(req)
        first = None
        while not isinstance(item := req.out.get(), StreamEnd):
            if a.message_us > 0:  # the stream thread's own work per message (the GIL held)
                item.SerializeToString()
                until = time.perf_counter() + a.message_us / 1e6
                while time.perf_counter() < until:
                    pass
            if first is None and item.token_ids:
                first = time.perf_counter() - t0
                hop_trace.mark(req.rid, "client_text")
        return first

    def drive(prompts: list[list[int]], conc: int, new: int = a.new) -> list[float]:
        out: list[float] = []
        todo = list(prompts)
        lock = threading.Lock()

        def client() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    p = todo.pop(0)
                    pause = rng.uniform(0, a.think_ms / 1e3)
                time.sleep(pause)
                ttft = one(p, new)
                with lock:
                    out.append(ttft)

        threads = [threading.Thread(target=client) for _ in range(conc)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    print(f"overlap={a.overlap} mode={a.overlap_mode} rtt={a.rtt_ms} ms K={a.decode_steps} adaptive={a.adaptive_steps} "
          f"fwd+={a.decode_forward_ms} ms step={a.step_ms} ms extend={a.extend_us_per_token} us/token "
          f"prompt={a.prompt_len} new={a.new} concurrency={a.concurrency} chunk={a.chunk_size} "
          f"chunk_pipeline={a.chunk_pipeline} arrival_gate={a.arrival_gate}")
    figures: dict = {}
    if a.typists:
        figures = typists(a, tok, sched, rng, counter)
        a.fractions = ""
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"settings": vars(a), "figures": figures}, f, indent=1)
    if a.long:
        figures = long_prompts(a, one, drive, rng, worker, sched)
        a.fractions = ""
    if a.background:
        bg_new = max(3000, int((3.0 + a.seconds) / (a.step_ms / 1e3)))  # decoding until the arrivals end
        bg = [threading.Thread(target=one, args=([rng.randrange(100, 1000) for _ in range(64)], bg_new), daemon=True)
              for _ in range(a.background)]
        for t in bg:
            t.start()
        time.sleep(0.5)  # steady decode
        g0, t0 = sched.stats["generation_tokens"], time.perf_counter()
        time.sleep(2.0)
        rate = (sched.stats["generation_tokens"] - g0) / (time.perf_counter() - t0)
        st = sched.stats
        print("decode Forward, loop ms each: allocate %.2f, waiting for the reply %.2f, applying %.2f, round %.2f" % tuple(
            1e3 * st[k] / max(st["decode_batches"], 1) for k in ("decode_alloc_seconds", "decode_rpc_seconds",
                                                                  "decode_process_seconds", "decode_wall_seconds")))
        print(f"steady decode of {a.background}: {rate:.0f} tokens/s (simulated bound "
              f"{a.background / (a.step_ms / 1e3):.0f})")
        out = dict(vars(a), steady_decode_tokens_per_s=rate, bound_tokens_per_s=a.background / (a.step_ms / 1e3))
        if a.rate > 0:
            before = dict(sched.stats)
            ttft, busy = open_loop(one, a.rate, a.seconds, a.prompt_len, rng, sched)
            delta = {k: sched.stats[k] - before[k] for k in ("decode_batches", "decode_steps", "decode_steps_cut")}
            mean_steps = delta["decode_steps"] / max(delta["decode_batches"], 1)
            out.update(decode_tokens_per_s_during_arrivals=busy, mean_steps_during_arrivals=mean_steps,
                       during_arrivals=delta)
            print(f"decode of {a.background} during {a.rate:g} arrivals/s: {busy:.0f} tokens/s, {mean_steps:.2f} steps "
                  f"a decode Forward ({delta['decode_steps_cut']} of {delta['decode_batches']} cut)")
        else:
            ttft = []
            for _ in range(a.probes):
                time.sleep(rng.uniform(0.005, 0.05))
                ttft.append(one([rng.randrange(100, 1000) for _ in range(a.prompt_len)], 1) * 1e3)
        ttft.sort()
        p50, p90, p99 = (ttft[int(q * (len(ttft) - 1))] for q in (0.5, 0.9, 0.99))
        print(f"{len(ttft)} probes behind {a.background} decoding: TTFT p50 {statistics.median(ttft):6.1f} ms  "
              f"p90 {p90:6.1f} ms  p99 {p99:6.1f} ms  extends_ahead {sched.stats.get('extends_ahead', '-')}")
        out.update(probes_answered=len(ttft), ttft_ms_p50=statistics.median(ttft), ttft_ms_p90=p90, ttft_ms_p99=p99,
                   ttft_ms_mean=statistics.fmean(ttft), stats=dict(sched.stats))
        if a.hop_trace:  # the probes' hops only (the background's first tokens came before the arrivals)
            from bench import hop_report
            background_ids = {f"q{i}" for i in range(a.background)}
            hops = {rid: h for rid, h in hop_report.load(a.hop_trace).items() if rid not in background_ids}
            out["hops"] = hop_report.segments(hops, "client_text")
            for seg, v in out["hops"].items():
                print(f"  {seg:28s} p50 {v['p50_ms']:6.2f} ms  mean {v['mean_ms']:6.2f} ms  (n={v['n']})")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1, sort_keys=True)
        a.fractions = ""
    for frac in (float(x) for x in a.fractions.split(",") if x):
        shared = int(a.prompt_len * frac)
        prefixes = [[rng.randrange(100, 1000) for _ in range(shared)] for _ in range(4)]
        if shared:
            drive([p + [rng.randrange(100, 1000) for _ in range(8)] for p in prefixes], 4)
        prompts = [prefixes[i % 4] + [rng.randrange(100, 1000) for _ in range(a.prompt_len - shared)]
                   for i in range(a.requests)]
        busy0, n0, t0 = worker.busy_s, len(worker.extends), time.perf_counter()
        ttft = sorted(x * 1e3 for x in drive(prompts, a.concurrency))
        wall, extends = time.perf_counter() - t0, worker.extends[n0:]
        print(f"shared {frac:.2f}: TTFT p50 {statistics.median(ttft):6.1f} ms  p99 {ttft[int(0.99 * (len(ttft) - 1))]:6.1f} ms"
              f"  extends_ahead {sched.stats['extends_ahead'] if 'extends_ahead' in sched.stats else '-'}  "
              f"{a.requests * a.new / wall:.0f} output tok/s, worker busy {(worker.busy_s - busy0) / wall:.1%}, "
              f"{len(extends)} extends of {statistics.fmean(extends) if extends else 0:.0f} tokens on average")
    sched.stop("done")
    server.server.stop(0)
    if a.json and a.long:  # probe mode wrote its own figures
        with open(a.json, "w") as f:
            json.dump({"settings": vars(a), "figures": figures}, f, indent=1)


def long_prompts(a, one, drive, rng, worker: SimWorker, sched) -> dict:
    """The ``--long`` figures: one at a time, then ``a.concurrency`` clients at once (see the module doc)."""
    prompt = lambda: [rng.randrange(100, 1000) for _ in range(a.prompt_len)]  # noqa: E731
    one(prompt(), 1)  # warm-up (gRPC channel, first Allocate)
    busy0, t0, ahead0 = worker.busy_s, time.perf_counter(), sched.stats["chunks_ahead"]
    ttft = [one(prompt(), 1) * 1e3 for _ in range(a.long)]
    wall = time.perf_counter() - t0
    solo = dict(ttft_ms_p50=statistics.median(ttft), ttft_ms_max=max(ttft), ttft_ms=ttft,
                prefill_tokens_per_s=a.prompt_len * len(ttft) / (sum(ttft) / 1e3),
                worker_busy_share=(worker.busy_s - busy0) / wall, chunks_ahead=sched.stats["chunks_ahead"] - ahead0)
    busy0, t0, ahead0 = worker.busy_s, time.perf_counter(), sched.stats["chunks_ahead"]
    ttft = sorted(x * 1e3 for x in drive([prompt() for _ in range(a.long)], a.concurrency, 1))
    wall = time.perf_counter() - t0
    burst = dict(ttft_ms_p50=statistics.median(ttft), ttft_ms_max=max(ttft), wall_s=wall,
                 prefill_tokens_per_s=a.prompt_len * len(ttft) / wall,
                 worker_busy_share=(worker.busy_s - busy0) / wall, chunks_ahead=sched.stats["chunks_ahead"] - ahead0)
    chunks = -(-a.prompt_len // a.chunk_size)
    bound = a.prompt_len * a.extend_us_per_token / 1e3 + chunks * 0.3
    print(f"long prompts ({a.prompt_len} tokens, {chunks} chunks; simulated compute {bound:.1f} ms each), one at a "
          f"time: TTFT p50 {solo['ttft_ms_p50']:.1f} ms, prefill {solo['prefill_tokens_per_s']:,.0f} tokens/s, worker "
          f"busy {solo['worker_busy_share']:.1%}; {a.concurrency} at once: TTFT p50 {burst['ttft_ms_p50']:.1f} ms, "
          f"prefill {burst['prefill_tokens_per_s']:,.0f} tokens/s, worker busy {burst['worker_busy_share']:.1%}")
    return {"one_at_a_time": solo, "concurrent": burst, "simulated_compute_ms_per_prompt": bound}


def typists(a, tok, sched, rng: random.Random, counter) -> dict:
    """The ``--typists`` figures (module doc): TTFT of answered completions, aborts a second, the loop's counters."""
    ttft: list[float] = []
    sent, aborted = [0], [0]
    lock = threading.Lock()
    end = time.perf_counter() + a.seconds

    def watch(req, t0: float) -> None:  # the stream's first token (if it comes before the abort), then its end
        first = None
        while not isinstance(item := req.out.get(), StreamEnd):
            if first is None and item.token_ids:
                first = time.perf_counter() - t0
                hop_trace.mark(req.rid, "client_text")
                with lock:
                    ttft.append(first * 1e3)

    def typist(seed: int) -> None:
        r = random.Random(seed)
        head = [r.randrange(100, 1000) for _ in range(a.prompt_len)]
        tail = [r.randrange(100, 1000) for _ in range(100)]
        while time.perf_counter() < end:
            prev = None
            for _ in range(r.randint(5, 15)):
                head += [r.randrange(100, 1000) for _ in range(r.randint(1, 2))]
                req = build_request(scheduler_pb2.GenerateRequest(
                    request_id=f"t{next(counter)}", max_new_tokens=a.new, ignore_eos=True,
                    input_ids=scheduler_pb2.TokenIds(ids=head + tail)), tok, sched.info, sched.capacity)
                req.stream = OutputStream(req, tok, sched.info.eos_token_id, outbox=sched.outbox)
                t0 = time.perf_counter()
                hop_trace.mark(req.rid, "client_sent")
                sched.submit(req)
                w = threading.Thread(target=watch, args=(req, t0), daemon=True)
                w.start()
                if prev is not None and sched.abort(prev[0].rid, "cancelled"):
                    with lock:
                        aborted[0] += 1
                with lock:
                    sent[0] += 1
                prev = (req, w)
                time.sleep(r.uniform(0.05, 0.15))
            prev[1].join()
            time.sleep(r.uniform(0.3, 0.8))

    before = dict(sched.stats)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=typist, args=(i,)) for i in range(a.typists)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    delta = {k: sched.stats[k] - before.get(k, 0) for k in ("batches", "decode_batches", "decode_chained",
                                                          "extends_ahead", "chunks_ahead") if k in sched.stats}
    ttft.sort()
    p50, p90 = (ttft[int(q * (len(ttft) - 1))] for q in (0.5, 0.9))
    print(f"{a.typists} typists, {wall:.1f} s: {sent[0]} completions, {len(ttft)} answered, "
          f"{aborted[0] / wall:.1f} aborts/s; TTFT p50 {p50:.1f} ms p90 {p90:.1f} ms; loop {delta}")
    return {"sent": sent[0], "answered": len(ttft), "aborts_per_s": aborted[0] / wall, "ttft_ms_p50": p50,
            "ttft_ms_p90": p90, "wall_s": wall, "loop": delta}


def open_loop(one, rate: float, seconds: float, prompt_len: int, rng: random.Random, sched) -> tuple[list[float], float]:
    """Poisson arrivals of 1-token probes at ``rate`` a second for ``seconds``, each in its own thread. Returns
    (the probes' TTFT in ms, the background's generated tokens/s over the arrivals' time, probes excluded)."""
    ttft: list[float] = []
    lock = threading.Lock()

    def probe(prompt: list[int]) -> None:
        t = one(prompt, 1) * 1e3
        with lock:
            ttft.append(t)

    threads = []
    g0, t0 = sched.stats["generation_tokens"], time.perf_counter()
    at = t0
    while (at := at + rng.expovariate(rate)) < t0 + seconds:
        prompt = [rng.randrange(100, 1000) for _ in range(prompt_len)]
        time.sleep(max(0.0, at - time.perf_counter()))
        threads.append(threading.Thread(target=probe, args=(prompt,), daemon=True))
        threads[-1].start()
    generated, elapsed = sched.stats["generation_tokens"] - g0, time.perf_counter() - t0
    for t in threads:
        t.join()
    return ttft, (generated - len(threads)) / elapsed


if __name__ == "__main__":
    main()
