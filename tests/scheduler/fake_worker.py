"""Pieces shared by the scheduler's stand-in workers (test_arrival_order.RecordingWorker,
arrival_sim.SimWorker): a reply for each item, and a PendingForward answered later by the fake."""

from __future__ import annotations

from concurrent.futures import Future

from codeserve.v1 import worker_pb2
from scheduler_svc.worker_client import PendingForward


def forward_response(items, token: int, forward_seconds: float = 0.0) -> worker_pb2.ForwardResponse:
    """Every sampled position gets ``token``: a multi-step item all its steps, a one-step item when it samples."""
    out = []
    for it in items:
        if it.decode_steps > 1:
            out.append(worker_pb2.ForwardResult(request_id=it.request_id, next_token_ids=[token] * it.decode_steps,
                                                logprobs=[0.0] * it.decode_steps))
        else:
            out.append(worker_pb2.ForwardResult(request_id=it.request_id, sampled=it.sample,
                                                next_token_id=token if it.sample else 0))
    return worker_pb2.ForwardResponse(results=out, forward_seconds=forward_seconds)


class LaterReply(PendingForward):
    """The scheduler's PendingForward over a plain Future, which the fake answers with ``answer(reply)``."""

    def __init__(self) -> None:
        self.future: Future = Future()
        super().__init__(self.future, "fake-worker")

    def answer(self, reply: worker_pb2.ForwardResponse) -> None:
        if not self.future.done():
            self.future.set_result(reply)
