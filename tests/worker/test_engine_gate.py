"""The engine gate: one holder at a time, waiters of one kind in arrival order, deferrable waiters after every
non-deferrable one waiting (a queued decode Forward N+1 lets an arrival's extend run first); and the same
order on a real engine, with ``deferrable`` crossing gRPC."""

from __future__ import annotations

import threading
import time

import pytest

from codeserve.v1 import worker_pb2, worker_pb2_grpc
from common import grpc_server
from tests.worker.helpers import make_engine
from worker_svc import service
from worker_svc.engine_gate import EngineGate
from worker_svc.types import ForwardItem


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def enter(gate: EngineGate, order: list[str], name: str, deferrable: bool) -> threading.Thread:
    def run() -> None:
        with gate.hold(deferrable):
            order.append(name)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_deferrable_waiters_go_after_every_other_waiter_and_each_kind_in_arrival_order():
    gate, order = EngineGate(), []
    threads = []
    with gate.hold():  # the Forward now running
        for i, (name, deferrable) in enumerate([("d1", True), ("e1", False), ("d2", True), ("e2", False),
                                                 ("e3", False)]):
            threads.append(enter(gate, order, name, deferrable))
            wait_until(lambda: sum(gate.waiting()) == i + 1)  # queued in this order
        assert gate.waiting() == (3, 2) and order == []
    for t in threads:
        t.join(5)
    assert order == ["e1", "e2", "e3", "d1", "d2"]
    assert gate.waiting() == (0, 0)


def test_a_deferrable_holder_is_not_preempted_and_a_free_gate_admits_either_kind_at_once():
    gate, order = EngineGate(), []
    with gate.hold(deferrable=True):
        t = enter(gate, order, "e", False)
        wait_until(lambda: gate.waiting() == (1, 0))
        assert order == []  # waits for the deferrable holder to finish
    t.join(5)
    assert order == ["e"]
    enter(gate, order, "d", True).join(5)
    assert order == ["e", "d"]


def test_an_exception_in_the_block_frees_the_gate():
    gate = EngineGate()
    with pytest.raises(RuntimeError):
        with gate.hold():
            raise RuntimeError("forward failed")
    order: list[str] = []
    enter(gate, order, "next", True).join(5)
    assert order == ["next"]


def test_on_the_engine_an_extend_that_arrives_after_a_queued_decode_runs_first(model_dir, prompts, monkeypatch):
    """The engine is busy (the Forward before them); a deferrable decode of r0 queues, then an extend of a new
    request r1 arrives: when the engine frees, the extend runs first. Both results equal running them alone."""
    p0, p1 = prompts[0], prompts[1]
    ref = make_engine(model_dir)
    ref.forward([ForwardItem("r0", tuple(p0), 0, tuple(range(1, len(p0) + 1)), has_prefix=True)], "epoch-1")
    decode = ForwardItem("r0", (), len(p0), (len(p0) + 1, len(p0) + 2), decode_steps=2, input_from_last_sample=True)
    base = 100
    extend = ForwardItem("r1", tuple(p1), 0, tuple(range(base, base + len(p1))), has_prefix=True)
    want = {"decode": ref.forward([decode], "epoch-1").outputs[0].next_token_ids,
            "extend": ref.forward([extend], "epoch-1").outputs[0].next_token_id}

    eng = make_engine(model_dir)
    eng.forward([ForwardItem("r0", tuple(p0), 0, tuple(range(1, len(p0) + 1)), has_prefix=True)], "epoch-1", seq=1)
    ran: list[str] = []
    run_unskipped = eng._run_unskipped
    monkeypatch.setattr(eng, "_run_unskipped",
                        lambda items: ran.append(items[0].request_id) or run_unskipped(items))
    got: dict[str, object] = {}
    with eng._gate.hold():  # the Forward before them is running
        d = threading.Thread(target=lambda: got.update(
            decode=eng.forward([decode], "epoch-1", seq=2, after_seq=1, deferrable=True)))
        d.start()
        wait_until(lambda: eng._gate.waiting() == (0, 1))
        e = threading.Thread(target=lambda: got.update(extend=eng.forward([extend], "epoch-1", seq=3, after_seq=1)))
        e.start()
        wait_until(lambda: eng._gate.waiting() == (1, 1))
    d.join(30)
    e.join(30)
    assert ran == ["r1", "r0"]
    assert got["decode"].outputs[0].next_token_ids == want["decode"]
    assert got["extend"].outputs[0].next_token_id == want["extend"]


def test_deferrable_crosses_grpc(model_dir, monkeypatch):
    eng = make_engine(model_dir)
    seen: list[bool] = []
    monkeypatch.setattr(eng, "forward", lambda items, epoch, **kw: seen.append(kw["deferrable"]) or
                        type("R", (), {"outputs": (), "forward_seconds": 0.0})())
    server = grpc_server.start(lambda s: service.add_to_server(eng, s), [service.SERVICE_NAME], "127.0.0.1:0")
    try:
        stub = worker_pb2_grpc.WorkerStub(grpc_server.channel(f"127.0.0.1:{server.port}"))
        for flag in (True, False):
            stub.Forward(worker_pb2.ForwardRequest(expected_epoch="epoch-1", seq=5, after_seq=4, deferrable=flag),
                         timeout=10)
    finally:
        server.server.stop(0)
    assert seen == [True, False]
