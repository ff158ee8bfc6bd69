"""The Forwards in flight: sent to the worker and not yet applied, in the order their replies are applied.

The pipeline knows Forwards only (a batch, its pending reply, its seq); it numbers them (``next_seq``: unique per
worker epoch across scheduler restarts, the worker orders Forwards by it), sends them to run after Forward
``after_seq`` and ahead of Forward ``before_seq`` (``worker_svc/ordering.py``), and hands them back in order.
Every ForwardRequest it builds carries the pending worker releases (``release_request_ids``, taken from
``releases``, a ``worker_releases.WorkerReleases``): the worker drops them when that Forward starts running.
What is sent when, and what a reply does to the requests, is the loop's (``scheduler_svc/scheduler.py``).
Loop thread only.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from codeserve.v1 import worker_pb2
from scheduler_svc.batch import Batch
from scheduler_svc.worker_client import PendingForward


@dataclass(frozen=True)
class InFlight:
    """A Forward sent and not yet applied: its batch, the pending reply, its seq."""

    batch: Batch
    pending: PendingForward
    seq: int


class Pipeline:
    """Forwards in flight on ``worker`` (a WorkerClient). ``len()`` is their number; true while any is in flight.
    ``releases`` (WorkerReleases): the ids each ForwardRequest built here carries."""

    def __init__(self, worker, releases) -> None:
        self.worker, self.releases = worker, releases
        self.inflight: deque[InFlight] = deque()
        self._seq = time.time_ns() // 1000

    def __len__(self) -> int:
        return len(self.inflight)

    def next_seq(self) -> int:
        """The seq of the next Forward (also of one the loop sends and waits for at once)."""
        self._seq += 1
        return self._seq

    def request_ids(self) -> set[str]:
        """Ids of the requests in some Forward in flight."""
        return {e.req.rid for sent in self.inflight for e in sent.batch.entries}

    def holds(self, pending: PendingForward) -> bool:
        """True when ``pending`` is the reply of a Forward in flight."""
        return any(pending is sent.pending for sent in self.inflight)

    def head(self) -> InFlight:
        """The Forward whose reply is applied next (IndexError when none is in flight)."""
        return self.inflight[0]

    def prepare(self, items: list[worker_pb2.ForwardItem], after_seq: int = 0,
                before_seq: int = 0) -> worker_pb2.ForwardRequest:
        """A numbered ForwardRequest of ``items``, built ahead of ``send`` (its ``after_seq`` may still be set),
        carrying every pending worker release (``WorkerReleases.take``). Also for a Forward the loop sends and
        waits for at once (``worker.send``)."""
        request = self.worker.prepare(items, self.next_seq(), after_seq, before_seq)
        request.release_request_ids.extend(self.releases.take(request.seq))
        return request

    def send(self, batch: Batch, request: worker_pb2.ForwardRequest) -> InFlight:
        """Sends the prepared ``request`` of ``batch`` without waiting and queues it: last, or (its
        ``before_seq``) just before that Forward, so its reply is applied when it comes, not after that
        Forward's. (The two hold different requests, so either order is correct.)"""
        sent = InFlight(batch, self.worker.send(request), request.seq)
        at = next((i for i, f in enumerate(self.inflight) if f.seq == request.before_seq), len(self.inflight))
        self.inflight.insert(at, sent)
        return sent

    def pop(self) -> InFlight:
        """Removes and returns the head (its reply is being applied)."""
        return self.inflight.popleft()

    def drop(self) -> list[PendingForward]:
        """Forgets every Forward in flight (after a failure or a stall) and returns their pending replies."""
        pending = [sent.pending for sent in self.inflight]
        self.inflight.clear()
        return pending
