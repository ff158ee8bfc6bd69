"""Host time per decode Forward outside the model's forward, worker and scheduler side, on the CPU.

    python -m bench.host_overhead --batches 64,256 --steps 8 [--context 1152] [--forwards 30] [--warmup 3]
        [--out bench/results/cpu-host-overhead] [--label NAME] [--profile DIR]

What one steady overlapped decode Forward of B requests x K steps costs the host, phase by phase (median
over ``--forwards`` Forwards, in ms per Forward; per step = / K):

Worker (the servicer's ``Forward`` called directly on a real CPU ``Engine``, no gRPC transport):
  request_parse   ``ForwardRequest.FromString`` of the bytes the scheduler sends
  convert         servicer entry -> ``engine.forward`` entry (protobuf items -> engine items)
  validate        ``engine.forward`` entry -> end of ``validate_batch`` (epoch, order, lock, whole-batch checks)
  prepare         -> the first model call (slot tables, batch layout, step-0 inputs)
  steps           first model call -> last logits, minus the stub model's own time (per-step host work)
  commit          last logits -> ``engine.forward`` return (read-back, outputs, request table commit)
  reply_build     -> servicer return (``ForwardResponse`` built from the outputs)
  reply_serialize ``SerializeToString`` of the reply
  tables_behind   (not in the total) ``multistep.row_tables`` of B rows behind a pending Forward that runs them all
                  (a Forward prepared at arrival, under the engine's lock)
  step_feed       (not in the total: CUDA path only) ``StepFeed(...)`` for the Forward's slot tables and its K
                  ``step(j)`` calls, the metadata of the CUDA-graph multi-step path, here on CPU tensors
Scheduler (the real parts on a request table without services, the default model's tokenizer; no gRPC
transport):
  next_batch      ``planner.continuation`` + ``slots_by_request`` + ``continuation_batch`` (Forward N+1)
  items_build     ``batch.forward_items`` (``forward_item`` per entry)
  request_build   the ``ForwardRequest`` of ``WorkerClient.prepare``
  request_serialize, reply_parse   what gRPC does with them on this side
  process         ``results.apply`` + ``RequestTable.finish``: every request gets K tokens of code (detokenize,
                  stream message)
  process_stop    the same with two stop strings per request that never match (not in the total)

The model: the engine is built on the embedded default model, then its ``model`` is replaced by a stub
with the right output shapes (hidden [T, n_embd] zeros; logits [n, vocab] one-hot on a code token chosen by
the row's output slot), whose own time is measured and subtracted. So every figure is host work that runs
on CUDA too, except ``steps``: the CPU engine's per-step path (batch layout per step, the torch attention
``plan``, sampling on CPU tensors); on CUDA with graphs that step is ``StepFeed.step`` + flashinfer's plan +
replay (not measured here).

Floor: ``SerializeToString`` + ``FromString`` of the same ForwardRequest and ForwardReply (the bytes that
must cross anyway), measured in the same run; ``ratio`` = phase total / floor.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
import types

import numpy as np
import torch

from codeserve.v1 import cache_pb2, common_pb2, worker_pb2
from worker_svc import engine as engine_mod
from worker_svc.build import WorkerOptions, build_engine
from worker_svc.model.default import ensure_default_model
from worker_svc.service import WorkerServicer

WORKER_PHASES = ("request_parse", "convert", "validate", "prepare", "steps", "commit", "reply_build", "reply_serialize")
SCHED_PHASES = ("next_batch", "items_build", "request_build", "request_serialize", "reply_parse", "process")
EPOCH = "bench-epoch"


class StubModel:
    """Stands in for GPTBigCodeForCausalLM: hidden [T, n_embd] zeros; ``logits`` one-hot rows [n, vocab] on
    ``tokens[out_slot % len(tokens)]`` of the last call. Records the first call, the end of the last
    ``logits`` and its own seconds (``own``)."""

    def __init__(self, n_embd: int, vocab: int, tokens: list[int]):
        self.n_embd, self.vocab = n_embd, vocab
        self.tokens = torch.tensor(tokens, dtype=torch.long)
        self.reset()

    def reset(self) -> None:
        self.first = self.last = None
        self.own = 0.0
        self._slots = None

    def __call__(self, input_ids, positions, kv_pool, backend, out_slots):
        t0 = time.perf_counter()
        if self.first is None:
            self.first = t0
        self._slots = out_slots.to(torch.long)
        out = torch.zeros(len(input_ids), self.n_embd)
        self.own += time.perf_counter() - t0
        return out

    def logits(self, hidden):
        t0 = time.perf_counter()
        rows = self.tokens[self._slots[: hidden.shape[0]] % len(self.tokens)]
        out = torch.zeros(hidden.shape[0], self.vocab).scatter_(1, rows[:, None], 1.0)
        self.last = time.perf_counter()
        self.own += self.last - t0
        return out


class Marks:
    """Timestamps the servicer's call into the engine and the end of ``validate_batch``."""

    def __init__(self, engine):
        self.fwd_in = self.fwd_out = self.valid_out = None
        inner = engine.forward
        orig_validate = engine_mod.validate_batch

        def forward(*a, **k):
            self.fwd_in = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                self.fwd_out = time.perf_counter()

        def validate(*a, **k):
            try:
                return orig_validate(*a, **k)
            finally:
                self.valid_out = time.perf_counter()

        engine.forward = forward
        engine_mod.validate_batch = validate


class Context:
    """The part of a grpc.ServicerContext the servicer uses on success."""

    def is_active(self) -> bool:
        return True

    def abort(self, code, details):
        raise RuntimeError(f"Forward rejected: {code}: {details}")


def code_tokens(tokenizer) -> list[int]:
    """Token ids of the embedded code corpus (no special tokens), a realistic stream to detokenize."""
    from worker_svc.model.corpus import CORPUS

    ids = tokenizer.encode("\n\n".join(CORPUS)).ids
    return [t for t in ids if t > 18]


def _median(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


# ---- worker ---------------------------------------------------------------------------------------------

def worker_phases(b: int, k: int, context: int, forwards: int, warmup: int, model_path: str, tokens: list[int],
                  profile: pathlib.Path | None) -> tuple[dict, bytes, bytes]:
    """Per-phase ms per Forward (medians), and the last request / reply bytes (for the floor)."""
    rounds = warmup + forwards + 1
    span = context + k * rounds  # slots per request over the run
    engine = build_engine(WorkerOptions(model_path=model_path, device="cpu", kv_tokens=b * span + 1))
    engine.epoch = EPOCH
    cfg = engine.cfg
    stub = StubModel(cfg.n_embd, cfg.vocab_size, tokens)
    engine.model = stub
    marks = Marks(engine)
    servicer = WorkerServicer(engine)
    ctx = Context()
    greedy = common_pb2.SamplingParams(temperature=0.0)

    def request(r: int) -> worker_pb2.ForwardRequest:
        items = []
        for i in range(b):
            base = 1 + i * span
            pos = context + r * k
            item = worker_pb2.ForwardItem(request_id=f"r{i}", position_start=pos, slot_ids=range(base + pos, base + pos + k),
                                          sampling=greedy, sample=True, prompt_len=context - 128, decode_steps=k)
            if r == 0:  # the worker learns the request: its prefix (cached) and its first input token
                item.has_prefix = True
                item.prefix_slot_ids.extend(range(base, base + pos))
                item.prefix_token_ids.extend(tokens[(i + j) % len(tokens)] for j in range(pos))
                item.input_ids.append(tokens[i % len(tokens)])
            else:
                item.input_from_last_sample = True
            items.append(item)
        return worker_pb2.ForwardRequest(expected_epoch=EPOCH, items=items, seq=r + 1, after_seq=r)

    times = {p: [] for p in WORKER_PHASES}
    times["total"] = []
    prof = None
    req_bytes = reply_bytes = b""
    for r in range(rounds):
        req_bytes = request(r).SerializeToString()
        stub.reset()
        if profile is not None and r == warmup + 1:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        req = worker_pb2.ForwardRequest.FromString(req_bytes)
        t1 = time.perf_counter()
        reply = servicer.Forward(req, ctx)
        t2 = time.perf_counter()
        reply_bytes = reply.SerializeToString()
        t3 = time.perf_counter()
        if prof is not None:
            prof.disable()
        if r <= warmup:  # r == 0 primes the request table (has_prefix), then warm-up
            continue
        spans = dict(request_parse=t1 - t0, convert=marks.fwd_in - t1, validate=marks.valid_out - marks.fwd_in,
                     prepare=stub.first - marks.valid_out, steps=stub.last - stub.first - stub.own,
                     commit=marks.fwd_out - stub.last, reply_build=t2 - marks.fwd_out, reply_serialize=t3 - t2)
        for p, v in spans.items():
            times[p].append(v)
        times["total"].append(sum(spans.values()))
    if prof is not None:
        _dump_profile(prof, profile / f"worker_b{b}_k{k}.txt")
    out = {p: round(_median(v), 4) for p, v in times.items()}
    sample_reply = worker_pb2.ForwardResponse.FromString(reply_bytes)
    if len(sample_reply.results) != b or any(len(x.next_token_ids) != (k if k > 1 else 0) or not x.sampled
                                             for x in sample_reply.results):
        raise RuntimeError(f"worker reply has {len(sample_reply.results)} results, not {b} of {k} tokens each")
    return out, req_bytes, reply_bytes


def tables_behind_ms(b: int, k: int, context: int, forwards: int) -> float:
    """Median ms of ``multistep.row_tables`` for ``b`` rows of ``context`` committed slots behind a pending Forward
    that runs all of them (what a Forward prepared at arrival builds under the engine's lock, ``Engine._prepare_ahead``:
    each row's committed table and the slots of the Forward ahead)."""
    from worker_svc import multistep
    from worker_svc.request_state import RequestState, SlotTable
    from worker_svc.types import ForwardItem

    span = context + 2 * k
    states = {f"r{i}": RequestState(SlotTable(range(1 + i * span, 1 + i * span + context)), [], context)
              for i in range(b)}
    ahead_items = [ForwardItem(f"r{i}", (), context, tuple(range(1 + i * span + context, 1 + i * span + context + k)),
                               decode_steps=k, input_from_last_sample=True) for i in range(b)]
    items = [ForwardItem(f"r{i}", (), context + k, tuple(range(1 + i * span + context + k, 1 + (i + 1) * span)),
                         decode_steps=k, input_from_last_sample=True) for i in range(b)]
    ahead = types.SimpleNamespace(items=ahead_items, states=[states[it.request_id] for it in ahead_items])
    eng = types.SimpleNamespace(requests=states)
    times = []
    for _ in range(forwards + 3):
        t0 = time.perf_counter()
        rows = multistep.row_tables(eng, items, ahead)
        times.append(time.perf_counter() - t0)
    if rows is None or any(len(p) != context + k for p in rows.prefixes):
        raise RuntimeError("row_tables did not build every row behind the Forward ahead")
    return round(_median(times[3:]), 4)


def step_feed_ms(b: int, k: int, context: int, forwards: int) -> float:
    """Median ms of one ``StepFeed`` build and its ``k`` steps for ``b`` rows of ``context`` prefix slots (the
    CUDA multi-step path's metadata of a Forward; CPU tensors here, so the pinned copies are plain copies and
    the gathers run on the CPU)."""
    from worker_svc.step_feed import StepFeed

    span = context + k
    tables = [np.arange(1 + i * span, 1 + i * span + context, dtype=np.int32) for i in range(b)]
    new = [tuple(range(1 + i * span + context, 1 + (i + 1) * span)) for i in range(b)]
    cpu = torch.device("cpu")
    times = []
    for _ in range(forwards + 3):
        t0 = time.perf_counter()
        feed = StepFeed(tables, new, [k] * b, cpu)
        for j in range(k):
            feed.step(j)
        times.append(time.perf_counter() - t0)
    return round(_median(times[3:]), 4)


# ---- scheduler ------------------------------------------------------------------------------------------

def scheduler_phases(b: int, k: int, context: int, forwards: int, warmup: int, tokenizer, tokens: list[int],
                     stop: tuple[str, ...], profile: pathlib.Path | None) -> dict:
    """Per-phase ms per Forward (medians) of the scheduler's side of a steady decode Forward."""
    from scheduler_svc import results
    from scheduler_svc.batch import Batch, Entry, forward_items, slots_by_request
    from scheduler_svc.intake import Intake
    from scheduler_svc.output import OutputStream
    from scheduler_svc.chain import continuation, continuation_batch
    from scheduler_svc.request import Params, Req, State
    from scheduler_svc.requests import RequestTable
    from scheduler_svc.stats import Stats
    from scheduler_svc.worker_client import WorkerClient

    rounds = warmup + forwards
    log = types.SimpleNamespace(info=lambda *a, **k: None, debug=lambda *a, **k: None, warning=lambda *a, **k: None)
    table, stats, eos = RequestTable(None, None, Intake(b), log), Stats(), 0  # no cache or worker: nothing finishes
    client = types.SimpleNamespace(epoch=EPOCH)
    prompt = context - 128
    span = context + k * (rounds + 2)
    reqs = []
    for i in range(b):
        params = Params(max_new_tokens=10 ** 6, asked_max_new_tokens=10 ** 6, sampling=common_pb2.SamplingParams(),
                        stop=stop, ignore_eos=True)
        req = Req(rid=f"r{i}", prompt_ids=[tokens[(i + j) % len(tokens)] for j in range(prompt)], params=params)
        req.output_ids = [tokens[(i + j) % len(tokens)] for j in range(prompt, context)]
        req.phase, req.worker_knows, req.kv_len, req.first_sent = State.DECODE, True, context - 1, True
        req.stream = OutputStream(req, tokenizer, eos)
        req.stream.detok.push(req.output_ids[-4:])  # the detokenizer holds the request's recent output
        reqs.append(req)
    table.running = list(reqs)
    # Forward N (in flight): every request with K steps from its position
    cur = Batch("decode", tuple(Entry(r, start=r.kv_len, n=1, slot_ids=tuple(range(1 + i * span + r.kv_len, 1 + i * span + r.kv_len + k)),
                                      sample=True, steps=k) for i, r in enumerate(reqs)))
    times = {p: [] for p in SCHED_PHASES}
    times["total"] = []
    prof = None
    for r in range(rounds):
        # what the cache answers to Allocate for N+1 and what the worker answers to N (not timed: theirs)
        alloc = cache_pb2.AllocateResponse(results=[
            cache_pb2.AllocResult(request_id=e.req.rid, slot_ids=[s + k for s in e.slot_ids]) for e in cur.entries])
        got = [[tokens[(i * 7 + e.start + j) % len(tokens)] for j in range(k)] for i, e in enumerate(cur.entries)]
        reply_bytes = worker_pb2.ForwardResponse(results=[  # K = 1: one next_token_id, as the worker answers
            worker_pb2.ForwardResult(request_id=e.req.rid, sampled=True, next_token_id=g[-1],
                                     next_token_ids=g if k > 1 else ()) for e, g in zip(cur.entries, got)]).SerializeToString()
        if profile is not None and r == warmup:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        plan = continuation(cur, k)
        nxt = continuation_batch(plan, [], slots_by_request(alloc, [(e.req, n) for e, n in plan]))
        t1 = time.perf_counter()
        items = forward_items(nxt, eos)
        t2 = time.perf_counter()
        request = WorkerClient.prepare(client, items, r + 2, after_seq=r + 1)
        t3 = time.perf_counter()
        request.SerializeToString()
        t4 = time.perf_counter()
        reply = worker_pb2.ForwardResponse.FromString(reply_bytes)
        t5 = time.perf_counter()
        table.finish(results.apply(cur, reply, table, stats), lambda: {e.req.rid for e in nxt.entries})
        t6 = time.perf_counter()
        if prof is not None:
            prof.disable()
            _dump_profile(prof, profile / f"scheduler_b{b}_k{k}{'_stop' if stop else ''}.txt")
            prof = None
        for req in reqs:  # the servicer's stream threads would take these
            while not req.out.empty():
                req.out.get_nowait()
        if len(table.running) != b:
            raise RuntimeError(f"{b - len(table.running)} requests finished during the bench")
        cur = nxt
        if r < warmup:
            continue
        spans = dict(next_batch=t1 - t0, items_build=t2 - t1, request_build=t3 - t2, request_serialize=t4 - t3,
                     reply_parse=t5 - t4, process=t6 - t5)
        for p, v in spans.items():
            times[p].append(v)
        times["total"].append(sum(spans.values()))
    return {p: round(_median(v), 4) for p, v in times.items()}


# ---- floor and report -----------------------------------------------------------------------------------

def floor_ms(req_bytes: bytes, reply_bytes: bytes, repeats: int) -> dict:
    """Median ms of serialize + parse of the ForwardRequest and the ForwardReply."""
    req = worker_pb2.ForwardRequest.FromString(req_bytes)
    reply = worker_pb2.ForwardResponse.FromString(reply_bytes)
    out = {}
    for name, msg, cls in (("request", req, worker_pb2.ForwardRequest), ("reply", reply, worker_pb2.ForwardResponse)):
        xs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            cls.FromString(msg.SerializeToString())
            xs.append(time.perf_counter() - t0)
        out[name] = round(_median(xs), 4)
    out["total"] = round(out["request"] + out["reply"], 4)
    out["request_bytes"], out["reply_bytes"] = len(req_bytes), len(reply_bytes)
    return out


def _dump_profile(prof, path: pathlib.Path) -> None:
    import io
    import pstats

    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats(os.environ.get("HO_SORT", "tottime")).print_stats(40)
    path.write_text(buf.getvalue())


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=pathlib.Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        return f"unknown ({e})"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--context", type=int, default=1152, help="tokens per request before the measured Forwards")
    ap.add_argument("--forwards", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default="bench/results/cpu-host-overhead")
    ap.add_argument("--label", default="", help="name of the result file (default: the commit)")
    ap.add_argument("--profile", default="", help="directory for cProfile tables of one Forward per side")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from scheduler_svc.detokenizer import load_tokenizer

    model_path = str(ensure_default_model())
    tokenizer = load_tokenizer(model_path)
    tokens = code_tokens(tokenizer)
    profile = pathlib.Path(args.profile) if args.profile else None
    k = args.steps
    result = dict(commit=_commit(), label=args.label, steps=k, context=args.context, forwards=args.forwards,
                  python=platform.python_version(), torch=torch.__version__, batches={})
    for b in [int(x) for x in args.batches.split(",")]:
        w, req_bytes, reply_bytes = worker_phases(b, k, args.context, args.forwards, args.warmup, model_path, tokens, profile)
        s = scheduler_phases(b, k, args.context, args.forwards, args.warmup, tokenizer, tokens, (), profile)
        s_stop = scheduler_phases(b, k, args.context, args.forwards, args.warmup, tokenizer, tokens,
                                  ("\n\n\n\n\n", "<|stop|>"), profile)
        s["process_stop"] = s_stop["process"]
        w["step_feed"] = step_feed_ms(b, k, args.context, args.forwards)
        w["tables_behind"] = tables_behind_ms(b, k, args.context, args.forwards)
        fl = floor_ms(req_bytes, reply_bytes, max(args.forwards, 20))
        entry = dict(worker=w, scheduler=s, floor=fl,
                     worker_per_step={p: round(v / k, 4) for p, v in w.items()},
                     scheduler_per_step={p: round(v / k, 4) for p, v in s.items()},
                     ratio=dict(worker=round(w["total"] / fl["total"], 2), scheduler=round(s["total"] / fl["total"], 2),
                                both=round((w["total"] + s["total"]) / fl["total"], 2)))
        result["batches"][str(b)] = entry
        _print(b, k, entry)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"host_overhead_{args.label or result['commit']}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return result


def _print(b: int, k: int, e: dict) -> None:
    print(f"\nB={b} K={k}: ms per Forward (per step)")
    for side in ("worker", "scheduler"):
        for p, v in e[side].items():
            print(f"  {side:9s} {p:18s} {v:9.3f}  ({v / k:7.3f})")
    fl = e["floor"]
    print(f"  floor     serialize+parse    {fl['total']:9.3f}  ({fl['total'] / k:7.3f})   request {fl['request_bytes']} B,"
          f" reply {fl['reply_bytes']} B")
    r = e["ratio"]
    print(f"  ratio to floor: worker {r['worker']}, scheduler {r['scheduler']}, both {r['both']}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
