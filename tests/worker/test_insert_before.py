"""``before_seq`` (the scheduler's ``--overlap-mode queued``): decode Forward N+1 waits at the worker behind N;
an arrival's extend E, sent later with after_seq N and before_seq N+1, runs first when it arrives before N+1
started, and after it otherwise. On ``ForwardOrder`` alone, then on a real engine, then across gRPC."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from codeserve.v1 import worker_pb2, worker_pb2_grpc
from common import grpc_server
from tests.worker.helpers import make_engine
from worker_svc import service
from worker_svc.ordering import ForwardOrder
from worker_svc.types import ForwardItem, WorkerError

WAIT_S = 10.0  # bound for a condition that holds at once in a correct worker (not a measured time)


def started(fn) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_a_forward_inserted_before_a_waiting_one_runs_first_even_when_it_fails():
    order, ran = ForwardOrder(), []
    nxt = started(lambda: (order.wait_for(1, 2), ran.append(2)))  # N+1 waits for N (seq 1)
    assert order.insert_before(3, 2, after_seq=1)  # E arrives while N runs
    ext = started(lambda: (order.wait_for(1, 3), ran.append(3)))
    time.sleep(0.05)
    assert ran == []  # N has not completed
    order.done(1)
    ext.join(WAIT_S)
    assert ran == [3]
    nxt.join(0.2)
    assert nxt.is_alive()  # N+1 still waits for E's outcome
    order.done(3, "INVALID_ARGUMENT: bad extend")  # E failed: its requests are not N+1's, so N+1 still runs
    nxt.join(WAIT_S)
    assert ran == [3, 2]


def test_an_insertion_after_the_forward_started_changes_nothing():
    order = ForwardOrder()
    order.done(1)
    order.wait_for(1, 2)  # N+1 has started
    assert order.insert_before(3, 2, after_seq=1) is False
    order.wait_for(1, 3)  # E only waits for its own after_seq
    order.done(2)


def test_insertions_ahead_of_a_forward_that_is_yet_to_arrive_are_kept():
    """E can reach the worker before N+1 itself (separate gRPC streams): N+1 still waits for it."""
    order = ForwardOrder()
    order.done(1)
    assert order.insert_before(3, 2, after_seq=1)
    order.timeout_s = 0.2
    with pytest.raises(WorkerError, match="runs after seq 3, which did not complete") as err:
        order.wait_for(1, 2)
    assert err.value.code == "ABORTED"


@pytest.mark.parametrize("seq, before, after", [(3, 3, 1), (3, 1, 1), (0, 2, 1)])
def test_a_forward_before_itself_or_its_own_predecessor_is_invalid(seq, before, after):
    with pytest.raises(WorkerError) as err:
        ForwardOrder().insert_before(seq, before, after)
    assert err.value.code == "INVALID_ARGUMENT"


def test_on_the_engine_an_extend_inserted_ahead_of_a_queued_decode_runs_first(model_dir, prompts, monkeypatch):
    """r0 decodes; its next decode (seq 2, after 1) is queued before seq 1 completed; an extend of a new request
    r1 (seq 3, after 1, before 2) arrives: it runs first. Both results equal running them alone."""
    p0, p1 = prompts[0], prompts[1]
    decode = ForwardItem("r0", (), len(p0), (len(p0) + 1, len(p0) + 2), decode_steps=2, input_from_last_sample=True)
    extend = ForwardItem("r1", tuple(p1), 0, tuple(range(100, 100 + len(p1))), has_prefix=True)
    prefill = ForwardItem("r0", tuple(p0), 0, tuple(range(1, len(p0) + 1)), has_prefix=True)
    ref = make_engine(model_dir)
    ref.forward([prefill], "epoch-1")
    want = (ref.forward([decode], "epoch-1").outputs[0].next_token_ids,
            ref.forward([extend], "epoch-1").outputs[0].next_token_id)

    eng = make_engine(model_dir)
    ran: list[str] = []
    launch = eng._launch
    monkeypatch.setattr(eng, "_launch", lambda items, clock, *a: ran.append(items[0].request_id) or launch(items, clock, *a))
    eng.forward([prefill], "epoch-1")
    got: dict[str, object] = {}
    d = started(lambda: got.update(decode=eng.forward([decode], "epoch-1", seq=2, after_seq=1)))
    e = started(lambda: got.update(extend=eng.forward([extend], "epoch-1", seq=3, after_seq=1, before_seq=2)))
    time.sleep(0.1)
    assert ran == ["r0"]  # only the prefill: both wait for seq 1
    eng.order.done(1)  # "N" completes
    d.join(WAIT_S * 3)
    e.join(WAIT_S * 3)
    assert ran == ["r0", "r1", "r0"]
    assert (got["decode"].outputs[0].next_token_ids, got["extend"].outputs[0].next_token_id) == want


def test_before_seq_crosses_grpc_and_a_bad_one_is_invalid_argument(model_dir, monkeypatch):
    eng = make_engine(model_dir)
    server = grpc_server.start(lambda s: service.add_to_server(eng, s), [service.SERVICE_NAME], "127.0.0.1:0")
    try:
        stub = worker_pb2_grpc.WorkerStub(grpc_server.channel(f"127.0.0.1:{server.port}"))
        with pytest.raises(grpc.RpcError) as err:
            stub.Forward(worker_pb2.ForwardRequest(expected_epoch="epoch-1", seq=5, after_seq=4, before_seq=4),
                         timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "cannot run before seq 4" in err.value.details()
        seen: list[int] = []
        monkeypatch.setattr(eng, "forward", lambda items, epoch, **kw: seen.append(kw["before_seq"]) or
                            type("R", (), {"outputs": (), "forward_seconds": 0.0, "device_seconds": 0.0})())
        stub.Forward(worker_pb2.ForwardRequest(expected_epoch="epoch-1", seq=7, after_seq=6, before_seq=8), timeout=10)
    finally:
        server.server.stop(0)
    assert seen == [8]
