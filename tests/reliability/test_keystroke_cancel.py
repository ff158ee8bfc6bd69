"""Keystroke-rate cancellation (issue 13): TYPISTS simulated editors each type through a HumanEval file's
middle, sending a FIM completion (``suffix``, streamed) every 50-150 ms and aborting the previous one, for a
bounded time, with page size 1 and 16 and prompts whose lengths are not page multiples. Zero 5xx; the last
request of every burst is answered and equals its solo output; no leaked slot and integrity empty at the end
(``settled``); no process restarted. The survivors' TTFT is printed (and recorded as a junit property)."""

from __future__ import annotations

import asyncio
import random
import statistics
import time

import httpx
import pytest

from bench.humaneval_fim import cuts

TYPISTS = 20
BURSTS = 2               # bursts per typist
KEYSTROKES = (6, 12)     # requests per burst (each but the last aborted by the next keystroke)
GAP_S = (0.050, 0.150)   # between keystrokes
MAX_TOKENS = 8
STORM_LIMIT_S = 120.0    # the whole storm must end within this (CPU, shared cores)


def fim_len(literal, prefix: str, suffix: str) -> int:
    return len(literal(prefix)) + len(literal(suffix)) + 3


async def one(client: httpx.AsyncClient, model: str, prefix: str, suffix: str, statuses: list[int]) -> dict:
    """One streamed FIM completion: {"text", "ttft", "finish"}; a cancelled task leaves mid-stream."""
    sent = time.monotonic()
    text, ttft, finish = "", None, None
    body = {"model": model, "prompt": prefix, "suffix": suffix, "max_tokens": MAX_TOKENS, "temperature": 0,
            "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as reply:
        statuses.append(reply.status_code)
        if reply.status_code != 200:
            return {"status": reply.status_code, "body": (await reply.aread())[:300]}
        import json

        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                if choice["text"] and ttft is None:
                    ttft = time.monotonic() - sent
                text += choice["text"]
                finish = choice["finish_reason"] or finish
    return {"status": 200, "text": text, "ttft": ttft, "finish": finish}


async def typist(i: int, url: str, model: str, cut, literal, page: int, statuses: list[int], out: list) -> None:
    rng = random.Random(1000 + i)
    async with httpx.AsyncClient(base_url=url, timeout=STORM_LIMIT_S) as client:
        typed = 0
        for _ in range(BURSTS):
            previous: asyncio.Task | None = None
            for _ in range(rng.randint(*KEYSTROKES)):
                typed = min(typed + 1, len(cut.middle))
                prefix = cut.prefix + cut.middle[:typed]
                if previous is not None:
                    previous.cancel()
                previous = asyncio.create_task(one(client, model, prefix, cut.suffix, statuses))
                await asyncio.sleep(rng.uniform(*GAP_S))
            while page > 1 and fim_len(literal, prefix, cut.suffix) % page == 0:  # the last one: not a page multiple
                prefix += " "
                previous.cancel()
                previous = asyncio.create_task(one(client, model, prefix, cut.suffix, statuses))
            out.append((prefix, cut.suffix, await previous))
            await asyncio.sleep(rng.uniform(*GAP_S))


@pytest.fixture(scope="module")
def literal(model_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{model_path}/tokenizer.json")
    tok.encode_special_tokens = True
    return lambda text: tok.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("page", [1, 16])
def test_typists_abort_at_keystroke_rate(systems, settled, literal, record_property, page) -> None:
    sys_ = systems(kv_tokens=65536, page_size=page, chunk_size=256, max_running_requests=64)
    settled(sys_)
    pids = {name: sys_.pid(name) for name in ("cache", "worker", "scheduler", "gateway")}
    model = sys_.http.get("/v1/models").json()["data"][0]["id"]
    files = cuts(seed=page, kinds=("multi",), limit=TYPISTS)
    statuses: list[int] = []
    last: list = []

    async def storm() -> None:
        await asyncio.gather(*(typist(i, sys_.url, model, files[i], literal, page, statuses, last)
                               for i in range(TYPISTS)))

    t0 = time.monotonic()
    asyncio.run(asyncio.wait_for(storm(), STORM_LIMIT_S))
    storm_s = time.monotonic() - t0
    assert [s for s in statuses if s >= 500] == []
    assert len(last) == TYPISTS * BURSTS
    assert all(r["status"] == 200 and r["finish"] in ("stop", "length") for _, _, r in last), last
    lengths = [fim_len(literal, p, s) for p, s, _ in last]
    if page > 1:
        assert all(n % page for n in lengths)
    for prefix, suffix, r in last:  # each survivor equals the same request sent alone
        solo = sys_.post("/v1/completions", {"model": model, "prompt": prefix, "suffix": suffix,
                                             "max_tokens": MAX_TOKENS, "temperature": 0})
        assert solo.status_code == 200, solo.text
        assert r["text"] == solo.json()["choices"][0]["text"], (prefix[-40:], r, solo.json())
    assert {name: sys_.pid(name) for name in pids} == pids
    ttfts = sorted(r["ttft"] for _, _, r in last if r["ttft"] is not None)
    sent = len(statuses)
    report = {"page": page, "requests": sent, "survivors": len(last), "cancelled": sent - len(last),
              "storm_s": round(storm_s, 2), "cancels_per_s": round((sent - len(last)) / storm_s, 1),
              "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1),
              "ttft_max_ms": round(1000 * ttfts[-1], 1)}
    print("keystroke storm:", report)
    record_property("keystroke_storm", report)
