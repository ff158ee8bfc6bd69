"""Mixed chunks (``SchedulerConfig.mixed_chunk``): decoding requests ride in an extend batch, one step each, with
their slots in the same round's Allocate, so a decode never stalls for a whole chunked prefill. The planner on
its own: the request table with a recording stand-in for the cache (this test is about the planner's plan and
its Allocate calls, not about the cache service; the end-to-end equality with transformers over mixed batches is
tests/scheduler/test_batching.py's)."""

import pytest
import structlog

from codeserve.v1 import cache_pb2, common_pb2
from scheduler_svc.admission import NewTokenRatio
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.errors import AllocationFailed
from scheduler_svc.intake import Intake
from scheduler_svc.planner import Planner
from scheduler_svc.request import Params, Req, State
from scheduler_svc.requests import RequestTable
from scheduler_svc.stats import Stats


class Cache:
    """Allocate hands out increasing slots and records each call; ``refuse_riders``: a call asking one slot for
    every request refuses (the riders' Allocate)."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, int]]] = []
        self.next_slot = 100
        self.refuse_riders = False

    def allocate(self, items):
        items = list(items)
        self.calls.append(items)
        if self.refuse_riders and all(n == 1 for _, n in items):
            raise AllocationFailed("pool full", None)
        results = []
        for rid, n in items:
            results.append(cache_pb2.AllocResult(request_id=rid, slot_ids=range(self.next_slot, self.next_slot + n)))
            self.next_slot += n
        return cache_pb2.AllocateResponse(results=results)

    def match(self, items):
        """Nothing cached; a roomy pool (the counters after the lock, as the admission budget reads them)."""
        free = cache_pb2.Counters(capacity=1 << 20, available=1 << 20)
        return cache_pb2.MatchResponse(receipt=cache_pb2.Receipt(after=free), results=[
            cache_pb2.MatchResult(request_id=it.request_id, cached_tokens=0) for it in items])


def _req(rid: str, prompt: int, max_new: int) -> Req:
    return Req(rid=rid, prompt_ids=list(range(1, prompt + 1)), params=Params(
        max_new_tokens=max_new, asked_max_new_tokens=max_new, sampling=common_pb2.SamplingParams(), ignore_eos=True))


@pytest.fixture
def parts():
    cache, intake = Cache(), Intake(16)
    table = RequestTable(cache, None, intake, structlog.get_logger())
    decoding, prefilling = _req("d", 10, 20), _req("p", 1000, 4)
    for r, state, kv in ((decoding, State.DECODE, 11), (prefilling, State.PREFILL, 512)):
        r.phase, r.kv_len, r.worker_knows = state, kv, True
        if r is decoding:
            r.output_ids = [7, 8]  # 10 prompt + 2 output; K/V of 11 written, token 8 is the next input
        table.running.append(r)

    def planner(mixed: bool) -> Planner:
        cfg = SchedulerConfig(chunk_size=512, mixed_chunk=mixed)
        return Planner(table, cache, cfg, NewTokenRatio(), Stats(), structlog.get_logger())

    return cache, decoding, prefilling, planner


def test_a_decoding_request_rides_in_the_extend_batch_one_step(parts):
    cache, decoding, prefilling, planner = parts
    batch = planner(True).extend()
    assert batch.kind == "extend"
    (chunk, rider) = batch.entries
    assert (chunk.req, chunk.start, chunk.n, chunk.sample) == (prefilling, 512, 488, True)
    assert (rider.req, rider.start, rider.n, rider.sample, rider.steps, rider.from_last) == (decoding, 11, 1, True, 1, False)
    assert cache.calls == [[("p", 488)], [("d", 1)]]
    assert rider.slot_ids == (588,)  # what the riders' Allocate delivered


def test_without_mixed_chunk_the_extend_batch_holds_only_prefill(parts):
    cache, decoding, prefilling, planner = parts
    batch = planner(False).extend()
    assert [e.req for e in batch.entries] == [prefilling] and cache.calls == [[("p", 488)]]


def test_no_rider_when_the_pool_cannot_fund_them_and_no_one_is_retracted(parts):
    cache, decoding, prefilling, planner = parts
    cache.refuse_riders = True
    batch = planner(True).extend()
    assert [e.req for e in batch.entries] == [prefilling]
    assert decoding.state == State.DECODE and decoding in planner(True).table.running


def test_admissions_while_forwards_are_in_flight_carry_no_rider(parts):
    """new_only: the decoding request is in a Forward in flight, so it must not ride in the arrival's extend."""
    cache, decoding, prefilling, planner = parts
    p = planner(True)
    arrival = _req("a", 30, 4)
    p.table.waiting.append(arrival)
    batch = p.extend(new_only=True)
    assert [(e.req, e.n) for e in batch.entries] == [(arrival, 30)]
    assert cache.calls == [[("a", 30)]]


def test_greedy_outputs_with_mixed_chunks_equal_transformers(tmp_path, model_path):
    """End to end (real cache, worker and scheduler processes, fp32 CPU): with --mixed-chunk and small chunks, short
    prompts decode while long ones are prefilled over several rounds, riding in their extend batches; every output
    equals transformers' greedy output and the pool ends settled."""
    import random

    from tests.scheduler import hf
    from tests.stack import Backend, generate_many

    rng = random.Random(5)
    reqs = [dict(input_ids=[rng.randrange(20, 1024) for _ in range(n)], max_new_tokens=m, ignore_eos=True)
            for n, m in ((5, 24), (9, 24), (300, 6), (7, 24), (450, 4), (260, 8))]
    with Backend.start(tmp_path, scheduler_args=("--mixed-chunk", "--chunk-size", "64")) as be:
        outs = generate_many(be.scheduler, reqs)
        for r, out in zip(reqs, outs):
            assert out.token_ids == hf.greedy(model_path, r["input_ids"], r["max_new_tokens"], eos=None)[0]
        be.idle_check()
