"""The thread-safe side of the scheduler: new requests, live requests by id, abort flags, stop state."""

from __future__ import annotations

import threading
import time
from typing import Callable

from scheduler_svc.request import Req, State


class QueueFull(RuntimeError):
    """The waiting queue holds --max-queued-requests requests."""


class SchedulerStopped(RuntimeError):
    """The loop is not running (draining, stopped, or failed); the message says why."""


class Intake:
    """Servicer threads ``submit`` and ``abort``; the loop thread ``take``s new requests and ``forget``s
    ended ones. ``wake`` is set whenever the loop has something new to look at."""

    def __init__(self, max_queued: int) -> None:
        self.max_queued = max_queued
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._inbox: list[Req] = []
        self._live: dict[str, Req] = {}
        self._aborted: list[Req] = []  # flagged since the loop's last take_aborts, each once
        self.stopped_reason = ""
        self.busy_since = time.monotonic()   # when work arrived at an idle scheduler

    def submit(self, req: Req, waiting_now: int, on_accept: Callable[[Req, int], None] | None = None) -> None:
        """Queues a validated request; ``waiting_now`` is the loop's waiting queue length (tokens not counted), held
        to --max-queued-requests unless ``req.over_limits``.
        ``on_accept(req, inbox)`` runs once it is accepted, before it is queued, under the lock (``inbox``: requests
        queued ahead of it and not yet taken): ``EarlyMatch.claim``. Raises QueueFull, SchedulerStopped, or
        ValueError when the request id is in use."""
        with self._lock:
            if self.stopped_reason:
                raise SchedulerStopped(self.stopped_reason)
            if not req.over_limits and len(self._inbox) + waiting_now >= self.max_queued:
                raise QueueFull(f"waiting queue is full ({self.max_queued} requests)")
            if req.rid in self._live:
                raise ValueError(f"request id {req.rid!r} is already in use")
            if on_accept is not None:
                on_accept(req, len(self._inbox))
            if not self._live:
                self.busy_since = time.monotonic()
            self._live[req.rid] = req
            self._inbox.append(req)
        self.wake.set()

    def abort(self, rid: str, reason: str) -> bool:
        """Flags a live request for abort (the loop frees it within one step); the first ``reason`` given stands.
        False when unknown or ended."""
        with self._lock:
            req = self._live.get(rid)
            if req is None:
                return False
            if not req.abort_requested:  # the first reason stands (a sibling's Abort RPC, then the cancel it precedes)
                req.abort_reason = reason
                req.abort_requested = True
                self._aborted.append(req)
        self.wake.set()
        return True

    def take_aborts(self, pending: list[Req]) -> list[Req]:
        """``pending`` (flagged earlier, not yet freed) and the requests flagged since the last call, each
        once, less those that ended meanwhile: the loop frees them without scanning its queues for flags. A
        flagged request still in the inbox (submitted after the loop's last ``take``) stays flagged for a later
        call: the loop frees it once it is in the waiting queue."""
        with self._lock:
            flagged, self._aborted = pending + self._aborted, []
            if not flagged:
                return []
            inbox = {id(r) for r in self._inbox}
            self._aborted = [r for r in flagged if id(r) in inbox]
            return [r for r in flagged if self._live.get(r.rid) is r and id(r) not in inbox]

    def take(self) -> list[Req]:
        """New requests since the last call, in arrival order."""
        with self._lock:
            new, self._inbox = self._inbox, []
        return new

    def inbox_stats(self) -> tuple[int, int]:
        """(requests not yet taken, their prompt tokens)."""
        with self._lock:
            return len(self._inbox), sum(len(r.prompt_ids) for r in self._inbox)

    def load_of_others(self, router_id: str) -> tuple[int, int, int]:
        """(live, waiting, waiting tokens) of the live requests not sent by router ``router_id`` (their
        ``params.router_id`` differs): taken or not, not yet released; waiting = in the queue or the inbox, with
        its prompt and output so far to prefill. Any thread; reads each request's phase as the loop left it."""
        with self._lock:
            others = [r for r in self._live.values() if r.params.router_id != router_id]
        waiting = [r for r in others if r.phase == State.WAITING]
        return len(others), len(waiting), sum(len(r.prompt_ids) + len(r.output_ids) for r in waiting)

    def forget(self, req: Req) -> None:
        """The request ended: its id may be used again and it no longer counts as work."""
        with self._lock:
            self._live.pop(req.rid, None)

    def busy(self) -> bool:
        """True while any request is queued or running."""
        with self._lock:
            return bool(self._live)

    def stop(self, reason: str) -> None:
        """Refuses new requests from now on (the first reason is kept)."""
        with self._lock:
            self.stopped_reason = self.stopped_reason or reason
        self.wake.set()
