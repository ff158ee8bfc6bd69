"""A Forward's ``release_request_ids`` (worker.proto) on the real Worker gRPC service: dropped before its items are
validated (a reused id starts fresh), when the Forward starts running (after its after_seq wait, never on
arrival), kept dropped when its items then fail validation, not applied when it may not run (wrong epoch), and
never dropping a state that a Forward with a larger seq created (a newer request reusing the id)."""

from __future__ import annotations

import time

import grpc
import pytest

from codeserve.v1 import worker_pb2, worker_pb2_grpc
from common import grpc_server
from tests.worker.helpers import make_engine
from worker_svc.service import SERVICE_NAME, add_to_server

EPOCH = "boot-r"


@pytest.fixture(scope="module")
def served(model_dir):
    engine = make_engine(model_dir, kv_tokens=400, epoch=EPOCH)
    running = grpc_server.start(lambda s: add_to_server(engine, s), [SERVICE_NAME], "127.0.0.1:0")
    ch = grpc_server.channel(f"127.0.0.1:{running.port}")
    yield engine, worker_pb2_grpc.WorkerStub(ch)
    ch.close()
    running.server.stop(0)


def extend(rid, ids, slots):
    """A first chunk (has_prefix, empty prefix) of ``ids`` at ``slots``; greedy."""
    return worker_pb2.ForwardItem(request_id=rid, input_ids=ids, position_start=0, slot_ids=slots, has_prefix=True,
                                  sample=True)


def request(items, release=(), seq=0, after_seq=0, epoch=EPOCH):
    return worker_pb2.ForwardRequest(expected_epoch=epoch, items=items, seq=seq, after_seq=after_seq,
                                     release_request_ids=list(release))


def test_releases_are_dropped_before_the_items_and_a_reused_id_starts_fresh(served):
    engine, stub = served
    stub.Forward(request([extend("a", [5, 6, 7, 8], [10, 11, 12, 13]), extend("b", [9, 9], [20, 21]),
                          extend("c", [4], [30])]))
    assert {"a", "b", "c"} <= engine.requests.keys()
    (fresh,) = stub.Forward(request([extend("fresh", [3, 1, 4], [40, 41, 42])])).results
    # "a" is reused by a new request in the Forward that releases it; "b" ends; "never-seen" is ignored
    reply = stub.Forward(request([extend("a", [3, 1, 4], [50, 51, 52]),
                                  worker_pb2.ForwardItem(request_id="c", input_ids=[7], position_start=1,
                                                         slot_ids=[31], sample=True)],
                                 release=["a", "b", "never-seen"]))
    assert "b" not in engine.requests and "c" in engine.requests
    assert list(engine.requests["a"].slots) == [50, 51, 52] and engine.requests["a"].tokens == [3, 1, 4]
    assert reply.results[0].next_token_id == fresh.next_token_id  # the reused id computed as a fresh request
    assert stub.Release(worker_pb2.ReleaseRequest(request_ids=["a", "c", "fresh"])).released == 3


def test_releases_apply_when_the_forward_starts_running_not_when_it_arrives(served):
    engine, stub = served
    stub.Forward(request([extend("x", [5, 6], [60, 61])]))
    base = time.time_ns() // 1000
    later = stub.Forward.future(request([extend("y", [1], [70])], release=["x"], seq=base + 2, after_seq=base + 1))
    time.sleep(0.3)  # it reached the worker and waits for Forward base+1
    assert not later.done() and "x" in engine.requests
    # the Forward it follows still uses x (a decode item of it): it must find x's state
    (got,) = stub.Forward(request([worker_pb2.ForwardItem(request_id="x", input_ids=[7], position_start=2,
                                                          slot_ids=[62], sample=True)], seq=base + 1)).results
    assert got.sampled
    later.result(timeout=10)
    assert "x" not in engine.requests and "y" in engine.requests
    stub.Release(worker_pb2.ReleaseRequest(request_ids=["y"]))


def test_releases_stay_applied_when_the_items_fail_validation_and_wait_when_the_forward_may_not_run(served):
    engine, stub = served
    stub.Forward(request([extend("v", [5], [80]), extend("w", [6], [81])]))
    with pytest.raises(grpc.RpcError) as err:
        stub.Forward(request([extend("bad", [1], [0])], release=["v"]))  # the reserved slot: INVALID_ARGUMENT
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "reserved slot 0" in err.value.details()
    assert "v" not in engine.requests and "bad" not in engine.requests
    with pytest.raises(grpc.RpcError) as err:
        stub.Forward(request([extend("z", [1], [82])], release=["w"], epoch="other-boot"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "w" in engine.requests
    stub.Release(worker_pb2.ReleaseRequest(request_ids=["w"]))


def test_a_release_keeps_a_state_that_a_forward_with_a_larger_seq_created(served):
    """The scheduler releases an ended request's id on a Forward it builds after the request ended; a newer
    request reusing the id is in a Forward built later still (a larger seq), which may run first (an extend sent
    ahead): the older Forward's release must not drop it."""
    engine, stub = served
    base = time.time_ns() // 1000
    stub.Forward(request([extend("r", [2, 3], [90, 91])], seq=base + 10))  # the newer request's extend ran first
    stub.Forward(request([extend("other", [4], [92])], release=["r", "old"], seq=base + 9))
    assert list(engine.requests["r"].slots) == [90, 91]
    stub.Forward(request([extend("other2", [4], [93])], release=["r"], seq=base + 11))  # built after it: dropped
    assert "r" not in engine.requests
    stub.Release(worker_pb2.ReleaseRequest(request_ids=["other", "other2"]))
