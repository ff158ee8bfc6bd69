"""The first decode Forward chained behind the extend that ends every prefill (``chain.can_chain``,
``cfg.chain_after_extend``): it reaches the worker while that extend runs, each request's entry from the token the
extend samples (``input_from_last_sample``) at the position where its prompt ends, no prefix carried (the extend
creates the request at the worker). Before, the loop applied the extend's reply, then allocated and sent the
decode: the device idled 14-18 ms after the last extend of every wave (H100 run 21, 1B c64).

In-process: the real cache service and a worker that holds each reply until the test answers it
(``test_chunk_pipeline.ChunkWorker``): "while the extend runs" is a state. End to end (real worker, gateway-less
stack): greedy tokens equal transformers' with the chain on and off, decode steps 1 and 8, and the pool settles.
"""

from __future__ import annotations

import threading

import pytest
import structlog

from scheduler_svc.scheduler import Scheduler, SchedulerConfig
from tests.scheduler import hf
from tests.scheduler.cache_service import cache_service
from tests.scheduler.test_arrival_order import submitter
from tests.scheduler.test_chunk_pipeline import CHUNK, TOKEN, WAIT_S, ChunkWorker, ended, settled
from tests.scheduler.test_overlap import prompts, stats
from tests.stack import Backend, generate_many


@pytest.fixture(params=[True, False], ids=["chain", "no-chain"])
def loop(tokenizer, request):
    with cache_service() as (core, cache):
        worker = ChunkWorker()
        cfg = SchedulerConfig(chunk_size=CHUNK, decode_steps=1, chain_after_extend=request.param)
        sched = Scheduler(cache, worker, cfg, structlog.get_logger())
        sched.connect()
        yield sched, worker, submitter(sched, tokenizer), core, request.param
        sched.stop("test over")


def _running(sched):
    threading.Thread(target=sched.run, daemon=True).start()


@pytest.mark.parametrize("length", [5, 3 * CHUNK + 4], ids=["one-chunk", "three-chunks"])
def test_the_first_decode_is_sent_behind_the_last_chunk_before_its_reply(loop, length):
    sched, worker, submit, core, chain = loop
    a = submit("a", list(range(100, 100 + length)), 4)
    _running(sched)
    chunks = -(-length // CHUNK)
    for i in range(chunks - 1):  # the chunks before the last one, each sent behind the one before (pipelined)
        worker.wait_sent(i + 2)
        worker.answer(worker.sent[i].seq)
    last = worker.wait_sent(chunks)[chunks - 1]
    assert [it.request_id for it in last.items] == ["a"] and last.items[0].sample
    if chain:
        decode = worker.wait_sent(chunks + 1)[chunks]
        assert last.seq not in worker.answered  # sent while the last chunk runs
        assert decode.after_seq == last.seq
        (it,) = decode.items
        assert it.input_from_last_sample and it.sample and not it.input_ids and not it.has_prefix
        assert it.position_start == length and len(it.slot_ids) == 1
    else:
        with worker.changed:  # nothing follows the last chunk until its reply is applied
            assert not worker.changed.wait_for(lambda: len(worker.sent) > chunks, 0.5)
    with worker.changed:
        worker.hold = False
        pending = [s for s in worker.replies if s not in worker.answered]
    for seq in pending:
        worker.answer(seq)
    assert ended(a) == ([TOKEN] * 4, "length")
    settled(sched, core)
    assert sched.stats["decode_after_extend"] == (1 if chain else 0)


def test_no_decode_is_chained_behind_an_extend_whose_prefill_goes_on(loop):
    """A prompt of three chunks: behind chunk 1 comes chunk 2 (pipelined), never a decode."""
    sched, worker, submit, core, _ = loop
    a = submit("a", list(range(100, 100 + 3 * CHUNK)), 2)
    _running(sched)
    second = worker.wait_sent(2)[1]
    assert [(it.request_id, it.input_from_last_sample) for it in second.items] == [("a", False)]
    assert not second.items[0].sample
    with worker.changed:
        worker.hold = False
        pending = [s for s in worker.replies if s not in worker.answered]
    for seq in pending:
        worker.answer(seq)
    assert ended(a) == ([TOKEN] * 2, "length")
    settled(sched, core)


@pytest.mark.parametrize("steps", ["1", "8"])
def test_greedy_tokens_equal_hf_with_the_chain_on_and_off(tmp_path_factory, model_path, steps):
    """Real worker: prompts of uneven lengths (several in one extend, some over two chunks), different
    max_new_tokens (one of 1: nothing continues for it), logprobs; both ways equal HF, the pool settles."""
    reqs = [dict(input_ids=p, max_new_tokens=m, ignore_eos=True, return_logprob=True)
            for p, m in zip(prompts(21, 6), [1, 2, 7, 9, 16, 3])]
    outs, chained = [], []
    for flag in ("--chain-after-extend", "--no-chain-after-extend"):
        with Backend.start(tmp_path_factory.mktemp(f"after-extend-{steps}{flag}"), model_path=model_path,
                           chunk_size=24, scheduler_args=("--decode-steps", steps, flag)) as be:
            outs.append([o.token_ids for o in generate_many(be.scheduler, reqs)])
            be.idle_check()
            chained.append(stats(be)["decode_after_extend"])
    assert outs[0] == outs[1]
    for p, r, got in zip(prompts(21, 6), reqs, outs[0]):
        assert got == hf.greedy(model_path, p, r["max_new_tokens"], eos=None)[0]
    assert chained[0] > 0 and chained[1] == 0


@pytest.mark.parametrize("loop", [True], indirect=True, ids=["chain"])
def test_arrivals_while_the_chained_extend_runs_are_admitted_together_after_it(loop):
    """b and c arrive while a's extend runs with a's first decode chained behind it: neither is admitted one by one
    meanwhile (a burst of arrivals would become one extend each); after a's reply both go in one extend."""
    sched, worker, submit, core, _ = loop
    a = submit("a", list(range(100, 105)), 3)
    _running(sched)
    extend_a, _ = worker.wait_sent(2)[:2]
    b, c = submit("b", list(range(200, 206)), 2), submit("c", list(range(300, 307)), 2)
    with worker.changed:
        assert not worker.changed.wait_for(lambda: len(worker.sent) > 2, 0.5)
    worker.answer(extend_a.seq)
    sent = worker.wait_sent(4)  # a's next decode (chained), then the arrivals' extend ahead of it
    assert [it.request_id for it in sent[2].items] == ["a"] and sent[2].items[0].input_from_last_sample
    assert sorted(it.request_id for it in sent[3].items) == ["b", "c"] and sent[3].before_seq == sent[2].seq
    with worker.changed:
        worker.hold = False
        pending = [s for s in worker.replies if s not in worker.answered]
    for seq in pending:
        worker.answer(seq)
    assert [ended(r) for r in (a, b, c)] == [([TOKEN] * 3, "length"), ([TOKEN] * 2, "length"), ([TOKEN] * 2, "length")]
    settled(sched, core)


@pytest.mark.parametrize("loop", [True], indirect=True, ids=["chain"])
def test_the_decode_of_all_is_sent_behind_the_last_extend_when_the_decode_queued_after_it_ran_first(loop):
    """The start of a wave (H100 run 29, 1B c64): a decodes; b and c arrive and their extend is sent ahead of a's
    queued decode D2, which had already started at the worker and ran first (its reply comes before the extend's).
    The decode of a, b and c is sent behind that extend while it runs (each from its last sample), not after both
    replies are applied (before: nothing followed the extend until its reply, ~11 ms of idle device a wave)."""
    sched, worker, submit, core, _ = loop
    a = submit("a", list(range(100, 105)), 6)
    _running(sched)
    extend_a, _ = worker.wait_sent(2)[:2]
    b, c = submit("b", list(range(200, 206)), 2), submit("c", list(range(300, 307)), 2)
    worker.answer(extend_a.seq)
    sent = worker.wait_sent(4)
    d1, d2, extend_bc = sent[1], sent[2], sent[3]
    assert sorted(it.request_id for it in extend_bc.items) == ["b", "c"] and extend_bc.before_seq == d2.seq
    worker.answer(d2.seq)  # D2 started before the extend reached the worker: it ran first
    worker.answer(d1.seq)
    nxt = worker.wait_sent(5)[4]
    assert extend_bc.seq not in worker.answered  # sent while the extend runs
    assert nxt.after_seq == extend_bc.seq
    assert sorted((it.request_id, it.input_from_last_sample) for it in nxt.items) == [
        ("a", True), ("b", True), ("c", True)]
    starts = {it.request_id: it.position_start for it in nxt.items}
    assert starts == {"a": 5 + 2, "b": 6, "c": 7}  # a: after D1 and D2's tokens; b, c: their prompts' ends
    with worker.changed:
        worker.hold = False
        pending = [s for s in worker.replies if s not in worker.answered]
    for seq in pending:
        worker.answer(seq)
    assert [ended(r) for r in (a, b, c)] == [([TOKEN] * 6, "length"), ([TOKEN] * 2, "length"), ([TOKEN] * 2, "length")]
    settled(sched, core)
    assert sched.stats["decode_past_extends"] == 1


@pytest.mark.parametrize("loop", [True], indirect=True, ids=["chain"])
def test_an_arrival_while_the_extend_runs_after_the_decode_chained_past_it_goes_after_that_extend(loop):
    """As above, then d arrives while the extend of b and c runs: its extend follows that extend (``after_seq``, so the
    worker may launch it behind it) and goes ahead of the decode chained past it, not after a's decode D2, whose reply
    was in (the review of session 30: the worker would then make it wait for the extend's commit)."""
    sched, worker, submit, core, _ = loop
    a = submit("a", list(range(100, 105)), 6)
    _running(sched)
    extend_a, _ = worker.wait_sent(2)[:2]
    b, c = submit("b", list(range(200, 206)), 2), submit("c", list(range(300, 307)), 2)
    worker.answer(extend_a.seq)
    d1, d2, extend_bc = worker.wait_sent(4)[1:4]
    worker.answer(d2.seq)
    worker.answer(d1.seq)
    nxt = worker.wait_sent(5)[4]
    assert nxt.after_seq == extend_bc.seq
    d = submit("d", list(range(400, 405)), 2)
    extend_d = worker.wait_sent(6)[5]
    assert [it.request_id for it in extend_d.items] == ["d"]
    assert (extend_d.after_seq, extend_d.before_seq) == (extend_bc.seq, nxt.seq)
    with worker.changed:
        worker.hold = False
        pending = [s for s in worker.replies if s not in worker.answered]
    for seq in pending:
        worker.answer(seq)
    assert [ended(r) for r in (a, b, c, d)] == [([TOKEN] * 6, "length"), ([TOKEN] * 2, "length"),
                                                ([TOKEN] * 2, "length"), ([TOKEN] * 2, "length")]
    settled(sched, core)
