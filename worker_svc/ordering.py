"""Ordering of overlapped Forwards: a Forward that names ``after_seq`` runs only after that Forward
completed on this worker.

With overlapped decode the scheduler sends Forward N+1 before Forward N's reply came back, so N+1 may reach
a server thread before N has taken the engine lock. N+1 carries ``after_seq = N.seq`` and waits here (not
holding the engine lock) until N is recorded as done; when N failed, or did not complete within the
timeout, N+1 fails with ABORTED naming N and the reason (and changes nothing).
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
        """``timeout_s``: seconds a Forward waits for the one it must follow."""
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._outcomes: OrderedDict[int, str] = OrderedDict()  # seq -> "" (completed) or the failure reason

    def wait_for(self, after_seq: int, seq: int) -> None:
        """Blocks until the Forward ``after_seq`` completed (returns at once for after_seq <= 0). Raises
        WorkerError ABORTED when it failed or did not complete within ``timeout_s``."""
        if after_seq <= 0:
            return
        if after_seq == seq:
            raise WorkerError("INVALID_ARGUMENT", f"Forward seq {seq} cannot run after itself (after_seq {after_seq})")
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while after_seq not in self._outcomes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkerError("ABORTED", f"Forward seq {seq} runs after seq {after_seq}, which did not complete "
                                                 f"on this worker within {self.timeout_s:g} s")
                self._cond.wait(left)
            reason = self._outcomes[after_seq]
        if reason:
            raise WorkerError("ABORTED", f"Forward seq {seq} runs after seq {after_seq}, which failed: {reason}")

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
