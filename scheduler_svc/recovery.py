"""Connection and recovery of the scheduling loop: the cache session and the worker's epoch (``connect``,
``renew_session``), dependency outages, a frozen worker, stale Forwards, and the resync after any of them.

Dependency outage (``DependencyUnavailable``, ``SessionLost``, ``WorkerEpochChanged``): the loop backs off and
resyncs: a new cache session (the cache frees every slot and lock of the old one), the pool registered with the
worker's epoch (a new epoch flushes it), the requests released at the worker, every running request requeued
first in line (recomputed; its output so far is kept). After ``outage_timeout`` s of outage every request fails
with UNAVAILABLE naming the service.

Frozen worker (``liveness``, ``--worker-stall-timeout``): every wait for a Forward reply also watches the
worker's health checks (``scheduler_svc/liveness.py``). When the worker has not answered them for the stall
timeout, the loop stops waiting and fails the requests of the Forwards in flight and everything running or
waiting with UNAVAILABLE naming the worker; new requests are refused at once while it stays silent. Their cache
state is released as after any dependency failure (the resync). Safety of the resumed worker's stale writes:
the Forwards in flight are not cancelled but kept (``stale``), and the resync first waits until each has
answered (its reply or its error, bounded by the Forward deadline). The worker runs Forwards one at a time under
its engine lock, so an answered Forward has finished writing K/V; only then is any new Forward sent. A stale
Forward writes only slots that its own requests owned (never slots in the radix tree: a request's tokens are
inserted after the Forward that wrote them was applied, its prompt when its prefill completes, the rest when it
finishes); the new session frees those slots, so new requests
may get them, and their K/V is written by Forwards that run after the stale one. Nothing stale is read as
valid K/V. (A freeze longer than the Forward deadline ends the wait with DEADLINE_EXCEEDED: then the guarantee
rests on the engine lock alone, which holds for a Forward that was running or waiting for the lock when the
worker froze.)

Loop thread only, except ``worker_stalled`` and ``stall_error`` (any thread).
"""

from __future__ import annotations

import contextlib
import threading
import time

import grpc

from codeserve.v1 import cache_pb2
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.errors import DependencyUnavailable, WorkerStalled
from scheduler_svc.liveness import WorkerLiveness
from scheduler_svc.pipeline import Pipeline
from scheduler_svc.requests import RequestTable
from scheduler_svc.worker_client import PendingForward

STALL_POLL_S = 0.25  # seconds between looks at the worker's liveness while a Forward reply is awaited


class Recovery:
    """The loop's connection to the cache and the worker and its way back after a failure. ``info`` (WorkerInfo)
    and ``capacity`` (tokens) are known after ``connect``; ``needs_resync`` is set by a failure and cleared by
    ``resync``; ``stale`` holds the Forwards sent before a failure or stall, answered before any new Forward."""

    def __init__(self, cache, worker, cfg: SchedulerConfig, log, liveness: WorkerLiveness | None,
                 table: RequestTable, pipeline: Pipeline, stopping: threading.Event) -> None:
        self.cache, self.worker, self.cfg, self.log, self.liveness = cache, worker, cfg, log, liveness
        self.table, self.pipeline, self.stopping = table, pipeline, stopping
        self.info = None
        self.capacity = 0
        self.needs_resync = False
        self.stale: list[PendingForward] = []
        self._down_since: float | None = None
        self._down_error = ""  # the DependencyUnavailable of the outage in progress ("" when none is)
        self._last_renew = 0.0

    # ---- connection ------------------------------------------------------------------------------------------
    def connect(self) -> None:
        """Opens a new cache session (releasing everything of an older one), registers the pool with the
        worker's epoch (a new epoch flushes it). Raises the clients' errors."""
        opened = self.cache.open_session(self.cfg.owner, self.cfg.lease_seconds)
        self.info = self.worker.info()
        self.worker.epoch = self.info.epoch
        member = cache_pb2.PoolMember(worker_id=self.info.worker_id, epoch=self.info.epoch,
                                      capacity_tokens=self.info.capacity_tokens)
        reg = self.cache.register_pool(self.info.page_size, [member])
        self.capacity = reg.capacity
        self._last_renew = time.monotonic()
        self.log.info("connected", session=opened.session_id, replaced=opened.replaced_session_id,
                      epoch=self.info.epoch, capacity=reg.capacity, page_size=reg.page_size, flushed=reg.flushed)

    def renew_session(self) -> None:
        """Renews the cache session's lease every third of it."""
        if time.monotonic() - self._last_renew >= self.cfg.lease_seconds / 3:
            self.cache.renew_session()
            self._last_renew = time.monotonic()

    def up(self) -> None:
        """A round completed: no outage."""
        self._down_since = None
        self._down_error = ""

    def outage_reason(self) -> str:
        """The outage in progress, "" when none: ``<service> service at <target> unavailable: ... for N s`` while
        the cache or the worker cannot be reached (set by ``on_dependency_error``, cleared by a completed round),
        else, with a liveness monitor, the worker's refused health check (a dead worker, noticed while idle too).
        Thread-safe enough for GetLoad: it reads two attributes the loop writes."""
        since, error = self._down_since, self._down_error
        if since is not None and error:
            return f"{error} for {time.monotonic() - since:.1f} s"
        if self.liveness is not None and self.liveness.refused():
            return f"worker service at {self.worker.target} refused its health check: {self.liveness.last_error}"
        return ""

    def note_worker_refusal(self) -> None:
        """Marks a resync when the worker refused a health check since the last look (it died; idle, no Forward
        failed to say so): the resync registers the pool with the restarted worker's epoch, which flushes it, so
        a router probing the pool never sees the dead worker's prefixes. While the worker is still down the
        resync fails as an outage (``on_dependency_error``)."""
        if self.liveness is not None and self.liveness.take_refusal():
            self.log.warning("worker_refused_health_check", error=self.liveness.last_error)
            self.needs_resync = True

    # ---- failures ----------------------------------------------------------------------------------------------
    def drop_in_flight(self) -> None:
        """After a dependency error or a stall: the Forwards in flight become stale (the resync waits for their
        answers before a new Forward is sent) and finishing requests are orphaned (the new session frees them)."""
        self.stale += self.pipeline.drop()
        self.table.lose_finishing()

    @contextlib.contextmanager
    def dropping_in_flight(self):
        """For a block that waits on Forwards in flight or sends more behind them: an exception raised in it (a
        Forward's failure, a cache call's) first drops what is in flight (``drop_in_flight``: the worker aborts
        what follows a failed Forward, the resync requeues), then propagates unchanged."""
        try:
            yield
        except BaseException:
            self.drop_in_flight()
            raise

    def fail_all(self, code: grpc.StatusCode, message: str) -> None:
        """Drops the Forwards in flight and ends every request (``RequestTable.fail_all``)."""
        self.drop_in_flight()
        self.table.fail_all(code, message)

    def resync(self) -> None:
        """After a worker restart, a lost session, an outage or a stall: waits for the stale Forwards, reconnects,
        releases at the worker and requeues every running request. Raises while the cache or the worker is still
        down, WorkerStalled while the worker is silent."""
        self.drop_in_flight()
        self.await_stale()
        rids = self.table.worker_held_ids()
        self.connect()
        requeued = self.table.resynced(rids)  # same epoch: the worker drops their tables; new epoch: it knows none
        self.log.warning("resynced", requeued=requeued)
        self.needs_resync = False

    def on_dependency_error(self, exc: Exception) -> None:
        """Marks a resync, logs, fails everything after ``outage_timeout`` s of outage, and backs off."""
        now = time.monotonic()
        self.needs_resync = True
        if self._down_since is None:
            self._down_since = now
        if isinstance(exc, DependencyUnavailable):
            self._down_error = str(exc)
        down = now - self._down_since
        self.log.warning("dependency_error", error=str(exc), kind=type(exc).__name__, down_seconds=round(down, 3))
        if isinstance(exc, DependencyUnavailable) and down > self.cfg.outage_timeout:
            self.table.take_new()
            self.fail_all(grpc.StatusCode.UNAVAILABLE, f"{exc} for {down:.0f} s; request not completed (retry later)")
        self.stopping.wait(min(2.0, 0.1 * 2 ** min(int(down), 5)) if isinstance(exc, DependencyUnavailable) else 0)

    # ---- frozen worker -------------------------------------------------------------------------------------------
    def worker_stalled(self) -> bool:
        """True when the worker has not answered health checks past the stall timeout (False without liveness)."""
        return self.liveness is not None and self.liveness.stalled()

    def stall_error(self) -> WorkerStalled:
        lv = self.liveness
        worker = self.info.worker_id if self.info is not None else "?"
        return WorkerStalled(f"worker {worker} has not answered health checks for {lv.unresponsive_for():.1f} s "
                             f"(stall timeout {lv.stall_timeout_s:g} s; last probe: {lv.last_error}); the request "
                             f"was not completed: retry when the worker answers again")

    def reply(self, pending: PendingForward):
        """``pending``'s reply (raises what ``PendingForward.result`` raises). Raises WorkerStalled when the
        worker stops answering health checks first; ``pending`` is then stale (the resync waits for it)."""
        if self.liveness is not None:
            self._wait_answered(pending)
        return pending.result()

    def _wait_answered(self, pending: PendingForward) -> None:
        """Waits until ``pending`` has its reply or error (bounded by the Forward deadline); raises WorkerStalled
        (keeping ``pending`` stale unless it is in flight, where ``drop_in_flight`` finds it) when the worker is
        stalled meanwhile (never without ``liveness``)."""
        if pending.done():
            return
        answered = threading.Event()
        pending.add_done_callback(answered.set)
        while not answered.wait(STALL_POLL_S):
            if self.worker_stalled():
                if not self.pipeline.holds(pending) and pending not in self.stale:
                    self.stale.append(pending)
                raise self.stall_error()

    def await_stale(self) -> None:
        """Before any new Forward: waits until every Forward sent before a failure or stall has answered, so
        the worker is done with it (it runs Forwards one at a time under its engine lock)."""
        while self.stale:
            self._wait_answered(self.stale[0])
            self.stale.pop(0)

    def on_worker_stalled(self, exc: WorkerStalled, wake: threading.Event) -> None:
        """Fails every request (in flight, running, waiting, new) with UNAVAILABLE and ``exc``'s message; a
        resync follows when the worker answers again (when anything was sent or held). Waits a moment on
        ``wake`` (the intake's event)."""
        table = self.table
        table.take_new()
        # a waiting request registered by its early Match holds a lock and slots: the new session frees them
        sent = bool(table.running or self.pipeline or table.finishing or self.stale
                    or any(r.early is not None for r in table.waiting))
        failed = len(table.waiting) + len(table.running)
        if failed or sent:
            self.log.error("worker_stalled", error=str(exc), failed=failed, in_flight=len(self.pipeline),
                           stale=len(self.stale))
        self.fail_all(grpc.StatusCode.UNAVAILABLE, str(exc))
        self.needs_resync = self.needs_resync or sent
        wake.wait(STALL_POLL_S)
        wake.clear()
