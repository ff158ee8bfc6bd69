"""The engine's mutual exclusion, with deferrable Forwards served last.

One Forward (or Release, or the warm-up) runs on the engine at a time. With the scheduler's
``--overlap-mode queued``, decode Forward N+1 reaches the worker while N runs and waits for N here; an extend
of requests admitted meanwhile may reach the worker after it. When N ends, a plain lock would let whichever
thread wins the race run, and the extend's first token could wait for N+1's K decode steps. N+1 is sent
``deferrable``: when the engine frees, every non-deferrable waiter is served before any deferrable one, and
waiters of one kind in arrival order (a plain ``threading.Lock`` has no order at all).

A deferrable Forward is never starved for long: the scheduler sends extends only while the Forward before
N+1 runs, and at most one per arrival, so the non-deferrable queue empties.
"""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from typing import Iterator


class EngineGate:
    """A lock with two classes of waiters. ``hold(deferrable)`` is its context manager. Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held = False
        self._waiting: dict[bool, deque[object]] = {False: deque(), True: deque()}

    def _may_enter(self, ticket: object, deferrable: bool) -> bool:
        return (not self._held and self._waiting[deferrable][0] is ticket
                and (not deferrable or not self._waiting[False]))

    @contextmanager
    def hold(self, deferrable: bool = False) -> Iterator[None]:
        """Holds the engine for the ``with`` block: waits until it is free, every earlier waiter of the same kind
        has held it, and (``deferrable``) no non-deferrable waiter is left."""
        ticket = object()
        with self._cond:
            queue = self._waiting[deferrable]
            queue.append(ticket)
            try:
                self._cond.wait_for(lambda: self._may_enter(ticket, deferrable))
            except BaseException:  # interrupted while waiting: leave the queue, let the next one in, re-raise
                queue.remove(ticket)
                self._cond.notify_all()
                raise
            queue.popleft()
            self._held = True
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()

    def waiting(self) -> tuple[int, int]:
        """(non-deferrable, deferrable) waiters now; for tests and logs."""
        with self._cond:
            return len(self._waiting[False]), len(self._waiting[True])
