"""Thin client of the worker service. Forward raises WorkerEpochChanged on FAILED_PRECONDITION."""

from __future__ import annotations

import grpc

from codeserve.v1 import worker_pb2, worker_pb2_grpc
from scheduler_svc.errors import WorkerEpochChanged
from scheduler_svc.rpc import call, dependency_channel


def _epoch(err: grpc.RpcError) -> Exception | None:
    if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
        return WorkerEpochChanged(err.details() or "worker epoch changed")
    return None


class WorkerClient:
    """Client of one worker at ``target``. ``epoch`` is the epoch the scheduler registered the pool with.

    Forward and Release are not retried blindly on UNAVAILABLE when the worker restarted: a retry to a
    new process answers FAILED_PRECONDITION (epoch mismatch), which is the signal to resync.
    """

    def __init__(self, target: str, timeout: float = 120.0) -> None:
        self.target, self.timeout = target, timeout
        self._chan = dependency_channel(target)
        self._stub = worker_pb2_grpc.WorkerStub(self._chan)
        self.epoch = ""

    def close(self) -> None:
        self._chan.close()

    def info(self) -> worker_pb2.WorkerInfo:
        return call("worker", self.target, "Info", self._stub.Info, worker_pb2.InfoRequest(), 10.0)

    def forward(self, items: list[worker_pb2.ForwardItem]) -> worker_pb2.ForwardResponse:
        """Runs one batch; raises WorkerEpochChanged when the worker's epoch is not ``self.epoch``."""
        return call("worker", self.target, "Forward", self._stub.Forward,
                    worker_pb2.ForwardRequest(expected_epoch=self.epoch, items=items), self.timeout, _epoch)

    def release(self, request_ids: list[str]) -> int:
        if not request_ids:
            return 0
        return call("worker", self.target, "Release", self._stub.Release,
                    worker_pb2.ReleaseRequest(request_ids=request_ids), 10.0).released
