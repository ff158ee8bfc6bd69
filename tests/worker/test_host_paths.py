"""The worker's host-side fast paths give what the plain paths give: per-step decode layouts built once per
Forward (``DecodeSteps``) equal ``layout_from_parts``; ``ForwardItem.make`` equals the dataclass constructor;
protobuf <-> engine conversion keeps every field; the whole-batch slot check names the first slot written twice."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from codeserve.v1 import common_pb2, worker_pb2
from worker_svc.forward_batch import DecodeSteps, layout_from_parts
from worker_svc.sampler import SamplingParams, argmax_rows
from worker_svc.service import item_from_proto, response_to_proto, result_to_proto, sampling_of
from worker_svc.types import ForwardItem, ForwardOutput, WorkerError
from worker_svc.validation import validate_batch

LAYOUT_FIELDS = ("positions", "out_slots", "qo_indptr", "kv_indptr", "kv_indices", "last_rows")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(1, 5)), min_size=1, max_size=6), st.integers(0, 10 ** 6))
def test_decode_steps_layout_equals_layout_from_parts(rows, seed):
    rows = sorted(rows, key=lambda r: -r[1])  # steps non-increasing, as enqueue_multistep orders them
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(1, 1000, p).astype(np.int32) for p, _ in rows]
    new = [tuple(int(x) for x in rng.integers(1000, 2000, k)) for _, k in rows]
    ks = [k for _, k in rows]
    steps = DecodeSteps(prefixes, new, ks)
    for j in range(ks[0]):
        n = sum(k > j for k in ks)
        full = [np.concatenate([p, np.asarray(s, dtype=np.int32)]) for p, s in zip(prefixes, new)]
        want = layout_from_parts([f[: len(p) + j] for f, p in zip(full[:n], prefixes)],
                                 [f[len(p) + j: len(p) + j + 1] for f, p in zip(full[:n], prefixes)])
        got = steps.layout(j, n)
        for name in LAYOUT_FIELDS:
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and a.tolist() == b.tolist(), (name, j)
        assert (got.qo_lens, got.kv_lens, got.is_decode) == (want.qo_lens, want.kv_lens, want.is_decode)


def test_decode_steps_rejects_a_row_without_one_slot_per_step():
    with pytest.raises(ValueError, match="one new slot per step"):
        DecodeSteps([np.zeros(2, dtype=np.int32)], [(5, 6)], [3])


def test_make_equals_the_constructor_and_checks_the_count():
    kw = dict(request_id="a", input_ids=(3,), position_start=2, slot_ids=(9,), has_prefix=True, prefix_slot_ids=(4, 5),
              prefix_token_ids=(7, 8), sampling=SamplingParams(temperature=0.5, seed=3), sample=True, return_logprob=True,
              top_logprobs_num=2, return_prompt_logprobs=False, prompt_len=2, decode_steps=1, stop_token_ids=(0,),
              input_from_last_sample=False)
    made = ForwardItem.make(**kw)
    assert made == ForwardItem(**kw) and hash(made) == hash(ForwardItem(**kw))
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.position_start = 5
    with pytest.raises(TypeError, match="missing 8 required keyword-only arguments"):
        ForwardOutput.make(request_id="a", sampled=True)
    with pytest.raises(TypeError, match="positional"):
        ForwardItem.make(*kw.values())


def test_item_from_proto_keeps_every_field():
    s = common_pb2.SamplingParams(temperature=0.7, top_p=0.0, top_k=-1, min_p=0.1, repetition_penalty=0.0,
                                  frequency_penalty=0.5, presence_penalty=-0.5, seed=11, has_seed=True)
    m = worker_pb2.ForwardItem(request_id="r", input_ids=[1, 2], position_start=3, slot_ids=[10, 11], has_prefix=True,
                               prefix_slot_ids=[4, 5, 6], prefix_token_ids=[7, 8, 9], sampling=s, sample=True,
                               return_logprob=True, top_logprobs_num=3, return_prompt_logprobs=True, prompt_len=4,
                               decode_steps=0, stop_token_ids=[0, 2], input_from_last_sample=False)
    got = item_from_proto(m)
    assert got == ForwardItem(
        request_id="r", input_ids=(1, 2), position_start=3, slot_ids=(10, 11), has_prefix=True, prefix_slot_ids=(4, 5, 6),
        prefix_token_ids=(7, 8, 9), sampling=SamplingParams(temperature=s.temperature, top_p=1.0, top_k=0, min_p=s.min_p,
                                                             repetition_penalty=1.0, frequency_penalty=0.5,
                                                             presence_penalty=-0.5, seed=11),
        sample=True, return_logprob=True, top_logprobs_num=3, return_prompt_logprobs=True, prompt_len=4, decode_steps=1,
        stop_token_ids=(0, 2), input_from_last_sample=False)
    assert item_from_proto(worker_pb2.ForwardItem(request_id="x", decode_steps=-2)).decode_steps == -2  # validation says no
    empty = item_from_proto(worker_pb2.ForwardItem(request_id="x", input_from_last_sample=True))
    assert empty.input_ids == () and empty.slot_ids == () and empty.sampling == SamplingParams()


def test_sampling_memo_tells_different_messages_apart():
    a = sampling_of(common_pb2.SamplingParams(temperature=0.5, seed=1, has_seed=True))
    b = sampling_of(common_pb2.SamplingParams(temperature=0.5, seed=2, has_seed=True))
    c = sampling_of(common_pb2.SamplingParams(temperature=0.5))
    assert (a.seed, b.seed, c.seed) == (1, 2, None)
    assert sampling_of(common_pb2.SamplingParams(temperature=0.5, seed=1, has_seed=True)) is a


def test_result_to_proto_keeps_every_field():
    out = ForwardOutput(request_id="r", sampled=True, next_token_id=5, logprob=-0.25, top_logprobs=((5, -0.25), (6, -2.0)),
                        prompt_logprobs=(-1.0, -1.5), prompt_top_logprobs=(((1, -1.0),), ((2, -0.5),)),
                        next_token_ids=(4, 5), logprobs=(-0.5, -0.25), skipped=False)
    r = worker_pb2.ForwardResult.FromString(result_to_proto(out).SerializeToString())
    assert (r.request_id, r.sampled, r.next_token_id, r.logprob, r.skipped) == ("r", True, 5, -0.25, False)
    assert [(e.token_id, e.logprob) for e in r.top_logprobs.entries] == [(5, -0.25), (6, -2.0)]
    assert list(r.prompt_logprobs) == [-1.0, -1.5] and list(r.next_token_ids) == [4, 5]
    assert list(r.logprobs) == [-0.5, -0.25]
    assert [[(e.token_id, e.logprob) for e in t.entries] for t in r.prompt_top_logprobs] == [[(1, -1.0)], [(2, -0.5)]]
    bare = result_to_proto(ForwardOutput(request_id="s", sampled=False, skipped=True))
    assert (bare.next_token_id, bare.skipped, list(bare.next_token_ids), list(bare.top_logprobs.entries)) == (-1, True, [], [])
    reply = response_to_proto([out, ForwardOutput(request_id="s", sampled=False, skipped=True)], 0.5)
    assert list(reply.results) == [result_to_proto(out), bare] and reply.forward_seconds == 0.5


def _item(rid, slots):
    return ForwardItem(request_id=rid, input_ids=tuple(range(1, len(slots) + 1)), position_start=0, slot_ids=tuple(slots),
                       has_prefix=True)


@pytest.mark.parametrize("batch, slot", [
    ([_item("a", [5, 6]), _item("b", [7, 6])], 6),           # across items
    ([_item("a", [5, 6]), _item("b", [8, 9, 8])], 8),        # within one item
    ([_item("a", [5, 6]), _item("b", [9, 8, 5, 9])], 5),     # the first one of that item is named
])
def test_slot_written_twice_names_the_first(batch, slot):
    cfg = types.SimpleNamespace(vocab_size=100, n_positions=64)
    with pytest.raises(WorkerError, match=f"request 'b': slot id {slot} is written twice in one batch"):
        validate_batch(batch, "e", "e", cfg, 50, {}, frozenset())
    validate_batch(batch[:1], "e", "e", cfg, 50, {}, frozenset())  # the first item alone is fine


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.integers(0, 10 ** 6))
def test_argmax_rows_equals_torch_argmax(n, v, seed):
    rng = np.random.default_rng(seed)
    x = rng.choice(np.array([-1.0, 0.0, 0.5, 2.0, np.inf, -np.inf, np.nan], dtype=np.float32), size=(n, v))  # ties
    t = torch.from_numpy(x)
    got = argmax_rows(t)
    assert got.dtype == torch.int64 and got.tolist() == t.argmax(dim=-1).tolist()
    assert argmax_rows(t.double()).tolist() == got.tolist()  # other dtypes take torch's kernel
