"""Overlapped decode on the worker: ``input_from_last_sample`` (the input is the token this worker sampled
last), skipped continuations of requests that stopped at a stop token, the position check of a predicted
position_start, and ``after_seq`` ordering of Forwards that reach the worker early."""

from __future__ import annotations

import threading

import grpc
import pytest

from codeserve.v1 import worker_pb2, worker_pb2_grpc
from common import grpc_server
from tests.worker.helpers import hf_greedy, make_engine
from worker_svc import service
from worker_svc.sampler import SamplingParams
from worker_svc.types import ForwardItem, WorkerError

MAX_NEW = 12


@pytest.fixture(scope="module")
def refs(hf_model, prompts):
    return [hf_greedy(hf_model, p, MAX_NEW) for p in prompts[:3]]


def _prefill(eng, prompts, free, **kw):
    items = [ForwardItem(request_id=f"r{i}", input_ids=tuple(p), position_start=0,
                         slot_ids=tuple(next(free) for _ in p), has_prefix=True, return_logprob=True, **kw)
             for i, p in enumerate(prompts)]
    return eng.forward(items, "epoch-1").outputs


@pytest.mark.parametrize("steps", [1, 4])
def test_input_from_last_sample_equals_sending_the_token(model_dir, prompts, refs, steps):
    """Decoding with input_from_last_sample items gives the same tokens and logprobs as sending the
    sampled token explicitly, and equals HF; the worker's token history holds the real ids."""
    outs = {}
    for from_last in (False, True):
        eng = make_engine(model_dir)
        free = iter(range(1, eng.kv_pool.pool_slots))
        res = _prefill(eng, prompts[:3], free)
        toks = [[o.next_token_id] for o in res]
        lps = [[o.logprob] for o in res]
        pos = [len(p) for p in prompts[:3]]
        while len(toks[0]) < MAX_NEW:
            k = min(steps, MAX_NEW - len(toks[0]))
            batch = [ForwardItem(request_id=f"r{i}", input_ids=() if from_last else (toks[i][-1],),
                                 position_start=pos[i], slot_ids=tuple(next(free) for _ in range(k)),
                                 decode_steps=k, return_logprob=True, input_from_last_sample=from_last)
                     for i in range(3)]
            for i, o in enumerate(eng.forward(batch, "epoch-1").outputs):
                got = o.next_token_ids if k > 1 else (o.next_token_id,)
                toks[i] += got
                lps[i] += o.logprobs if k > 1 else (o.logprob,)
                pos[i] += len(got)
        for i, p in enumerate(prompts[:3]):
            assert eng.requests[f"r{i}"].tokens == list(p) + toks[i][:-1]
        outs[from_last] = (toks, lps)
    assert outs[True][0] == outs[False][0]
    assert outs[True][1] == outs[False][1]
    for i, (ref_ids, _) in enumerate(refs):
        assert outs[True][0][i] == ref_ids


def test_input_from_last_sample_with_penalties_uses_the_kept_token_in_the_history(model_dir, prompts):
    """Single-step path with penalties: the history includes the kept token, as when it is sent explicitly."""
    params = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5)
    outs = []
    for from_last in (False, True):
        eng = make_engine(model_dir)
        free = iter(range(1, eng.kv_pool.pool_slots))
        (o,) = _prefill(eng, prompts[:1], free, sampling=params)
        toks, pos = [o.next_token_id], len(prompts[0])
        for _ in range(8):
            (o,) = eng.forward([ForwardItem("r0", () if from_last else (toks[-1],), pos, (next(free),),
                                            sampling=params, input_from_last_sample=from_last)], "epoch-1").outputs
            toks.append(o.next_token_id)
            pos += 1
        outs.append(toks)
    assert outs[0] == outs[1]


@pytest.mark.parametrize("steps", [1, 4])
def test_continuation_after_a_stop_token_is_skipped_and_changes_nothing(model_dir, prompts, refs, steps):
    """The request's Forward ends at a stop token; the continuation sent before the scheduler knew is
    answered skipped, writes nothing and commits nothing; another request in the batch runs normally."""
    ref0, ref1 = refs[0][0], refs[1][0]
    stop = ref0[1]  # the second generated token of r0 (the first decode step samples it)
    eng = make_engine(model_dir)
    free = iter(range(1, eng.kv_pool.pool_slots))
    _prefill(eng, prompts[:2], free)
    pos = [len(p) for p in prompts[:2]]
    first = [ForwardItem(f"r{i}", (refs[i][0][0],), pos[i], tuple(next(free) for _ in range(steps)), decode_steps=steps,
                         stop_token_ids=(stop,) if i == 0 else ()) for i in range(2)]
    res = eng.forward(first, "epoch-1").outputs
    assert res[0].next_token_id == stop and eng.requests["r0"].stopped
    n1 = len(res[1].next_token_ids) if steps > 1 else 1
    held0 = list(eng.requests["r0"].tokens)
    pool_before = eng.kv_pool.k[0].clone()
    cont = [ForwardItem(f"r{i}", (), pos[i] + steps, tuple(next(free) for _ in range(steps)), decode_steps=steps,
                        input_from_last_sample=True) for i in range(2)]
    out0, out1 = eng.forward(cont, "epoch-1").outputs
    assert out0.skipped and not out0.sampled and out0.next_token_ids == ()
    assert eng.requests["r0"].tokens == held0 and len(eng.requests["r0"].slots) == pos[0] + 1
    assert all(bool((eng.kv_pool.k[0][s] == pool_before[s]).all()) for s in cont[0].slot_ids)
    assert not out1.skipped and out1.sampled
    got1 = [refs[1][0][0]] + list(res[1].next_token_ids if steps > 1 else (res[1].next_token_id,))
    got1 += list(out1.next_token_ids if steps > 1 else (out1.next_token_id,))
    assert got1 == ref1[: len(got1)]
    assert len(eng.requests["r1"].slots) == pos[1] + n1 + (len(out1.next_token_ids) if steps > 1 else 1)


def test_predicted_position_that_differs_is_invalid_argument_and_changes_nothing(model_dir, prompts):
    eng = make_engine(model_dir)
    free = iter(range(1, eng.kv_pool.pool_slots))
    _prefill(eng, prompts[:1], free)
    held = len(prompts[0])
    state = eng.requests["r0"]
    before = (list(state.tokens), len(state.slots), state.last_token)
    with pytest.raises(WorkerError) as err:
        eng.forward([ForwardItem("r0", (), held + 3, (next(free),), input_from_last_sample=True)], "epoch-1")
    assert err.value.code == "INVALID_ARGUMENT"
    assert f"position_start {held + 3}" in err.value.message and f"holds {held} tokens" in err.value.message
    assert (list(state.tokens), len(state.slots), state.last_token) == before


@pytest.mark.parametrize("item, code, reason", [
    (ForwardItem("r0", (5,), 0, (900,), input_from_last_sample=True), "INVALID_ARGUMENT", "no input_ids"),
    (ForwardItem("r0", (), 0, (900,), input_from_last_sample=True, sample=False), "INVALID_ARGUMENT", "sample=true"),
    (ForwardItem("nobody", (), 0, (900,), input_from_last_sample=True), "NOT_FOUND", "not known"),
])
def test_bad_input_from_last_sample_items_are_rejected(model_dir, prompts, item, code, reason):
    eng = make_engine(model_dir)
    _prefill(eng, prompts[:1], iter(range(1, eng.kv_pool.pool_slots)))
    with pytest.raises(WorkerError, match=reason) as err:
        eng.forward([item], "epoch-1")
    assert err.value.code == code


def test_input_from_last_sample_after_an_unsampled_chunk_is_rejected(model_dir, prompts):
    eng = make_engine(model_dir)
    p = prompts[0]
    eng.forward([ForwardItem("r0", tuple(p), 0, tuple(range(1, len(p) + 1)), has_prefix=True, sample=False)], "epoch-1")
    with pytest.raises(WorkerError, match="sampled no token") as err:
        eng.forward([ForwardItem("r0", (), len(p), (len(p) + 1,), input_from_last_sample=True)], "epoch-1")
    assert err.value.code == "INVALID_ARGUMENT"


def test_a_forward_sent_early_waits_for_the_one_it_follows(model_dir, prompts):
    """Forward seq 2 (after_seq 1) arrives first: it waits until seq 1 completed, then continues from the
    token seq 1 sampled; the result equals running them in order."""
    p = prompts[0]
    ref = make_engine(model_dir)
    ref.forward([ForwardItem("r0", tuple(p), 0, tuple(range(1, len(p) + 1)), has_prefix=True)], "epoch-1")
    n = len(p)
    first = ForwardItem("r0", (), n, (n + 1, n + 2), decode_steps=2, input_from_last_sample=True)
    second = ForwardItem("r0", (), n + 2, (n + 3, n + 4), decode_steps=2, input_from_last_sample=True)
    want = [ref.forward([it], "epoch-1").outputs[0].next_token_ids for it in (first, second)]

    eng = make_engine(model_dir)
    eng.forward([ForwardItem("r0", tuple(p), 0, tuple(range(1, len(p) + 1)), has_prefix=True)], "epoch-1")
    got = {}
    early = threading.Thread(target=lambda: got.update(second=eng.forward([second], "epoch-1", seq=2, after_seq=1)))
    early.start()
    early.join(0.5)
    assert early.is_alive() and len(eng.requests["r0"].slots) == n  # waiting: nothing ran
    got["first"] = eng.forward([first], "epoch-1", seq=1)
    early.join(30)
    assert not early.is_alive()
    assert [got[k].outputs[0].next_token_ids for k in ("first", "second")] == want


def test_a_forward_after_a_failed_one_is_aborted_naming_it(model_dir, prompts):
    eng = make_engine(model_dir)
    _prefill(eng, prompts[:1], iter(range(1, eng.kv_pool.pool_slots)))
    with pytest.raises(WorkerError):
        eng.forward([ForwardItem("r0", (), 999, (900,), input_from_last_sample=True)], "epoch-1", seq=7)
    with pytest.raises(WorkerError, match="after seq 7, which failed: INVALID_ARGUMENT") as err:
        eng.forward([ForwardItem("r0", (), len(prompts[0]), (901,), input_from_last_sample=True)], "epoch-1",
                    seq=8, after_seq=7)
    assert err.value.code == "ABORTED"
    eng.order.timeout_s = 0.2
    with pytest.raises(WorkerError, match="seq 41, which did not complete") as err:
        eng.forward([ForwardItem("r0", (), len(prompts[0]), (901,), input_from_last_sample=True)], "epoch-1",
                    seq=42, after_seq=41)
    assert err.value.code == "ABORTED"
    assert len(eng.requests["r0"].slots) == len(prompts[0])


def test_epoch_is_checked_before_waiting_and_fields_cross_grpc(model_dir, prompts):
    """Over gRPC: a wrong epoch fails at once (no wait for after_seq), ``seq``/``after_seq``/
    ``input_from_last_sample``/``skipped`` reach the engine and back."""
    eng = make_engine(model_dir)
    server = grpc_server.start(lambda s: service.add_to_server(eng, s), [service.SERVICE_NAME], "127.0.0.1:0")
    try:
        stub = worker_pb2_grpc.WorkerStub(grpc_server.channel(f"127.0.0.1:{server.port}"))
        with pytest.raises(grpc.RpcError) as err:
            stub.Forward(worker_pb2.ForwardRequest(expected_epoch="other", after_seq=5, seq=6), timeout=5)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        p = prompts[0]
        first = worker_pb2.ForwardItem(request_id="r0", input_ids=p, position_start=0,
                                       slot_ids=range(1, len(p) + 1), has_prefix=True, sample=True)
        (o,) = stub.Forward(worker_pb2.ForwardRequest(expected_epoch="epoch-1", items=[first], seq=1), timeout=30).results
        stop = worker_pb2.ForwardItem(request_id="r0", position_start=len(p), slot_ids=[len(p) + 1], sample=True,
                                      input_from_last_sample=True)
        stop.stop_token_ids.append(eng.requests["r0"].last_token)
        eng.requests["r0"].stopped = True  # as if the previous Forward had ended at a stop token
        (o2,) = stub.Forward(worker_pb2.ForwardRequest(expected_epoch="epoch-1", items=[stop], seq=2, after_seq=1),
                             timeout=30).results
        assert o2.skipped and not o2.sampled
    finally:
        server.server.stop(0)


def test_a_forward_cancelled_while_it_waited_does_not_run(model_dir, prompts):
    eng = make_engine(model_dir)
    _prefill(eng, prompts[:1], iter(range(1, eng.kv_pool.pool_slots)))
    eng.order.done(3)
    with pytest.raises(WorkerError, match="cancelled by the caller") as err:
        eng.forward([ForwardItem("r0", (), len(prompts[0]), (901,), input_from_last_sample=True)], "epoch-1",
                    seq=4, after_seq=3, cancelled=lambda: True)
    assert err.value.code == "ABORTED" and len(eng.requests["r0"].slots) == len(prompts[0])
