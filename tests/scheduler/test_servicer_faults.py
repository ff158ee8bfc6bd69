"""The Scheduler servicer on a real gRPC server over a scheduler stand-in that fails on purpose: a fault in the
servicer is counted once, at the scheduler (generate_errors{UNKNOWN}), with the counted trailer that keeps the
gateway from counting it again (request_errors{500})."""

from __future__ import annotations

import grpc
import structlog
from prometheus_client.parser import text_string_to_metric_families

from codeserve.v1 import scheduler_pb2, scheduler_pb2_grpc, worker_pb2
from common.counted import counted_by_scheduler
from common.aio_server import start_aio
from common.grpc_server import channel
from scheduler_svc.service import SERVICE_NAME, SchedulerServicer
from tests.stack import request


class FaultyScheduler:
    """What the servicer reads of a Scheduler; ``submit`` raises an unexpected error (the injected fault)."""

    info = worker_pb2.WorkerInfo(vocab_size=1000, n_positions=512, eos_token_id=0)
    capacity = 4096
    outbox = None

    def queue_lengths(self) -> tuple[int, int, int]:
        return 0, 0, 0

    def submit(self, req) -> None:
        raise RuntimeError("injected fault")

    def abort(self, rid: str, reason: str) -> bool:
        return False


def test_an_unexpected_servicer_error_is_counted_once_with_the_trailer(tokenizer):
    servicer = SchedulerServicer(FaultyScheduler(), tokenizer, structlog.get_logger())
    running = start_aio(lambda srv: scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, srv), [SERVICE_NAME])
    chan = channel(f"127.0.0.1:{running.port}")
    try:
        stub = scheduler_pb2_grpc.SchedulerStub(chan)
        try:
            list(stub.Generate(request(input_ids=[5, 6, 7], max_new_tokens=2), timeout=10))
            raise AssertionError("the call succeeded")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNKNOWN, err
            assert counted_by_scheduler(err.trailing_metadata()), err.trailing_metadata()  # was: no trailer
    finally:
        chan.close()
        running.stop(None)
    samples = {s.name + "".join(f"|{k}={v}" for k, v in s.labels.items()): s.value
               for f in text_string_to_metric_families(servicer.metrics.render()) for s in f.samples}
    assert samples["codeserve:generate_errors_total|code=UNKNOWN"] == 1
    assert not any(k.startswith("vllm:request_success_total") for k in samples)
