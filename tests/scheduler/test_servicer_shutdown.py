"""The scheduler's shutdown ends its streams before its server stops: ``SchedulerServicer.wait_calls_ended`` returns
once every Generate handler has handed its end to gRPC. A server that stops refuses new calls at once, the gateway's
health probe among them, and a gateway that saw the probe fail first abandoned a stream with the probe's reason
instead of the stream's own "shutting down" (tests/reliability/test_drain.py, once in session 23's CI)."""

from __future__ import annotations

import threading
import time

import grpc
import structlog

from codeserve.v1 import scheduler_pb2_grpc, worker_pb2
from common.aio_server import start_aio
from common.grpc_server import channel
from scheduler_svc.request import StreamEnd
from scheduler_svc.service import SERVICE_NAME, SchedulerServicer
from tests.stack import request


class HoldingScheduler:
    """What the servicer reads of a Scheduler; ``submit`` keeps the request (the test ends its stream)."""

    info = worker_pb2.WorkerInfo(vocab_size=1000, n_positions=512, eos_token_id=0)
    capacity = 4096

    def __init__(self) -> None:
        self.submitted = []
        self.outbox = None

    def queue_lengths(self) -> tuple[int, int, int]:
        return 0, 0, 0

    def submit(self, req) -> None:
        self.submitted.append(req)

    def abort(self, rid: str, reason: str) -> bool:
        return False


def test_wait_calls_ended_returns_once_every_stream_handed_its_end_to_grpc(tokenizer):
    sched = HoldingScheduler()
    servicer = SchedulerServicer(sched, tokenizer, structlog.get_logger())
    running = start_aio(lambda srv: scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, srv), [SERVICE_NAME])
    chan = channel(f"127.0.0.1:{running.port}")
    box: list = []

    def call() -> None:
        try:
            list(scheduler_pb2_grpc.SchedulerStub(chan).Generate(request(input_ids=[5, 6, 7], max_new_tokens=2),
                                                                 timeout=30))
            box.append("ended without an error")
        except grpc.RpcError as err:
            box.append(err)

    client = threading.Thread(target=call, daemon=True)
    client.start()
    try:
        deadline = time.monotonic() + 30
        while not sched.submitted:
            assert time.monotonic() < deadline, "the call never reached submit"
            time.sleep(0.005)
        assert servicer.open_calls() == 1
        assert not servicer.wait_calls_ended(0.05), "a stream still open"
        sched.submitted[0].out.put(StreamEnd(grpc.StatusCode.UNAVAILABLE, "scheduler shutting down (SIGTERM)"))
        assert servicer.wait_calls_ended(10.0) and servicer.open_calls() == 0
        client.join(10)
        err = box[0]
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.UNAVAILABLE, err
        assert "shutting down" in err.details()
    finally:
        chan.close()
        running.stop(None)
