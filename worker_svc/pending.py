"""The Forwards a worker has enqueued on the device and not yet committed, in launch order.

A multi-step decode Forward and a prepared extend run in two parts (``multistep``, ``extend_behind``): enqueued under
the engine's lock, committed under it after the device ran them. Between the two, the Forward is *pending*: every
other Forward waits for the pending ones to leave before it validates against the request table (``wait_empty``),
unless it is launched behind them (``Engine._launch_behind``, ``Engine._extend_behind``), in which case it is
pending too, after them. Every method but the constructor and ``coming_behind`` is called with that lock held.

Holding a commit (``coming_behind``, ``hold``; the worker's ``--hold-commit-ms``): a multi-step Forward that arrives
while the one it follows is pending registers while it prepares and tries to launch behind; that one's commit waits
for it (bounded), so it is launched behind, the device going on at once, rather than at its turn after the commit and
a thread hand-off (H100 run 33, c256, 256-row decodes that took their turn: commit 2-3 ms, then 3.6-4.9 ms until the
next one's thread had its turn, then its launch: 9-11 ms of idle device each, ~20 a phase).
"""

from __future__ import annotations

import contextlib
import threading
import time

from worker_svc.types import WorkerError


class PendingForwards:
    """``entries``: (seq, steps) of each pending Forward, in launch order; ``steps`` is its
    ``multistep.EnqueuedSteps`` or ``extend_behind.EnqueuedExtend``, found by identity (a malformed call may reuse
    a seq). ``lock``: the engine's request-table lock, which the waits release while they block."""

    def __init__(self, lock: threading.Lock, turn_timeout_s: float = 60.0):
        self.entries: list[tuple[int, object]] = []
        self._left = threading.Condition(lock)  # notified when a pending Forward leaves, or one coming behind came
        self._coming: dict[int, int] = {}  # seq -> Forwards on their way to launch behind it (``coming_behind``)
        self.turn_timeout_s = turn_timeout_s  # seconds a Forward waits for the pending ones to leave

    def __bool__(self) -> bool:
        return bool(self.entries)

    def add(self, seq: int, steps) -> None:
        """Forward ``seq`` was enqueued (``steps``): it is pending, after those already there."""
        self.entries.append((seq, steps))

    def leave(self, steps) -> None:
        """The pending Forward of ``steps`` committed or failed: it leaves, and the Forwards waiting for their turn
        look again."""
        self.entries = [p for p in self.entries if p[1] is not steps]
        self._left.notify_all()

    def wait_empty(self, seq: int) -> None:
        """Blocks (the lock free meanwhile, so a Release RPC may run) until none is pending: Forward ``seq`` then
        validates against the committed table. Raises WorkerError ABORTED when that does not happen within
        ``turn_timeout_s``."""
        deadline = time.monotonic() + self.turn_timeout_s
        while self.entries:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError("ABORTED", f"Forward seq {seq} waited {self.turn_timeout_s:g} s for the commit of "
                                             f"Forward seq {self.entries[0][0]}, launched before it")
            self._left.wait(left)

    def wait_unguarded(self, request_ids) -> None:
        """Blocks (the lock free meanwhile) while a pending Forward guards one of ``request_ids`` (its steps'
        ``guarded`` ids: an extend at its turn with continuation rows, whose commit a Release of them would make
        ABORTED, ``Engine.forward``): the Release then drops them after that commit, as if the batch had run in one
        part under the lock. Raises WorkerError ABORTED when that does not happen within ``turn_timeout_s``."""
        ids = set(request_ids)
        deadline = time.monotonic() + self.turn_timeout_s
        while guard := next((seq for seq, steps in self.entries if ids & steps.guarded), 0):
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError("ABORTED", f"a Release of {sorted(ids)} waited {self.turn_timeout_s:g} s for the "
                                             f"commit of Forward seq {guard}, which holds one of them")
            self._left.wait(left)

    @contextlib.contextmanager
    def coming_behind(self, seq: int, register: bool):
        """(Takes the lock itself.) Around a Forward's preparation and launch behind pending Forward ``seq``: while
        inside, ``hold(seq, ...)`` waits for it. Registers only when ``register`` and ``seq`` is pending."""
        if register:
            with self._left:
                register = any(s == seq for s, _ in self.entries)
                if register:
                    self._coming[seq] = self._coming.get(seq, 0) + 1
        try:
            yield
        finally:
            if register:
                with self._left:
                    left = self._coming.pop(seq) - 1
                    if left:
                        self._coming[seq] = left
                    self._left.notify_all()

    def hold(self, seq: int, seconds: float) -> None:
        """Before Forward ``seq``'s commit: waits (the lock free meanwhile) up to ``seconds`` while a Forward is inside
        ``coming_behind(seq)`` (it launches behind ``seq``, or gives up and takes its turn after the commit)."""
        deadline = time.monotonic() + seconds
        while self._coming.get(seq):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._left.wait(left)

    def only(self, seq: int):
        """The steps of Forward ``seq`` when it is the one pending Forward, else None."""
        if len(self.entries) == 1 and self.entries[0][0] == seq:
            return self.entries[0][1]
        return None

    def last(self, seq: int, kind: type):
        """The steps of Forward ``seq`` when it is the last pending Forward and its steps are a ``kind``, else None."""
        if self.entries and self.entries[-1][0] == seq and isinstance(self.entries[-1][1], kind):
            return self.entries[-1][1]
        return None

    def all_of(self, kind: type) -> bool:
        """True when every pending Forward's steps are a ``kind`` (vacuously when none is pending)."""
        return all(isinstance(steps, kind) for _, steps in self.entries)

    def steps(self) -> list:
        """Every pending Forward's steps, in launch order."""
        return [steps for _, steps in self.entries]
