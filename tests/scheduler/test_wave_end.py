"""A wave's end (``scheduler_svc/wave_end.py``): with ``wave_end_yield_ms`` the loop lets the request streams take
their last messages before its release work, bounded; off by default. The loop runs against the real cache service
(in-process) and ``test_arrival_order``'s recording worker, its rounds stepped by hand."""

from __future__ import annotations

import queue
import threading
import time

import pytest
import structlog

from codeserve.v1 import scheduler_pb2
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.output import OutputStream
from scheduler_svc.request import StreamEnd
from scheduler_svc.scheduler import Scheduler
from scheduler_svc.validate import build_request
from scheduler_svc.wave_end import let_streams_take
from tests.scheduler.cache_service import cache_service
from tests.scheduler.test_arrival_order import TOKEN, RecordingWorker, tokens


def test_it_returns_once_every_queue_was_taken():
    qs = [queue.Queue() for _ in range(8)]
    for q in qs:
        q.put("last")
    taken = []
    threads = [threading.Thread(target=lambda q=q: (time.sleep(0.01), taken.append(q.get()))) for q in qs]
    for t in threads:
        t.start()
    waited = let_streams_take(qs, bound_s=5.0)
    for t in threads:
        t.join()
    assert taken == ["last"] * 8 and waited < 2.0


def test_it_gives_up_at_its_bound_when_nobody_takes():
    q = queue.Queue()
    q.put("last")
    waited = let_streams_take([q], bound_s=0.05)
    assert 0.05 <= waited < 1.0 and q.get_nowait() == "last"


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        let_streams_take([], bound_s=-1.0)
    with pytest.raises(ValueError):
        SchedulerConfig(wave_end_yield_ms=-1.0)


def _wave(tokenizer, yield_ms: float, reader: bool):
    """Two requests of 9 tokens ending in the same decode Forward; ``reader``: a thread reads each stream as the
    servicer's would (else nothing takes the messages until the end). Returns (streams' tokens, wave_end_yields,
    the longest round in seconds)."""
    with cache_service() as (_, cache):
        worker = RecordingWorker()
        sched = Scheduler(cache, worker, SchedulerConfig(decode_steps=8, overlap=True, overlap_mode="queued",
                                                         wave_end_yield_ms=yield_ms), structlog.get_logger())
        sched.connect()
        reqs = []
        for rid in ("a", "b"):
            req = build_request(scheduler_pb2.GenerateRequest(request_id=rid, input_ids=scheduler_pb2.TokenIds(
                ids=list(range(10, 30))), max_new_tokens=9, ignore_eos=True), tokenizer, sched.info, sched.capacity)
            req.stream = OutputStream(req, tokenizer, sched.info.eos_token_id, outbox=sched.outbox)
            sched.submit(req)
            reqs.append(req)
        got = {r.rid: [] for r in reqs}

        def read(req):
            while True:
                item = req.out.get(timeout=10)
                if isinstance(item, StreamEnd):
                    return
                got[req.rid].extend(item.token_ids)

        readers = [threading.Thread(target=read, args=(r,)) for r in reqs] if reader else []
        for t in readers:
            t.start()
        longest = 0.0
        while True:
            t0 = time.monotonic()
            if not sched.step():
                break
            longest = max(longest, time.monotonic() - t0)
        for t in readers:
            t.join()
        if not reader:
            for r in reqs:
                got[r.rid] = tokens(r)
        return got, sched.stats["wave_end_yields"], longest


@pytest.mark.parametrize("yield_ms", [0.0, 1000.0])
def test_a_wave_end_streams_the_same_tokens_with_or_without_the_yield(tokenizer, yield_ms):
    got, yields, longest = _wave(tokenizer, yield_ms, reader=True)
    assert got == {"a": [TOKEN] * 9, "b": [TOKEN] * 9}
    assert yields == (1 if yield_ms else 0)
    assert longest < 0.5  # the readers took the last messages: the loop went on well before its bound


def test_the_yield_is_bounded_when_no_stream_takes_its_message(tokenizer):
    got, yields, longest = _wave(tokenizer, 200.0, reader=False)
    assert got == {"a": [TOKEN] * 9, "b": [TOKEN] * 9} and yields == 1
    assert 0.2 <= longest < 5.0  # the round that applied the wave's end waited its bound once, not forever
