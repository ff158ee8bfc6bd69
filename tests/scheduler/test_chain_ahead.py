"""``chain.stopped_in`` and ``chain.continuation(stopped=)``: at chain depth 2, decode N+2 is built before N is
applied; the requests N's reply shows stopped at a stop id (or skipped) are left out of it, so the worker can
prepare N+2 ahead and launch it behind N+1 (a row of a stopped request has a table shorter than its position and
takes the whole Forward to its turn: the review of session 33 found it). The scheduler's HF-oracle runs at depth 2
are ``tests/scheduler/test_overlap.py``'s ``k8d``."""

from __future__ import annotations

from types import SimpleNamespace

from codeserve.v1 import common_pb2, worker_pb2
from scheduler_svc import chain
from scheduler_svc.batch import Batch, Entry
from scheduler_svc.request import Params, Req, State

EOS = 0


def _req(rid: str, stop_ids=frozenset(), ignore_eos=True) -> Req:
    req = Req(rid=rid, prompt_ids=[5, 6, 7], params=Params(max_new_tokens=40, asked_max_new_tokens=40,
                                                            sampling=common_pb2.SamplingParams(),
                                                            stop_token_ids=frozenset(stop_ids), ignore_eos=ignore_eos))
    req.phase = State.DECODE
    return req


def _n(reqs, results) -> SimpleNamespace:
    """Forward N (decode, 4 steps a request) whose reply is in with ``results``."""
    batch = Batch("decode", tuple(Entry(r, start=10, n=1, slot_ids=(1, 2, 3, 4), sample=True, steps=4, from_last=True)
                                  for r in reqs))
    reply = worker_pb2.ForwardResponse(results=results)
    return SimpleNamespace(batch=batch, pending=SimpleNamespace(result=lambda: reply))


def test_stopped_in_names_the_requests_n_stopped_or_skipped():
    a, b, c, d = _req("a", {9}), _req("b", {9}), _req("c", ignore_eos=False), _req("d")
    results = [worker_pb2.ForwardResult(request_id="a", sampled=True, next_token_id=9, next_token_ids=[3, 9]),
               worker_pb2.ForwardResult(request_id="b", sampled=True, next_token_id=4, next_token_ids=[9, 4, 4, 4]),
               worker_pb2.ForwardResult(request_id="c", sampled=True, next_token_id=EOS, next_token_ids=[3, EOS]),
               worker_pb2.ForwardResult(request_id="d", skipped=True)]
    # a ends at its stop id, c at EOS (not ignored), d was skipped; b sampled its stop id but went on (not last)
    assert chain.stopped_in(_n([a, b, c, d], results), EOS) == {"a", "c", "d"}


def test_the_continuation_leaves_the_stopped_out():
    a, b = _req("a"), _req("b")
    n1 = Batch("decode", tuple(Entry(r, start=14, n=1, slot_ids=(5, 6, 7, 8), sample=True, steps=4, from_last=True)
                               for r in (a, b)))
    assert [e.req.rid for e, _ in chain.continuation(n1, 4, {"a": 4, "b": 4}, stopped={"a"})] == ["b"]
    assert [e.req.rid for e, _ in chain.continuation(n1, 4, {"a": 4, "b": 4})] == ["a", "b"]
