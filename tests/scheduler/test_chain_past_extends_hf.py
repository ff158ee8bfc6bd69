"""The decode chained past the extends (``chain.chain_past``) against transformers:
the real scheduler loop and cache service drive the real worker servicer and engine (in-process, fp32 on the CPU),
whose Forwards the test lets run in the order that makes the path happen: a decodes; b and c arrive while a's
decode D1 runs, so their extend is queued ahead of a's next decode D2; D2 had already started at the worker and runs
before that extend. The decode of a, b and c is then sent behind the extend before its reply, each row from its
last sample (a's from D2, b's and c's from the extend), and every greedy token equals transformers'.
"""

from __future__ import annotations

import threading

import pytest
import structlog

from scheduler_svc.scheduler import Scheduler, SchedulerConfig
from tests.scheduler import hf
from tests.scheduler.cache_service import cache_service
from tests.scheduler.test_arrival_order import submitter
from tests.scheduler.test_chunk_pipeline import ChunkWorker, ended, settled
from tests.worker.helpers import make_engine
from worker_svc.service import WorkerServicer


class _Context:
    """The servicer's view of a live call: ``abort`` raises what gRPC would."""

    def is_active(self) -> bool:
        return True

    def abort(self, code, details):
        raise AssertionError(f"Forward rejected: {code.name}: {details}")


class EngineWorker(ChunkWorker):
    """ChunkWorker whose ``answer(seq)`` hands Forward ``seq`` to a real engine (the worker's servicer, on a thread:
    it may wait there for the Forward it follows) and answers with its reply; ``run(seq)`` runs it without answering
    (the reply kept until ``deliver(seq)``)."""

    def __init__(self, engine) -> None:
        super().__init__()
        self.servicer = WorkerServicer(engine)
        self.ran: dict[int, threading.Thread] = {}
        self.kept: dict = {}

    def info(self):
        return self.servicer.Info(None, None)

    def run(self, seq: int, deliver: bool = False) -> None:
        request = next(r for r in self.sent if r.seq == seq)
        with self.changed:
            self.answered.add(seq)

        def forward() -> None:
            self.kept[seq] = self.servicer.Forward(request, _Context())
            if deliver:
                self.replies[seq].answer(self.kept[seq])

        self.ran[seq] = threading.Thread(target=forward, daemon=True)
        self.ran[seq].start()

    def deliver(self, seq: int) -> None:
        self.ran[seq].join()
        self.replies[seq].answer(self.kept[seq])

    def answer(self, seq: int) -> None:
        self.run(seq, deliver=True)


@pytest.fixture
def loop(tokenizer, model_path):
    with cache_service() as (core, cache):
        worker = EngineWorker(make_engine(model_path))
        sched = Scheduler(cache, worker, SchedulerConfig(chunk_size=64, decode_steps=1), structlog.get_logger())
        sched.connect()
        yield sched, worker, submitter(sched, tokenizer), core
        sched.stop("test over")


def test_the_decode_chained_past_the_extends_gives_transformers_greedy_tokens(loop, model_path):
    sched, worker, submit, core = loop
    prompts = {"a": [5, 17, 301, 44, 9], "b": [88, 12, 7, 250, 31, 3], "c": [61, 400, 2, 19, 77, 140, 8]}
    new = {"a": 6, "b": 3, "c": 4}
    a = submit("a", prompts["a"], new["a"])
    threading.Thread(target=sched.run, daemon=True).start()
    extend_a, d1 = worker.wait_sent(2)[:2]
    b, c = submit("b", prompts["b"], new["b"]), submit("c", prompts["c"], new["c"])
    worker.answer(extend_a.seq)
    d2, extend_bc = worker.wait_sent(4)[2:4]
    assert sorted(it.request_id for it in extend_bc.items) == ["b", "c"] and extend_bc.before_seq == d2.seq
    worker.run(d1.seq)
    worker.run(d2.seq)  # D2 reaches the engine before the extend: it runs first
    worker.deliver(d2.seq)
    worker.deliver(d1.seq)
    nxt = worker.wait_sent(5)[4]
    assert nxt.after_seq == extend_bc.seq and {it.request_id for it in nxt.items} == {"a", "b", "c"}
    assert sched.stats["decode_past_extends"] == 1
    with worker.changed:
        worker.hold = False
        pending = [s for s in worker.replies if s not in worker.answered]
    for seq in sorted(pending):
        worker.answer(seq)
    for rid, req in (("a", a), ("b", b), ("c", c)):
        assert ended(req) == (hf.greedy(model_path, prompts[rid], new[rid], eos=None)[0], "length"), rid
    settled(sched, core)
