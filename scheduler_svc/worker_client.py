"""Thin client of the worker service. A Forward is sent without waiting (``prepare`` then ``send``) and
answered through a ``PendingForward``, whose ``result`` raises WorkerEpochChanged on
FAILED_PRECONDITION."""

from __future__ import annotations

import grpc

from codeserve.v1 import worker_pb2, worker_pb2_grpc
from common import hop_trace
from common.poller_keeper import PollerKeeper
from scheduler_svc.errors import DependencyError, DependencyUnavailable, WorkerEpochChanged
from scheduler_svc.rpc import OUTAGE_CODES, RETRY_CODES, call, dependency_channel


def _epoch(err: grpc.RpcError) -> Exception | None:
    if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
        return WorkerEpochChanged(err.details() or "worker epoch changed")
    return None


class PendingForward:
    """A Forward sent without waiting (overlapped decode). ``result()`` waits for the reply; ``cancel()``
    drops it (the scheduler resyncs after an error, so a dropped Forward's effects do not matter)."""

    def __init__(self, future: grpc.Future, target: str) -> None:
        self._future, self.target = future, target

    def result(self) -> worker_pb2.ForwardResponse:
        """The reply. Raises WorkerEpochChanged (FAILED_PRECONDITION), DependencyUnavailable (UNAVAILABLE,
        DEADLINE_EXCEEDED, CANCELLED, or ABORTED: the Forward it followed failed; not retried: the caller
        resyncs) or DependencyError naming the code and details."""
        try:
            return self._future.result()
        except grpc.RpcError as err:
            code = err.code()
            if code in RETRY_CODES or code in OUTAGE_CODES or code == grpc.StatusCode.ABORTED:
                raise DependencyUnavailable("worker", self.target, f"Forward: {code.name}: {err.details()}") from err
            mapped = _epoch(err)
            if mapped is not None:
                raise mapped from err
            raise DependencyError("worker", "Forward", code, err.details() or "") from err

    def cancel(self) -> None:
        self._future.cancel()

    def done(self) -> bool:
        """True once the reply (or the error) is in: ``result()`` then returns or raises at once."""
        return self._future.done()

    def ok(self) -> bool:
        """True once the reply is in and is not an error (``result()`` then returns at once)."""
        return self._future.done() and not self._future.cancelled() and self._future.exception() is None

    def add_done_callback(self, fn) -> None:
        """Calls ``fn()`` (no arguments, on a gRPC thread; at once when already done) when the reply is in."""
        self._future.add_done_callback(lambda _future: fn())


class WorkerClient:
    """Client of one worker at ``target``. ``epoch`` is the epoch the scheduler registered the pool with.

    Forward and Release are not retried blindly on UNAVAILABLE when the worker restarted: a retry to a
    new process answers FAILED_PRECONDITION (epoch mismatch), which is the signal to resync.
    """

    def __init__(self, target: str, timeout: float = 120.0) -> None:
        self.target, self.timeout = target, timeout
        self._chan = dependency_channel(target)
        self._stub = worker_pb2_grpc.WorkerStub(self._chan)
        self._keeper = PollerKeeper(self._chan)  # Forwards are sent with .future(): no thread started per call
        self.epoch = ""

    def close(self) -> None:
        self._keeper.close()
        self._chan.close()

    def info(self) -> worker_pb2.WorkerInfo:
        return call("worker", self.target, "Info", self._stub.Info, worker_pb2.InfoRequest(), 10.0)

    def prepare(self, items: list[worker_pb2.ForwardItem], seq: int, after_seq: int = 0,
                before_seq: int = 0) -> worker_pb2.ForwardRequest:
        """The ForwardRequest of one batch, built ahead (its ``after_seq`` may be set before ``send``); the worker
        runs it after Forward ``after_seq`` (0: at once). ``before_seq``: run ahead of that Forward if it has not
        started at the worker (see worker.proto). Its ``release_request_ids`` are added by ``Pipeline.prepare``."""
        return worker_pb2.ForwardRequest(expected_epoch=self.epoch, items=items, seq=seq, after_seq=after_seq,
                                         before_seq=before_seq)

    def send(self, request: worker_pb2.ForwardRequest) -> PendingForward:
        """Sends a prepared ForwardRequest without waiting."""
        if hop_trace.enabled():  # an admission's first chunk (common/hop_trace.py)
            for item in request.items:
                if item.has_prefix:
                    hop_trace.mark(item.request_id, "extend_sent")
        return PendingForward(self._stub.Forward.future(request, timeout=self.timeout), self.target)

    def release(self, request_ids: list[str]) -> int:
        """The Release RPC: drops ``request_ids``' worker state now; returns how many the worker held. Raises what
        ``rpc.call`` raises."""
        if not request_ids:
            return 0
        return call("worker", self.target, "Release", self._stub.Release,
                    worker_pb2.ReleaseRequest(request_ids=request_ids), 10.0).released
