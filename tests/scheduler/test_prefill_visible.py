"""A running request's prompt is visible to a router's ProbePrefix as soon as its prefill is written (issue 11),
not only at finish: ``RequestTable.cache_prefilled`` inserts it with one CacheRequests(finished=false) per
applied Forward, and the cache never remaps the request's slots (the worker's slot table stays right).

The table on its own (a recording cache) and the real back end (cache, worker, scheduler processes, pages of
16): probed while decoding, greedy output equal to transformers, no double insert or leak at finish, and
abort and retract of such a request.
"""

import random
import time

import pytest
import structlog

from codeserve.v1 import cache_pb2, common_pb2
from scheduler_svc.intake import Intake
from scheduler_svc.output import OutputStream
from scheduler_svc.request import Finish, Params, Req
from scheduler_svc.requests import RequestTable
from tests.scheduler import hf
from tests.stack import Backend, generate_many, request

PAGE = 16


class Recorder:
    """Stands in for CacheClient and WorkerClient: records every CacheRequests batch with its finished flags."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, list[int], bool]]] = []

    def cache_requests(self, items):
        self.batches.append([(it.request_id, list(it.token_ids), it.finished) for it in items])

    def defer_cache(self, items):
        if items:
            self.cache_requests(items)

    def defer_release(self, rids):
        pass

    deferred_ends = 0  # its defer_* send at once

    def flush_deferred(self) -> None:
        pass

    def release_requests(self, rids):
        pass

    def release(self, rids):
        pass


def test_prefills_of_one_reply_are_inserted_in_one_rpc_and_finished_or_aborted_ones_skipped(tokenizer):
    rec, intake = Recorder(), Intake(16)
    table = RequestTable(rec, rec, intake, structlog.get_logger())
    reqs = {}
    for rid in "abcd":
        req = Req(rid=rid, prompt_ids=[5, 6, 7], params=Params(max_new_tokens=4, asked_max_new_tokens=4,
                                                               sampling=common_pb2.SamplingParams(), ignore_eos=True))
        req.stream = OutputStream(req, tokenizer, 0)
        intake.submit(req, len(table.waiting))
        reqs[rid] = req
    table.take_new()
    for req in reqs.values():
        table.admit(req, 0, [])
        req.kv_len, req.worker_knows = 3, True
        table.prefill_done(req)
    reqs["c"].stream.finish_without_token(Finish.LENGTH)   # finished in the same reply: its finish caches it
    intake.abort("d", "test")                               # an abort pending: the abort caches it
    assert table.cache_prefilled() == 2
    assert rec.batches == [[("a", [5, 6, 7], False), ("b", [5, 6, 7], False)]]
    assert table.cache_prefilled() == 0 and len(rec.batches) == 1   # each prefill is inserted once


@pytest.fixture(scope="module")
def paged(tmp_path_factory, model_path):
    with Backend.start(tmp_path_factory.mktemp("prefill-visible-logs"), model_path=model_path, kv_tokens=1024,
                       page_size=PAGE, chunk_size=64, max_running_requests=8) as be:
        yield be


def probe(be: Backend, tokens: list[int]) -> int:
    reply = be.cache.ProbePrefix(cache_pb2.ProbePrefixRequest(token_ids=tokens, pool_ids=[be.pool_id]), timeout=10)
    return reply.pools[0].cached_tokens


def wait_probe(be: Backend, tokens: list[int], want: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while probe(be, tokens) != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"ProbePrefix reports {probe(be, tokens)} cached tokens, not {want}")
        time.sleep(0.02)


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(20, 1024) for _ in range(n)]


def test_a_decoding_request_is_probed_with_its_whole_prompt_pages_and_finishes_without_leak(paged, model_path):
    ids = prompt(1, 150)                                                     # 9 whole pages and 6 tokens
    paged.idle_check()                                                       # an empty tree to start from
    stream = paged.scheduler.Generate(request(input_ids=ids, max_new_tokens=600, ignore_eos=True), timeout=120)
    got = list(next(stream).token_ids)
    wait_probe(paged, ids, 144)                                              # while it decodes
    assert paged.load().running == 1
    c = paged.counters()
    assert c.protected >= 144 and c.evictable == 0                          # locked by the running request
    for msg in stream:
        got += msg.token_ids
    assert got == hf.greedy(model_path, ids, 600, eos=None)[0]
    paged.wait_idle()
    written = ids + got[:-1]                                                 # the last token's K/V is not written
    c = paged.counters()
    assert (c.owned, c.protected, c.cached) == (0, 0, len(written) - len(written) % PAGE)  # inserted once
    assert probe(paged, written) == len(written) - len(written) % PAGE
    paged.idle_check()


def test_identical_prompts_in_one_burst_share_the_prefix_without_remap(paged, model_path):
    """Four equal prompts admitted together (all matched nothing): the first prefill inserts the prompt, the
    others keep their own slots (no remap) and are freed of their duplicates at finish."""
    ids = prompt(2, 100)
    outs = generate_many(paged.scheduler, [dict(input_ids=ids, max_new_tokens=40, ignore_eos=True)] * 4)
    expected = hf.greedy(model_path, ids, 40, eos=None)[0]
    assert [o.token_ids for o in outs] == [expected] * 4
    assert probe(paged, ids) == 96
    paged.idle_check()


def test_abort_of_a_decoding_request_keeps_its_prompt_and_leaks_nothing(paged):
    ids = prompt(3, 120)
    stream = paged.scheduler.Generate(request(input_ids=ids, max_new_tokens=2000, ignore_eos=True), timeout=120)
    next(stream)
    wait_probe(paged, ids, 112)
    stream.cancel()
    paged.wait_idle()
    assert probe(paged, ids) == 112 and paged.counters().protected == 0
    paged.idle_check()


def test_retracted_decoding_requests_recompute_the_same_output(paged, model_path):
    """Four requests of 150 + 250 tokens in a 1,024-token pool: decodes run out of pages, some are retracted
    after their prompt was inserted mid-run, recomputed, and every output equals transformers."""
    log_before = paged.stack.log_tail("scheduler", 1_000_000).count('"event": "retracted"')
    reqs = [dict(input_ids=prompt(10 + i, 150), max_new_tokens=250, ignore_eos=True) for i in range(4)]
    outs = generate_many(paged.scheduler, reqs)
    for r, out in zip(reqs, outs):
        assert out.token_ids == hf.greedy(model_path, r["input_ids"], 250, eos=None)[0]
    assert paged.stack.log_tail("scheduler", 1_000_000).count('"event": "retracted"') > log_before
    paged.idle_check()
