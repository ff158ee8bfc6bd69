"""Pieces shared by the scheduler's stand-in workers (test_arrival_order.RecordingWorker,
arrival_sim.SimWorker): a reply for each item, and a PendingForward answered later by the fake; and a worker
that can be frozen with its health checks (``FreezableWorker``, test_liveness)."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import grpc
from grpc_health.v1 import health_pb2

from codeserve.v1 import worker_pb2
from scheduler_svc.worker_client import PendingForward


def forward_response(items, token: int, forward_seconds: float = 0.0,
                     device_seconds: float = 0.0) -> worker_pb2.ForwardResponse:
    """Every sampled position gets ``token``: a multi-step item all its steps, a one-step item when it samples."""
    out = []
    for it in items:
        if it.decode_steps > 1:
            out.append(worker_pb2.ForwardResult(request_id=it.request_id, next_token_ids=[token] * it.decode_steps,
                                                logprobs=[0.0] * it.decode_steps))
        else:
            out.append(worker_pb2.ForwardResult(request_id=it.request_id, sampled=it.sample,
                                                next_token_id=token if it.sample else 0))
    return worker_pb2.ForwardResponse(results=out, forward_seconds=forward_seconds, device_seconds=device_seconds)


class LaterReply(PendingForward):
    """The scheduler's PendingForward over a plain Future, which the fake answers with ``answer(reply)``."""

    def __init__(self) -> None:
        self.future: Future = Future()
        super().__init__(self.future, "fake-worker")

    def answer(self, reply: worker_pb2.ForwardResponse) -> None:
        if not self.future.done():
            self.future.set_result(reply)


class RpcFailure(grpc.RpcError):
    """An RPC error as a stub raises it: ``code()`` and ``details()``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FakeHealth:
    """A grpc.health.v1 stub: answers ``status`` (SERVING), or raises ``failure`` (a StatusCode) when it is set
    (DEADLINE_EXCEEDED: frozen; UNAVAILABLE: dead). Records each call's deadline."""

    def __init__(self) -> None:
        self.status = health_pb2.HealthCheckResponse.SERVING
        self.failure: grpc.StatusCode | None = None
        self.calls: list[tuple[str, float]] = []

    def Check(self, request: health_pb2.HealthCheckRequest, timeout: float) -> health_pb2.HealthCheckResponse:
        self.calls.append((request.service, timeout))
        if self.failure is not None:
            raise RpcFailure(self.failure, "Deadline Exceeded" if self.failure == grpc.StatusCode.DEADLINE_EXCEEDED
                             else "failed to connect to all addresses")
        return health_pb2.HealthCheckResponse(status=self.status)


class WatchedReply(LaterReply):
    """A LaterReply that counts ``add_done_callback`` calls (someone waits for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiters = 0

    def add_done_callback(self, fn) -> None:
        self.waiters += 1
        super().add_done_callback(fn)


class FreezableWorker:
    """Stands in for WorkerClient. Answers every Forward at once with TOKEN for each sampled position, until
    ``freeze()``: then Forwards are held (not answered) and ``health`` answers nothing (DEADLINE_EXCEEDED), as a
    SIGSTOPed worker. ``thaw()`` lets health answer again; ``answer_held()`` finishes the held Forwards (the
    stale ones a resumed worker completes). ``events`` records ("send", seq, rids), ("answer", seq), ("info",),
    ("release", rids) in order (a Forward's release_request_ids as a "release" just before its "answer")."""

    def __init__(self, token: int) -> None:
        self.token, self.epoch = token, ""
        self.health = FakeHealth()
        self.frozen = False
        self.held: list[tuple[worker_pb2.ForwardRequest, WatchedReply]] = []
        self.events: list[tuple] = []
        self.changed = threading.Condition()

    def _event(self, *event) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    def info(self) -> worker_pb2.WorkerInfo:
        self._event("info")
        return worker_pb2.WorkerInfo(worker_id="w0", epoch="e1", model_name="fake", n_positions=2048, vocab_size=1000,
                                     eos_token_id=0, capacity_tokens=4096, page_size=1, pool_slots=4097)

    def prepare(self, items, seq: int, after_seq: int = 0, before_seq: int = 0) -> worker_pb2.ForwardRequest:
        return worker_pb2.ForwardRequest(expected_epoch=self.epoch, items=items, seq=seq, after_seq=after_seq,
                                         before_seq=before_seq)

    def send(self, request: worker_pb2.ForwardRequest) -> WatchedReply:
        reply = WatchedReply()
        self._event("send", request.seq, tuple(it.request_id for it in request.items))
        with self.changed:
            if self.frozen:
                self.held.append((request, reply))
                self.changed.notify_all()
                return reply
        self._answer(request, reply)
        return reply

    def _answer(self, request: worker_pb2.ForwardRequest, reply: WatchedReply) -> None:
        if request.release_request_ids:  # the releases it carries are done when it runs
            self._event("release", tuple(request.release_request_ids))
        self._event("answer", request.seq)
        reply.answer(forward_response(request.items, self.token))

    def release(self, request_ids) -> int:
        self._event("release", tuple(request_ids))
        return len(request_ids)

    def freeze(self) -> None:
        with self.changed:
            self.frozen = True
        self.health.failure = grpc.StatusCode.DEADLINE_EXCEEDED

    def thaw(self) -> None:
        with self.changed:
            self.frozen = False
        self.health.failure = None

    def answer_held(self) -> None:
        with self.changed:
            held, self.held = self.held, []
        for request, reply in held:
            self._answer(request, reply)
