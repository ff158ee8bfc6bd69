"""Hop tracing (common/hop_trace.py, bench/hop_report.py): off by default, first marks only, and through a real
stack a streamed completion's hops in the order a request meets them."""

from __future__ import annotations

import json

import httpx
import pytest

from bench import hop_report
from common import hop_trace
from tests.stack import Backend

HOPS = ["http_in", "call", "generate", "taken", "match_sent", "cache_in", "match_in", "match_out", "match_back", "admitted", "extend_sent", "forward_in", "forward_run", "forward_out",
        "extend_reply", "first_token", "first_yield", "first_message", "first_chunk"]
END_HOPS = ("final_message", "last_yield", "last_message", "done_chunk")


@pytest.fixture
def fresh_trace(monkeypatch):
    monkeypatch.setattr(hop_trace, "_out", None)
    monkeypatch.setattr(hop_trace, "_seen", set())
    yield
    if hop_trace._out is not None:
        hop_trace._out.close()


def test_off_without_the_variable_and_first_marks_only_when_on(tmp_path, monkeypatch, fresh_trace) -> None:
    monkeypatch.delenv(hop_trace.ENV, raising=False)
    assert hop_trace.configure("svc") is None and not hop_trace.enabled()
    hop_trace.mark("r", "a")  # a no-op
    path = hop_trace.configure("svc", str(tmp_path))
    hop_trace.mark("r", "a", 100)
    hop_trace.mark("r", "a", 50)  # marked already: ignored
    hop_trace.mark("r", "b", 350)
    hop_trace.mark("s", "a", 1_000)
    hop_trace._out.flush()
    assert open(path).read().splitlines() == ["r\ta\t100", "r\tb\t350", "s\ta\t1000"]
    table = hop_report.segments(hop_report.load(str(tmp_path)), "b")  # s never reached b: left out
    assert table == {"a -> b": {"n": 1, "p50_ms": 250e-6, "mean_ms": 250e-6},
                     "total": {"n": 1, "p50_ms": 250e-6, "mean_ms": 250e-6}}


def test_a_streamed_completion_meets_every_hop_in_order(tmp_path, monkeypatch) -> None:
    trace = tmp_path / "hops"
    monkeypatch.setenv(hop_trace.ENV, str(trace))  # the services inherit it
    be = Backend.start(tmp_path / "logs")
    try:
        be.stack.start_one("gateway")
        with httpx.Client(base_url=be.stack.url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json={"prompt": "def add(a, b):", "max_tokens": 3,
                                                               "stream": True}) as reply:
                assert reply.status_code == 200
                events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    finally:
        be.stop()
    marks = hop_report.load(str(trace))[f"{events[0]['id']}-0"]
    order = sorted((h for h in marks if h not in END_HOPS), key=marks.get)
    # a lone arrival is matched early (scheduler_svc/early_match.py): the servicer sends its Match as the loop may
    # take it (just before or after), and the loop reads its reply (match_back) after taking it
    early = [h for h in HOPS if h != "taken"]
    assert [h for h in order if h != "taken"] == early, marks
    assert order.index("generate") < order.index("taken") < order.index("match_back"), marks
    table = hop_report.segments({"r": {h: marks[h] for h in order}}, "first_chunk")
    assert list(table) == [f"{a} -> {b}" for a, b in zip(order, order[1:])] + ["total"]
    # the request's end, in order, after its first token: its last message built, yielded, read by the gateway,
    # the stream's end handed to HTTP
    assert sorted(END_HOPS, key=marks.get) == list(END_HOPS), marks
    assert marks["first_token"] < marks["final_message"] and marks["first_chunk"] < marks["done_chunk"], marks


def test_the_cache_marks_the_admission_match_only(tmp_path, monkeypatch, fresh_trace) -> None:
    """Under ``--policy lpm`` an unlocked Match (the waiting requests' prefix lengths) reaches the cache before the
    admission's locking one: only the locking one's hops are marked (a hop counts the first time it happens)."""
    import uuid

    from cache_svc.core import CacheCore
    from cache_svc.items import Member
    from cache_svc.service import CacheServicer
    from codeserve.v1 import cache_pb2

    core = CacheCore()
    sid = core.open_session("t").session_id
    core.register_pool(uuid.uuid4().hex, "p", 1, [Member("w", "e", 64)], sid)
    servicer = CacheServicer(core)
    hop_trace.configure("cache", str(tmp_path))

    def match(lock: bool) -> None:
        item = cache_pb2.MatchItem(request_id="r", token_ids=[1, 2, 3], lock=lock)
        servicer.Match(cache_pb2.MatchRequest(op_id=uuid.uuid4().hex, session_id=sid, pool_id="p", items=[item]), None)

    match(lock=False)
    assert hop_trace._seen == set()  # the probe of lpm's ordering marks nothing
    match(lock=True)
    batch = cache_pb2.BatchRequest(ops=[cache_pb2.BatchOp(match=cache_pb2.MatchRequest(
        op_id=uuid.uuid4().hex, session_id=sid, pool_id="p", items=[cache_pb2.MatchItem(request_id="s", token_ids=[1])]))])
    servicer.Batch(batch, None)  # an unlocked Match in a Batch: nothing either
    assert hop_trace._seen == {("r", "cache_in"), ("r", "match_in"), ("r", "match_out")}
