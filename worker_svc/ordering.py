"""Ordering of overlapped Forwards: a Forward that names ``after_seq`` runs only after that Forward
completed on this worker.

With overlapped decode the scheduler sends Forward N+1 before Forward N's reply came back, so N+1 may reach
a server thread before N has taken the engine lock. N+1 carries ``after_seq = N.seq`` and waits here (not
holding the engine lock) until N is recorded as done; when N failed, or did not complete within the
timeout, N+1 fails with ABORTED naming N and the reason (and changes nothing).

Insertion ahead (``before_seq``, the scheduler's ``--overlap-mode queued``): N+1 is sent at once and waits here
for N; an extend E of requests admitted while N runs is sent later with ``after_seq = N`` and ``before_seq =
N+1``. When E arrives before N+1 has started, N+1 also waits for E (completed or failed: E's requests are not
N+1's), so when N ends E runs first and the new requests' first tokens do not wait for N+1's decode steps. When
N+1 has already started, E runs after its own after_seq as usual. The registration happens when E arrives,
under the same lock as N+1's start, so there is no window in which both are runnable and N+1 wins a race.

Launch behind (``start_early``): a decode N+1 may start before N completed, launched behind it on the device
(``Engine._launch_behind``, when the device reaches N's step ``K - launch_lead_steps``); it then counts as started, and an E arriving
later runs after it. An extend N enqueued in two parts (``worker_svc/extend_behind.py``) is marked ``launched`` once
its work is on the device and its commit is to come: an extend N+1 that reached the worker earlier waits for that
(``wait_launched``) to be launched behind it (``Engine._extend_behind``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from worker_svc.types import WorkerError

KEEP = 1024  # outcomes of the most recent Forwards kept (a waiter names the one just before it)


class ForwardOrder:
    """Outcomes of recent Forwards by seq (seq > 0 only). Thread-safe."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        """``timeout_s``: seconds a Forward waits for the ones it must follow."""
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._outcomes: OrderedDict[int, str] = OrderedDict()  # seq -> "" (completed) or the failure reason
        self._started: OrderedDict[int, None] = OrderedDict()  # seqs that passed wait_for (recent KEEP)
        self._ahead: OrderedDict[int, set[int]] = OrderedDict()  # seq -> seqs inserted ahead of it, not started
        self._launched: OrderedDict[int, None] = OrderedDict()  # seqs enqueued on the device, commit to come

    def insert_before(self, seq: int, before_seq: int, after_seq: int = 0) -> bool:
        """Forward ``seq`` asks to run ahead of Forward ``before_seq``: when that one has not started, it will
        also wait until ``seq`` has an outcome (True); when it has started, nothing changes (False). No-op
        (False) for before_seq <= 0. Raises WorkerError INVALID_ARGUMENT when ``seq`` <= 0 or ``before_seq`` is
        ``seq`` or ``after_seq`` (it would wait for itself)."""
        if before_seq <= 0:
            return False
        if seq <= 0 or before_seq in (seq, after_seq):
            raise WorkerError("INVALID_ARGUMENT", f"Forward seq {seq} cannot run before seq {before_seq} "
                                                  f"(after_seq {after_seq}): a seq > 0 is needed, other than both")
        with self._cond:
            if before_seq in self._started:
                return False
            self._ahead.setdefault(before_seq, set()).add(seq)
            self._ahead.move_to_end(before_seq)
            while len(self._ahead) > KEEP:
                self._ahead.popitem(last=False)
            return True

    def start_early(self, seq: int, after_seq: int) -> bool:
        """Forward ``seq`` starts before ``after_seq`` completed (launched behind it on the device,
        ``Engine._launch_behind``): True, and ``seq`` counts as started (a Forward inserted ahead of it later runs
        after it), when ``after_seq`` has no outcome yet and every Forward inserted ahead of ``seq`` has one; False
        (nothing changes) otherwise, or for seq <= 0, after_seq <= 0 or seq == after_seq. ``seq`` still calls ``wait_for`` for
        ``after_seq``'s outcome."""
        if seq <= 0 or after_seq <= 0 or seq == after_seq:
            return False
        with self._cond:
            if after_seq in self._outcomes or any(s not in self._outcomes for s in self._ahead.get(seq, ())):
                return False
            self._ahead.pop(seq, None)
            self._started[seq] = None
            while len(self._started) > KEEP:
                self._started.popitem(last=False)
            return True

    def wait_for(self, after_seq: int, seq: int) -> None:
        """Blocks until the Forward ``after_seq`` completed (none for after_seq <= 0) and every Forward inserted
        ahead of ``seq`` has an outcome; then ``seq`` counts as started (later insertions do not wait for it).
        Raises WorkerError ABORTED when ``after_seq`` failed, or when they did not all come within
        ``timeout_s``; INVALID_ARGUMENT when after_seq is seq."""
        if after_seq == seq and seq > 0:
            raise WorkerError("INVALID_ARGUMENT", f"Forward seq {seq} cannot run after itself (after_seq {after_seq})")
        if seq <= 0 and after_seq <= 0:
            return
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while True:
                missing = [s for s in self._ahead.get(seq, ()) if s not in self._outcomes]
                if after_seq > 0 and after_seq not in self._outcomes:
                    missing.insert(0, after_seq)
                if not missing:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkerError("ABORTED", f"Forward seq {seq} runs after seq {missing[0]}, which did not "
                                                 f"complete on this worker within {self.timeout_s:g} s")
                self._cond.wait(left)
            reason = self._outcomes[after_seq] if after_seq > 0 else ""
            if seq > 0:
                self._ahead.pop(seq, None)
                self._started[seq] = None
                while len(self._started) > KEEP:
                    self._started.popitem(last=False)
        if reason:
            raise WorkerError("ABORTED", f"Forward seq {seq} runs after seq {after_seq}, which failed: {reason}")

    def launched(self, seq: int) -> None:
        """Forward ``seq``'s work is enqueued on the device and its commit is to come; wakes ``wait_launched``."""
        if seq <= 0:
            return
        with self._cond:
            self._launched[seq] = None
            while len(self._launched) > KEEP:
                self._launched.popitem(last=False)
            self._cond.notify_all()

    def wait_launched(self, seq: int) -> bool:
        """Blocks until Forward ``seq`` was marked ``launched`` or has an outcome (at most ``timeout_s``). True when
        it was launched and has no outcome yet; False otherwise (seq <= 0 included): ``wait_for`` then decides."""
        if seq <= 0:
            return False
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while seq not in self._launched and seq not in self._outcomes:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return seq in self._launched and seq not in self._outcomes

    def done(self, seq: int, failure: str = "") -> None:
        """Records the outcome of Forward ``seq`` ("" = completed, else why it failed) and wakes waiters."""
        if seq <= 0:
            return
        with self._cond:
            self._outcomes[seq] = failure
            self._outcomes.move_to_end(seq)
            while len(self._outcomes) > KEEP:
                self._outcomes.popitem(last=False)
            self._cond.notify_all()
