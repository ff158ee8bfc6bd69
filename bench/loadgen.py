"""A streaming HTTP load generator for the SGLang-native ``POST /generate`` endpoint (async httpx).

Each request streams ``data:`` events whose ``output_ids`` are cumulative; the time an event brings new
token ids is the arrival time of those tokens. Requests are spread over ``procs`` client processes (one
asyncio loop each, ``concurrency / procs`` requests in flight per process), so the client is not the
bottleneck at high concurrency. Clocks: ``time.monotonic`` (system-wide on Linux, comparable across
processes).

Metrics (``summarize``), the usual serving-benchmark definitions (as SGLang's bench_serving):
- TTFT: request sent -> first event with a token; ITL: gap between consecutive token-bearing events
  (one event may bring several tokens, e.g. with multi-step decode); TPOT per request:
  (last token time - first token time) / (tokens - 1); output throughput: all tokens / wall time of the run.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import time
from dataclasses import asdict, dataclass, field

from common import hop_trace


@dataclass
class Record:
    """One request's timings (seconds, time.monotonic) and counts; ``error`` is empty when it succeeded."""

    sent: float = 0.0
    token_times: list[float] = field(default_factory=list)  # one entry per token-bearing event
    token_counts: list[int] = field(default_factory=list)   # new tokens in that event
    done: float = 0.0
    tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""


async def stream_one(client, url: str, payload: dict) -> Record:
    """One streamed /generate call (``payload`` without ``stream``: it is set) timed into a Record; an HTTP error status,
    an error event or a transport error is the Record's ``error``."""
    import httpx

    rec = Record(sent=time.monotonic())
    rid = payload.get("rid") if hop_trace.enabled() else None  # the hops of a traced run (serve_bench --hop-trace)
    hop_trace.mark(rid, "client_sent")
    seen = 0
    try:
        async with client.stream("POST", url, json={**payload, "stream": True}) as resp:
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                ev = json.loads(data)
                if "error" in ev:
                    rec.error = str(ev["error"])[:300]
                    break
                n = len(ev.get("output_ids", ()))
                if n > seen:
                    if not seen:
                        hop_trace.mark(rid, "client_text")
                    rec.token_times.append(time.monotonic())
                    rec.token_counts.append(n - seen)
                    seen = n
                meta = ev.get("meta_info") or {}
                rec.prompt_tokens = meta.get("prompt_tokens", rec.prompt_tokens)
                rec.cached_tokens = meta.get("cached_tokens", rec.cached_tokens)
    except httpx.HTTPError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    rec.done = time.monotonic()
    hop_trace.mark(rid, "client_done")
    rec.tokens = seen
    return rec


async def _run(url: str, payloads: list[dict], concurrency: int, timeout: float) -> list[Record]:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        async def guarded(p):
            async with sem:
                return await stream_one(client, url, p)
        return list(await asyncio.gather(*(guarded(p) for p in payloads)))


def _proc_main(args) -> list[dict]:
    url, payloads, concurrency, timeout = args
    hop_trace.configure("client")  # its own file when CODESERVE_HOP_TRACE is set (a forked parent's is not shared)
    return [asdict(r) for r in asyncio.run(_run(url, payloads, concurrency, timeout))]


def run(base_url: str, payloads: list[dict], concurrency: int, procs: int = 1, timeout: float = 600.0) -> list[Record]:
    """Sends every payload (a /generate body; ``stream`` is forced on) keeping ``concurrency`` in flight
    in all, over ``procs`` processes (request i goes to process i % procs). Returns Records in payload order."""
    url = base_url.rstrip("/") + "/generate"
    procs = max(1, min(procs, concurrency, len(payloads)))
    if procs == 1:
        return asyncio.run(_run(url, payloads, concurrency, timeout))
    shares = [payloads[i::procs] for i in range(procs)]
    per = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        parts = pool.map(_proc_main, [(url, s, c, timeout) for s, c in zip(shares, per)])
    out: list[Record | None] = [None] * len(payloads)
    for i, part in enumerate(parts):
        for j, r in enumerate(part):
            out[i + j * procs] = Record(**r)
    return out  # type: ignore[return-value]


def pct(xs: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for an empty list."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(records: list[Record]) -> dict:
    """Throughput and latency figures of one run (seconds and tokens; ms in the *_ms fields)."""
    ok = [r for r in records if not r.error and r.tokens > 0]
    errors = [r.error for r in records if r.error]
    if not ok:
        return {"requests": len(records), "ok": 0, "errors": len(errors), "first_error": errors[:1]}
    start = min(r.sent for r in records)
    end = max(r.done for r in ok)
    ttft = [r.token_times[0] - r.sent for r in ok]
    itl = [b - a for r in ok for a, b in zip(r.token_times, r.token_times[1:])]
    tpot = [(r.token_times[-1] - r.token_times[0]) / (r.tokens - 1) for r in ok if r.tokens > 1]
    tokens = sum(r.tokens for r in ok)
    ms = lambda xs, q: round(1000 * pct(xs, q), 2)  # noqa: E731
    return {
        "requests": len(records), "ok": len(ok), "errors": len(errors), "first_error": errors[:1],
        "duration_s": round(end - start, 3), "output_tokens": tokens,
        "output_tok_s": round(tokens / (end - start), 1),
        "request_s": round(len(ok) / (end - start), 3),
        "ttft_p50_ms": ms(ttft, 50), "ttft_p99_ms": ms(ttft, 99), "ttft_mean_ms": round(1000 * statistics.mean(ttft), 2),
        "itl_p50_ms": ms(itl, 50), "itl_p99_ms": ms(itl, 99),
        "tpot_p50_ms": ms(tpot, 50), "tpot_p99_ms": ms(tpot, 99),
        "tokens_per_event": round(tokens / max(1, sum(len(r.token_times) for r in ok)), 2),
        "prompt_tokens_mean": round(statistics.mean(r.prompt_tokens for r in ok), 1),
        "cached_tokens_mean": round(statistics.mean(r.cached_tokens for r in ok), 1),
    }
