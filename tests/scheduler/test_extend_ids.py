"""``Req.extend_ids``: any run of a request's ids appended to a protobuf repeated field, from the prompt's own
repeated field (copied in C) or from the lists, equals ``all_ids[start:end]``; and the messages the scheduler
builds from it (Match key, ForwardItem, CacheItem) carry exactly those ids."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from codeserve.v1 import cache_pb2, common_pb2, scheduler_pb2, worker_pb2
from scheduler_svc.batch import Entry, forward_item
from scheduler_svc.request import Params, Req
from scheduler_svc.requests import written_item


def request(prompt: list[int], output: list[int], with_field: bool) -> Req:
    field = scheduler_pb2.TokenIds(ids=prompt).ids if with_field else None
    params = Params(max_new_tokens=8, asked_max_new_tokens=8, sampling=common_pb2.SamplingParams())
    return Req(rid="r", prompt_ids=list(prompt), params=params, prompt_field=field, output_ids=list(output))


@settings(max_examples=300, deadline=None)
@given(prompt=st.lists(st.integers(0, 50_000), min_size=1, max_size=300).flatmap(  # short ones, and > 64 ids
           lambda p: st.just(p) | st.just(p * (1 + 130 // len(p)))), output=st.lists(st.integers(0, 50_000),
       max_size=20), cut=st.tuples(st.integers(0, 330), st.integers(0, 330)), with_field=st.booleans(),
       before=st.lists(st.integers(0, 9), max_size=3))
def test_any_run_equals_the_slice_of_all_ids(prompt, output, cut, with_field, before) -> None:
    req = request(prompt, output, with_field)
    start, end = min(cut), min(max(cut), len(prompt) + len(output))
    dst = cache_pb2.MatchItem(token_ids=before).token_ids  # what the field held before stays in front
    req.extend_ids(dst, start, end)
    assert list(dst) == before + req.all_ids[start:end]


def test_the_messages_built_from_it_carry_the_ids() -> None:
    prompt, output = list(range(1000, 1200)), [7, 8, 9]
    req = request(prompt, output, with_field=True)
    req.kv_len, req.prefix_slot_ids = 202, cache_pb2.MatchResult(slot_ids=list(range(500, 600))).slot_ids
    item = forward_item(Entry(req, start=100, n=100, slot_ids=tuple(range(10, 110)), sample=False), ())
    assert list(item.input_ids) == prompt[100:200] and list(item.prefix_token_ids) == prompt[:100]
    assert list(item.prefix_slot_ids) == list(range(500, 600)) and isinstance(item, worker_pb2.ForwardItem)
    cached = written_item(req, finished=True)
    assert list(cached.token_ids) == (prompt + output)[:202] and cached.finished and cached.request_id == "r"
