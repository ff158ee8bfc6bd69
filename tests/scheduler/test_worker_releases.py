"""Worker releases ride on the next Forward (ForwardRequest.release_request_ids) through the real stack: the cache
service and the worker service (the real engine on the default model) on real ports, the real scheduler loop on
a thread. The worker's servicer counts its Release RPCs. Requests that finish or are aborted while another keeps
decoding cost no Release RPC; their ids reach the worker on the Forwards that follow, and once everything ended
and the loop idles the worker holds no request's state (the idle flush)."""

from __future__ import annotations

import contextlib
import threading

import pytest
import structlog

from codeserve.v1 import scheduler_pb2, worker_pb2_grpc
from common import grpc_server
from scheduler_svc.output import OutputStream
from scheduler_svc.request import Finish, StreamEnd
from scheduler_svc.scheduler import Scheduler, SchedulerConfig
from scheduler_svc.validate import build_request
from scheduler_svc.worker_client import WorkerClient
from tests.scheduler.cache_service import cache_service
from tests.scheduler.test_liveness import ending, wait_until
from tests.worker.helpers import make_engine
from worker_svc.service import SERVICE_NAME as WORKER_SERVICE, WorkerServicer

WAIT_S = 60.0  # bound for a broken scheduler, not a measured time


class CountingServicer(WorkerServicer):
    """The real servicer; records each Release RPC's ids and each Forward's release_request_ids."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.release_rpcs: list[list[str]] = []
        self.carried: list[str] = []
        self.failed: list[str] = []  # Forwards the worker refused (recorded, then the refusal goes on)

    def Release(self, request, context):
        self.release_rpcs.append(list(request.request_ids))
        return super().Release(request, context)

    def Forward(self, request, context):
        self.carried += request.release_request_ids
        try:
            return super().Forward(request, context)
        except BaseException:  # context.abort raises: recorded, then raised on
            self.failed.append(f"{context.code()}: {context.details()}")
            raise


@pytest.fixture(params=[True, False], ids=["overlap", "sync"])
def stack(request, model_path, tokenizer):
    services = contextlib.ExitStack()
    _, cache = services.enter_context(cache_service())
    engine = make_engine(model_path, kv_tokens=4096, epoch="boot-1")
    servicer = CountingServicer(engine)
    worker_server = grpc_server.start(lambda s: worker_pb2_grpc.add_WorkerServicer_to_server(servicer, s),
                                      [WORKER_SERVICE], "127.0.0.1:0")
    worker = WorkerClient(f"127.0.0.1:{worker_server.port}")
    sched = Scheduler(cache, worker, SchedulerConfig(max_running_requests=8, overlap=request.param),
                      structlog.get_logger())
    sched.connect()
    loop = threading.Thread(target=sched.run, daemon=True)
    loop.start()

    def submit(rid: str, max_new: int, prompt: list[int]):
        req = build_request(scheduler_pb2.GenerateRequest(
            request_id=rid, input_ids=scheduler_pb2.TokenIds(ids=prompt), max_new_tokens=max_new, ignore_eos=True),
            tokenizer, sched.info, sched.capacity)
        req.stream = OutputStream(req, tokenizer, sched.info.eos_token_id)
        sched.submit(req)
        return req

    yield sched, engine, servicer, submit
    sched.stop("test over")
    loop.join(WAIT_S)
    worker.close()
    worker_server.server.stop(0)
    services.close()


def first_token(req) -> None:
    item = req.out.get(timeout=WAIT_S)
    assert not isinstance(item, StreamEnd) and item.token_ids, item


def test_ended_requests_ride_on_the_next_forward_and_an_idle_worker_holds_none(stack):
    sched, engine, servicer, submit = stack
    long = submit("long", 4000, [7, 8, 9, 10])
    first_token(long)
    done: list[str] = []
    for i in range(4):
        short = submit(f"s{i}", 3, [11 + i, 12, 13, 14, 15])
        tokens, end = ending(short)
        assert len(tokens) == 3 and end.code is None, (tokens, end)
        again = submit(f"s{i}", 3, [11 + i, 12, 13, 14, 15])  # the id reused at once: its release may be in flight
        assert ending(again) == (tokens, end)
        aborted = submit(f"a{i}", 3000, [21 + i, 22, 23])
        first_token(aborted)  # running (the worker knows it)
        assert sched.abort(aborted.rid)
        _, end = ending(aborted)
        assert aborted.finish == Finish.ABORT and end.code is None, end
        done += [short.rid, aborted.rid]
    # every one ended while "long" kept decoding: not one Release RPC; their ids rode on the Forwards after
    assert servicer.release_rpcs == [] and long.finish is None
    wait_until(lambda: set(done) <= set(servicer.carried), f"{done} carried by Forwards ({servicer.carried})")
    # the worker drops a carried id when that Forward starts running: one queued behind the Forward in flight
    # (aborts no longer drain the pipeline) has been received, not yet run
    wait_until(lambda: set(engine.requests) == {"long"}, f"the worker holding only long ({set(engine.requests)})")
    assert servicer.release_rpcs == [] and long.finish is None and servicer.failed == []
    assert sched.abort(long.rid)
    ending(long)
    wait_until(lambda: sched.queue_lengths()[:2] == (0, 0) and not engine.requests, "idle, the worker holding none")
    # the last abort had no Forward to ride on: the idle loop released it with one Release RPC
    assert servicer.release_rpcs == [["long"]] and engine.requests == {}
