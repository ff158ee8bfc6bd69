"""Overlapped decode (the scheduler sends decode Forward N+1 before processing N): greedy output equals HF
token for token with K = 1 and K = 8 decode steps per Forward through batched decode with different
max_new_tokens, a stop token id and a stop string hit inside a Forward, an abort mid-decode, requests
arriving while others decode, and retraction in a tiny pool; after each, the pool is settled (no leaked
slot, integrity check empty). The same with ``--overlap-mode just-in-time`` (K = 8; the default is queued), with
``--no-deliver-after-send`` and with ``--chain-depth 2`` (retraction too). The synchronous path
(--no-overlap) gives the same output."""

import json
import random
import threading
import time

import pytest

from codeserve.v1 import scheduler_pb2
from tests.scheduler import hf, test_small_pool
from tests.scheduler.test_small_pool import test_pool_too_small_for_everyone_retracts_and_outputs_stay_equal  # noqa: F401
from tests.stack import Backend, generate_many, request


@pytest.fixture(scope="module")
def k8(tmp_path_factory, model_path):
    with Backend.start(tmp_path_factory.mktemp("overlap-k8-logs"), model_path=model_path, max_running_requests=16,
                       scheduler_args=("--decode-steps", "8")) as be:
        yield be


@pytest.fixture(scope="module")
def k1(tmp_path_factory, model_path):
    with Backend.start(tmp_path_factory.mktemp("overlap-k1-logs"), model_path=model_path, max_running_requests=16,
                       scheduler_args=("--decode-steps", "1")) as be:
        yield be


@pytest.fixture(scope="module")
def k8j(tmp_path_factory, model_path):
    """K = 8 with ``--overlap-mode just-in-time``: N+1 sent when N's reply is in (the default is queued)."""
    with Backend.start(tmp_path_factory.mktemp("overlap-k8j-logs"), model_path=model_path, max_running_requests=16,
                       scheduler_args=("--decode-steps", "8", "--overlap-mode", "just-in-time")) as be:
        yield be


@pytest.fixture(scope="module")
def k8n(tmp_path_factory, model_path):
    """K = 8 with ``--no-deliver-after-send``: a chained decode's messages go to their streams at once (outbox off)."""
    with Backend.start(tmp_path_factory.mktemp("overlap-k8n-logs"), model_path=model_path, max_running_requests=16,
                       scheduler_args=("--decode-steps", "8", "--no-deliver-after-send")) as be:
        yield be


@pytest.fixture(scope="module")
def k8d(tmp_path_factory, model_path):
    """K = 8 with ``--chain-depth 2``: N+2 sent once N's reply is in, before N is applied (``chain.chain_ahead``)."""
    with Backend.start(tmp_path_factory.mktemp("overlap-k8d-logs"), model_path=model_path, max_running_requests=16,
                       scheduler_args=("--decode-steps", "8", "--chain-depth", "2")) as be:
        yield be


@pytest.fixture(scope="module", params=[1, 2], ids=["depth1", "depth2"])
def small(request, tmp_path_factory, model_path):
    """The small-pool retraction test again, with K = 8 and overlap, at chain depth 1 and 2."""
    with Backend.start(tmp_path_factory.mktemp("overlap-small-logs"), model_path=model_path,
                       kv_tokens=test_small_pool.CAPACITY, chunk_size=test_small_pool.CHUNK, max_running_requests=16,
                       policy="lpm", scheduler_args=("--decode-steps", "8", "--chain-depth", str(request.param))) as be:
        yield be


@pytest.fixture(params=["k1", "k8", "k8j", "k8n", "k8d"])
def be(request):
    return request.getfixturevalue(request.param)


def stats(be: Backend) -> dict:
    """The scheduler's latest cumulative loop_stats (logged at most every 2 s: wait before reading)."""
    time.sleep(2.6)
    lines = [ln for ln in be.stack.log_tail("scheduler", 1 << 22).splitlines() if '"event": "loop_stats"' in ln]
    return json.loads(lines[-1]) if lines else {}


def prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(20, 1024) for _ in range(rng.randrange(5, 40))] for _ in range(n)]


def test_batched_decode_with_different_max_new_tokens_equals_hf_and_chains(be, model_path):
    before = stats(be).get("decode_chained", 0)
    reqs = [dict(input_ids=p, max_new_tokens=m, ignore_eos=True, return_logprob=True)
            for p, m in zip(prompts(1, 8), [1, 3, 8, 9, 16, 17, 24, 30])]
    outs = generate_many(be.scheduler, reqs)
    for r, out in zip(reqs, outs):
        expected, lps = hf.greedy(model_path, r["input_ids"], r["max_new_tokens"], eos=None)
        assert out.token_ids == expected
        assert out.logprobs == pytest.approx(lps, abs=1e-4)
        assert (out.finish_reason, out.completion_tokens) == ("length", r["max_new_tokens"])
    be.idle_check()
    assert stats(be)["decode_chained"] > before, "no Forward was sent ahead: the test tests nothing new"


def test_stop_token_id_inside_a_forward_while_others_continue(be, model_path):
    dropped = stats(be).get("decode_dropped", 0)
    ps = prompts(2, 4)
    base = hf.greedy(model_path, ps[0], 20, eos=None)[0]
    k = next(i for i in range(5, len(base)) if base[i] not in base[:i])  # its first stop is past the extend
    target = base[k]
    reqs = [dict(input_ids=ps[0], max_new_tokens=20, ignore_eos=True, stop_token_ids=[target])]
    reqs += [dict(input_ids=p, max_new_tokens=20, ignore_eos=True) for p in ps[1:]]
    outs = generate_many(be.scheduler, reqs)
    assert outs[0].token_ids == base[: k + 1]
    assert (outs[0].finish_reason, outs[0].matched_stop) == ("stop", str(target))
    for r, out in zip(reqs[1:], outs[1:]):
        assert out.token_ids == hf.greedy(model_path, r["input_ids"], 20, eos=None)[0]
    be.idle_check()
    assert stats(be)["decode_dropped"] > dropped, "the stopped request was never in a Forward sent ahead"


def test_stop_string_inside_a_forward_while_others_continue(be, model_path, tokenizer):
    dropped = stats(be).get("decode_dropped", 0)
    ps = prompts(3, 4)
    base = hf.greedy(model_path, ps[0], 24, eos=None)[0]
    text = tokenizer.decode(base, skip_special_tokens=False)
    start = len(tokenizer.decode(base[:6], skip_special_tokens=False))  # its first match is past the extend
    stop = next(text[i:i + 2] for i in range(start, len(text) - 2)
                if "\ufffd" not in text[i:i + 2] and text[i:i + 2].strip() and text.find(text[i:i + 2]) == i)
    reqs = [dict(input_ids=ps[0], max_new_tokens=24, ignore_eos=True, stop=[stop])]
    reqs += [dict(input_ids=p, max_new_tokens=24, ignore_eos=True) for p in ps[1:]]
    outs = generate_many(be.scheduler, reqs)
    out = outs[0]
    assert (out.finish_reason, out.matched_stop) == ("stop", stop)
    assert out.token_ids == base[: len(out.token_ids)]
    assert stop in tokenizer.decode(out.token_ids, skip_special_tokens=False)
    assert stop not in tokenizer.decode(out.token_ids[:-1], skip_special_tokens=False)
    assert out.text == text[: text.find(stop)]
    for r, o in zip(reqs[1:], outs[1:]):
        assert o.token_ids == hf.greedy(model_path, r["input_ids"], 24, eos=None)[0]
    be.idle_check()
    assert stats(be)["decode_dropped"] > dropped, "the stopped request was never in a Forward sent ahead"


def test_abort_mid_decode_frees_its_slots_and_others_are_unchanged(be, model_path):
    ps = prompts(4, 4)
    others: list = []
    t = threading.Thread(target=lambda: others.extend(generate_many(
        be.scheduler, [dict(input_ids=p, max_new_tokens=40, ignore_eos=True) for p in ps[1:]])))
    stream = be.scheduler.Generate(request(input_ids=ps[0], max_new_tokens=3000, ignore_eos=True, request_id="ov-ab"))
    t.start()
    got = list(next(stream).token_ids)
    while len(got) < 10:
        got += next(stream).token_ids
    assert be.scheduler.Abort(scheduler_pb2.AbortRequest(request_id="ov-ab")).found
    rest = list(stream)
    assert rest[-1].finish_reason == "abort"
    got += [tok for m in rest for tok in m.token_ids]
    assert got == hf.greedy(model_path, ps[0], len(got), eos=None)[0]
    t.join(120)
    for p, out in zip(ps[1:], others):
        assert out.token_ids == hf.greedy(model_path, p, 40, eos=None)[0]
    be.idle_check()


def test_requests_arriving_while_others_decode_equal_hf(be, model_path):
    ps = prompts(5, 8)
    first: list = []
    t = threading.Thread(target=lambda: first.extend(generate_many(
        be.scheduler, [dict(input_ids=p, max_new_tokens=48, ignore_eos=True) for p in ps[:4]])))
    t.start()
    probe = be.scheduler.Generate(request(input_ids=ps[4], max_new_tokens=48, ignore_eos=True))
    probe_ids = list(next(probe).token_ids)
    while len(probe_ids) < 9:  # decode is under way: now the others arrive
        probe_ids += next(probe).token_ids
    later = generate_many(be.scheduler, [dict(input_ids=p, max_new_tokens=12, ignore_eos=True) for p in ps[5:]])
    probe_ids += [tok for m in probe for tok in m.token_ids]
    t.join(120)
    assert probe_ids == hf.greedy(model_path, ps[4], 48, eos=None)[0]
    for p, out in zip(ps[:4], first):
        assert out.token_ids == hf.greedy(model_path, p, 48, eos=None)[0]
    for p, out in zip(ps[5:], later):
        assert out.token_ids == hf.greedy(model_path, p, 12, eos=None)[0]
    be.idle_check()


def test_no_overlap_flag_takes_the_synchronous_path_with_the_same_output(tmp_path_factory, model_path, k8):
    reqs = [dict(input_ids=p, max_new_tokens=m, ignore_eos=True) for p, m in zip(prompts(6, 4), [5, 9, 17, 20])]
    with Backend.start(tmp_path_factory.mktemp("no-overlap-logs"), model_path=model_path,
                       scheduler_args=("--decode-steps", "8", "--no-overlap")) as off:
        sync = generate_many(off.scheduler, reqs)
        off.idle_check()
        st = stats(off)
        assert st["decode_chained"] == 0 and st["decode_batches"] > 0
    assert [o.token_ids for o in sync] == [o.token_ids for o in generate_many(k8.scheduler, reqs)]
    k8.idle_check()


def test_a_request_with_penalties_runs_next_to_multistep_ones(k8, model_path):
    """A request that needs per-step host work (penalties) makes its decode rounds single-step for the batch
    (the worker takes multi-step batches of eligible items only); outputs equal their solo runs."""
    ps = prompts(7, 3)
    pen = dict(input_ids=ps[0], max_new_tokens=16, ignore_eos=True)
    pen_req = request(**pen)
    pen_req.sampling.repetition_penalty = 1.3
    solo = list(k8.scheduler.Generate(pen_req, timeout=60))
    others: list = []
    t = threading.Thread(target=lambda: others.extend(generate_many(
        k8.scheduler, [dict(input_ids=p, max_new_tokens=24, ignore_eos=True) for p in ps[1:]])))
    t.start()
    together = list(k8.scheduler.Generate(pen_req, timeout=60))
    t.join(120)
    assert [x for m in together for x in m.token_ids] == [x for m in solo for x in m.token_ids]
    for p, out in zip(ps[1:], others):
        assert out.token_ids == hf.greedy(model_path, p, 24, eos=None)[0]
    k8.idle_check()


def test_chain_depth_2_sends_the_next_decode_before_applying_the_one_in(k8d, model_path):
    """``--chain-depth 2``: decode N+2 goes to the worker once N's reply is in, before N is applied; every token
    still equals HF, budgets that end inside N+1 or N+2 are exact (N's tokens counted: no Forward holds a request
    past its budget, so nothing is dropped), and the pool settles."""
    before, dropped = stats(k8d).get("decode_chained_ahead", 0), stats(k8d).get("decode_dropped", 0)
    reqs = [dict(input_ids=p, max_new_tokens=m, ignore_eos=True) for p, m in zip(prompts(8, 5), [2, 10, 17, 25, 41])]
    outs = generate_many(k8d.scheduler, reqs)
    for r, out in zip(reqs, outs):
        assert out.token_ids == hf.greedy(model_path, r["input_ids"], r["max_new_tokens"], eos=None)[0]
        assert (out.finish_reason, out.completion_tokens) == ("length", r["max_new_tokens"])
    k8d.idle_check()
    after = stats(k8d)
    assert after["decode_chained_ahead"] > before, "no decode was sent before the one ahead was applied"
    assert after["decode_dropped"] == dropped, "a Forward was sent for a request past its max_new_tokens"
