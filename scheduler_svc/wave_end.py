"""At a wave's end the loop lets the request streams take their last messages before its own bookkeeping.

When every running request finishes in the Forward just applied and nothing is in flight or waiting (a wave of
requests of one length ends: serve_bench's fixed-length phases, a batch job), the device idles until the next
requests arrive, and they arrive only once the clients read those last messages. Each message reaches its client
through the servicer thread of its Generate stream, which must take the GIL; the loop, applying the reply and then
releasing the finished requests (their written tokens for the cache, the worker's releases, a log line each), holds
it, and a woken thread gets it only when the loop blocks or at the interpreter's switch interval (5 ms). H100 run 21's
hop trace: the 64 last messages built 2-5 ms after the device went idle reached their streams 11-42 ms after it
(``final_message -> last_yield``). A CPU experiment of session 21 (64 threads woken by one that stays busy): p50
18 ms; with the putting thread sleeping until they took their items: p50 ~5 ms.

``let_streams_take`` is that sleep: the loop polls the finished requests' queues, sleeping (the GIL free) until every
one is empty (its thread took the last message) or ``bound_s`` passed. Off by default (``SchedulerConfig.
wave_end_yield_ms`` = 0) until an H200 run shows it pays; nothing waits on it but the loop's own release work, since
nothing else runs at a wave's end.
"""

from __future__ import annotations

import time
from typing import Sequence


def let_streams_take(queues: Sequence, bound_s: float, poll_s: float = 2e-4) -> float:
    """Sleeps in steps of ``poll_s`` seconds until every queue (``queue.Queue``-like: ``empty()``) is empty or
    ``bound_s`` seconds passed; returns the seconds it waited. Raises ValueError for a negative bound or a poll
    step <= 0."""
    if bound_s < 0 or poll_s <= 0:
        raise ValueError(f"bound_s must be >= 0 and poll_s > 0 (got {bound_s}, {poll_s})")
    t0 = time.monotonic()
    deadline = t0 + bound_s
    while any(not q.empty() for q in queues) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return time.monotonic() - t0


def streams_first(yield_ms: float, finished: Sequence, table, in_flight, outbox, stats) -> None:
    """The loop's call after applying a Forward (``Scheduler._apply``, before ``RequestTable.finish``): at a wave's end
    (``yield_ms`` > 0; ``finished``, the requests that finished in it, are every running one of ``table``; nothing
    in flight (``in_flight`` empty), waiting or held in ``outbox``) sleeps up to ``yield_ms`` until their streams took
    their last messages (``let_streams_take``) and counts it in ``stats`` (``wave_end_yields``)."""
    if (yield_ms > 0 and finished and len(finished) == len(table.running) and not in_flight and not table.waiting
            and not outbox.holding):
        let_streams_take([r.out for r in finished], yield_ms / 1e3)
        stats.add("wave_end_yields")
