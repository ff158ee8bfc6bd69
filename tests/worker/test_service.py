"""The Worker gRPC service on a real port: Info, Forward, Release, health; every validation error returns
its status with the reason, changes nothing, and the worker serves the next request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from codeserve.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from common import grpc_server
from tests.worker.helpers import make_engine
from worker_svc.service import SERVICE_NAME, add_to_server

KV_TOKENS = 500


@pytest.fixture(scope="module")
def served(model_dir):
    engine = make_engine(model_dir, kv_tokens=KV_TOKENS, epoch="boot-1")
    running = grpc_server.start(lambda s: add_to_server(engine, s), [SERVICE_NAME], "127.0.0.1:0")
    ch = grpc_server.channel(f"127.0.0.1:{running.port}")
    yield engine, worker_pb2_grpc.WorkerStub(ch), ch
    ch.close()
    running.server.stop(0)


def item(rid, ids, start, slots, prefix_slots=None, prefix_ids=None, **kw):
    has_prefix = prefix_slots is not None
    return worker_pb2.ForwardItem(request_id=rid, input_ids=ids, position_start=start, slot_ids=slots,
                                  has_prefix=has_prefix, prefix_slot_ids=prefix_slots or [],
                                  prefix_token_ids=prefix_ids or [], sample=kw.pop("sample", True), **kw)


def fwd(stub, items, epoch="boot-1"):
    return stub.Forward(worker_pb2.ForwardRequest(expected_epoch=epoch, items=items))


def test_info_and_health(served):
    engine, stub, ch = served
    info = stub.Info(worker_pb2.InfoRequest())
    assert info.epoch == "boot-1" and info.capacity_tokens == KV_TOKENS and info.pool_slots == KV_TOKENS + 1
    assert info.kv_heads == 1 and info.kv_bytes_per_token == 2 * info.n_layer * info.head_dim * 4
    assert info.attention_backend == "torch" and info.vocab_size == 1024 and info.n_positions == 4096
    h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert h.status == health_pb2.HealthCheckResponse.SERVING


def test_forward_decode_release_roundtrip(served):
    engine, stub, _ = served
    r = fwd(stub, [item("rt", [5, 6, 7], 0, [10, 11, 12], [], [], return_logprob=True, top_logprobs_num=2)])
    (res,) = r.results
    assert res.sampled and 0 <= res.next_token_id < 1024 and res.logprob < 0
    assert len(res.top_logprobs.entries) == 2 and 0 < r.device_seconds <= r.forward_seconds
    r2 = fwd(stub, [item("rt", [res.next_token_id], 3, [13], prompt_len=3)])
    assert r2.results[0].sampled
    assert stub.Release(worker_pb2.ReleaseRequest(request_ids=["rt", "never-seen"])).released == 1
    with pytest.raises(grpc.RpcError) as e:
        fwd(stub, [item("rt", [1], 4, [14])])
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_non_final_chunk_does_not_sample(served):
    _, stub, _ = served
    (res,) = fwd(stub, [item("nf", [1, 2, 3], 0, [20, 21, 22], [], [], sample=False)]).results
    assert not res.sampled and res.next_token_id == -1
    stub.Release(worker_pb2.ReleaseRequest(request_ids=["nf"]))


BAD = {
    "wrong epoch": (lambda: [item("x", [1], 0, [30], [], [])], "other-boot", grpc.StatusCode.FAILED_PRECONDITION,
                    "expected_epoch"),
    "position >= n_positions": (lambda: [item("x", [1, 2], 4095, [30, 31], [30 + i % 400 + 40 for i in range(4095)],
                                              [1] * 4095)], None, grpc.StatusCode.INVALID_ARGUMENT, "n_positions 4096"),
    "slot outside pool": (lambda: [item("x", [1], 0, [KV_TOKENS + 1], [], [])], None, grpc.StatusCode.INVALID_ARGUMENT,
                          f"slot id {KV_TOKENS + 1} is outside the pool"),
    "reserved slot": (lambda: [item("x", [1], 0, [0], [], [])], None, grpc.StatusCode.INVALID_ARGUMENT,
                      "reserved slot 0"),
    "prefix slot outside pool": (lambda: [item("x", [1], 1, [30], [-3], [1])], None, grpc.StatusCode.INVALID_ARGUMENT,
                                 "prefix slot id -3"),
    "token >= vocab": (lambda: [item("x", [1, 1024], 0, [30, 31], [], [])], None, grpc.StatusCode.INVALID_ARGUMENT,
                       "token id 1024 is outside the vocabulary"),
    "prefix token >= vocab": (lambda: [item("x", [1], 1, [30], [31], [5000])], None, grpc.StatusCode.INVALID_ARGUMENT,
                              "token id 5000"),
    "slot/input length mismatch": (lambda: [item("x", [1, 2], 0, [30], [], [])], None,
                                   grpc.StatusCode.INVALID_ARGUMENT, "1 slot_ids for 2 input_ids"),
    "prefix length != position_start": (lambda: [item("x", [1], 3, [30], [31, 32], [1, 2])], None,
                                        grpc.StatusCode.INVALID_ARGUMENT, "2 prefix_slot_ids but position_start 3"),
    "unknown request": (lambda: [item("ghost", [1], 5, [30])], None, grpc.StatusCode.NOT_FOUND, "'ghost' is not known"),
    "duplicate request ids": (lambda: [item("d", [1], 0, [30], [], []), item("d", [2], 0, [31], [], [])], None,
                              grpc.StatusCode.INVALID_ARGUMENT, "appears twice"),
    "slot written twice": (lambda: [item("a", [1], 0, [30], [], []), item("b", [2], 0, [30], [], [])], None,
                           grpc.StatusCode.INVALID_ARGUMENT, "slot id 30 is written twice"),
    "empty input": (lambda: [item("x", [], 0, [], [], [])], None, grpc.StatusCode.INVALID_ARGUMENT, "no input_ids"),
    "empty batch": (lambda: [], None, grpc.StatusCode.INVALID_ARGUMENT, "empty forward batch"),
    "bad temperature": (lambda: [item("x", [1], 0, [30], [], [], sampling=common_pb2.SamplingParams(temperature=-1))],
                        None, grpc.StatusCode.INVALID_ARGUMENT, "temperature must be >= 0"),
    "negative position": (lambda: [item("x", [1], -1, [30])], None, grpc.StatusCode.INVALID_ARGUMENT, "position_start -1"),
    "echo over cached prefix": (lambda: [item("x", [1], 1, [30], [31], [1], return_prompt_logprobs=True)], None,
                                grpc.StatusCode.INVALID_ARGUMENT, "prompt logprobs"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_validation_error_changes_nothing_and_worker_keeps_serving(served, case):
    engine, stub, _ = served
    make_items, epoch, code, text = BAD[case]
    # a live request decoding alongside the bad item: its state and the pool must be untouched by the error
    (first,) = fwd(stub, [item("live", [3, 4, 5], 0, [100, 101, 102], [], [], return_logprob=True)]).results
    pool_before = [t.clone() for t in engine.kv_pool.k + engine.kv_pool.v]
    table_before = {rid: (list(s.slots), list(s.tokens)) for rid, s in engine.requests.items()}
    live = [] if case == "empty batch" else [item("live", [first.next_token_id], 3, [103])]
    with pytest.raises(grpc.RpcError) as e:
        fwd(stub, [*live, *make_items()], epoch or "boot-1")
    assert e.value.code() == code, e.value.details()
    assert text in e.value.details()
    assert all(torch.equal(a, b) for a, b in zip(pool_before, engine.kv_pool.k + engine.kv_pool.v))
    assert {rid: (list(s.slots), list(s.tokens)) for rid, s in engine.requests.items()} == table_before
    # the worker still serves: the live request continues at the same position
    (nxt,) = fwd(stub, [item("live", [first.next_token_id], 3, [103], return_logprob=True)]).results
    assert nxt.sampled
    assert stub.Release(worker_pb2.ReleaseRequest(request_ids=["live"])).released == 1


def test_cli_serves_and_stops_on_sigterm(model_dir):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker_svc", "--listen", "127.0.0.1:0", "--model-path", str(model_dir),
         "--device", "cpu", "--dtype", "float32", "--kv-tokens", "256", "--attention", "auto", "--worker-id", "w-7",
         "--switch-interval-us", "700"],
        cwd=root, stderr=subprocess.PIPE, text=True, env={**os.environ, "CODESERVE_SWITCH_INTERVAL_US": "250"})
    try:
        port = None
        deadline = time.monotonic() + 120
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            rec = json.loads(line)
            if rec.get("event") == "serving":
                port = rec["port"]
                assert rec["switch_interval_s"] == pytest.approx(700e-6)  # its own flag over the variable
        assert port, "worker never logged serving"
        with grpc_server.channel(f"127.0.0.1:{port}") as ch:
            info = worker_pb2_grpc.WorkerStub(ch).Info(worker_pb2.InfoRequest())
            assert info.worker_id == "w-7" and info.capacity_tokens == 256 and len(info.epoch) == 32
            assert info.attention_backend == "torch" and info.model_name == "codeserve-default"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
