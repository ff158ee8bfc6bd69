"""Stream messages held back while the loop builds and sends the next decode Forward.

Each request's messages go to its queue (``Req.out``; a ``LoopQueue`` read by its Generate handler on the gRPC
server's event loop, ``stream_queue.py``). Handing messages over costs the loop: every hand-off wakes the server's
event loop, which then takes the GIL to pass the messages to gRPC. In steady overlapped decode the loop puts a
message for every running request when it applies Forward N's results, and at once builds Forward N+2: its slots
come from a Cache.Allocate round trip, and when the loop wants the GIL back after that call it waits behind what it
has just woken (up to the interpreter's switch interval each time; with one thread per stream, before the streams
moved to one event loop, that wait was most of the continuation's ~6 ms on the H200, run 17, and N+2 reached the
worker late). With the outbox on (``SchedulerConfig.deliver_after_send``), the messages of a decode Forward applied
by the chain are held and handed over once the next Forward is sent (``just-in-time`` overlap: once it is built):
the streams then run while the loop waits for the worker. A decode Forward with nothing chained behind it (a wave of
requests ends in it) has its messages go out when it has been applied (``Scheduler._apply`` holds them while it
applies, so they go in one hand-off): nothing is built meanwhile, and the next wave's requests, sent by the clients
on those last messages, would reach the worker that much later (H100 run 20: ~20 ms). Every round that does not
chain lets them go first, and so does a failure (``Scheduler.run``: ``released_on_error``, before a resync;
``OutputStream.fail``: before a stream's error).

``put`` is called from any thread (the loop; a Generate handler for a request that finishes before it is queued);
while holding, messages are kept in arrival order and ``release`` puts them in that order (``stream_queue.put_all``:
one wake-up per event loop), so each request's messages keep their order. The cost: a held message reaches its
stream one Allocate round trip later.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

from scheduler_svc.stream_queue import put_all


class Outbox:
    """Puts items on queues now, or, between ``hold()`` and ``release()``, keeps them and puts them at the release."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list | None = None  # (queue, item) in put order while holding

    @property
    def holding(self) -> bool:
        return self._held is not None

    def put(self, queue, item) -> None:
        """``queue.put(item)`` now, or at the next ``release`` while holding."""
        with self._lock:
            if self._held is not None:
                self._held.append((queue, item))
            else:
                queue.put(item)

    def hold(self) -> None:
        """Keeps what is put from now until ``release`` (no-op while holding)."""
        with self._lock:
            if self._held is None:
                self._held = []

    def release(self) -> int:
        """Puts what was kept, in put order, and stops holding; returns how many items. No-op when not holding."""
        with self._lock:  # the puts under the lock: nothing put meanwhile overtakes what was kept
            held, self._held = self._held or (), None
            put_all(held)  # a stream loop's queues in one wake-up of that loop (stream_queue.py)
        return len(held)

    @contextmanager
    def batched(self):
        """Holds what the block puts and releases it at the block's end, in one hand-off per streams' event loop
        (``stream_queue.put_all``); inside a hold already, the block changes nothing (the hold's owner releases). A
        block that raises leaves the hold to ``released_on_error``."""
        took = self._held is None
        self.hold()
        yield
        if took:
            self.release()

    @contextmanager
    def released_on_error(self):
        """Releases what is held when the block raises (then re-raises): what was held goes out before anything the
        failure's handling sends."""
        try:
            yield
        except BaseException:
            self.release()
            raise
