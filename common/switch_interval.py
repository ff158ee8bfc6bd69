"""The interpreter's thread switch interval in the services' processes.

Each service is one Python process with several threads (gRPC handler threads, the scheduler's loop, the
worker's engine, channel threads). A thread woken by another (a reply put on a request's queue, a Forward handed
to the engine) must take the GIL; while another thread runs Python code it gets it only when that thread blocks or
when the switch interval expires (``sys.setswitchinterval``, 5 ms by default in CPython: the holder is asked to
drop the GIL after that long). Every hand-off between threads on a request's path can wait up to that long.

Every service calls ``configure`` at start: ``CODESERVE_SWITCH_INTERVAL_US`` microseconds (> 0) when it is set,
else CPython's default (5 ms) stays; the worker's ``--switch-interval-us`` sets its own process's (the A/B of a
shorter interval in the worker alone: at c256 a Forward's turn comes after the commit ahead of it, on another
thread, which then builds its reply holding the GIL; H100 run 33 read gaps of 9 ms from a device's end to the next
Forward's turn). The trade (H200 run 14, bench/README.md): the editor workload (tiny model, 20
typists, ``bench/editor_bench.py``), TTFT p50 at 5 ms / 250 us / 100 us: 22.7 / 21.4 / 20.8 ms, the hand-off from
the scheduler's loop to the request's stream (``first_token -> first_yield``) 1.12 / 0.66 / 0.49 ms; with fa2 in
the extend graphs 19.3 (17.0 in another run) against 16.0 ms at 100 us. But 1B c64 throughput (``bench/
serve_bench.py``) at 100 us: 13.9k against 14.5k, and 16.2k against 17.5k tok/s in a second pair: the loop's reply
processing is preempted by the request streams' threads. So the default stays CPython's; a deployment that serves
editors' keystrokes sets 100.
"""

from __future__ import annotations

import math
import os
import sys

ENV = "CODESERVE_SWITCH_INTERVAL_US"


def configure(override_us: float | None = None) -> float:
    """Sets the switch interval to ``override_us`` microseconds when given (a service's own flag), else to
    ``CODESERVE_SWITCH_INTERVAL_US`` when it is set; returns the interval in effect (seconds). Raises ValueError
    (nothing set) when the value is not a finite number > 0."""
    raw = os.environ.get(ENV)
    if override_us is not None:
        us, what = override_us, "the switch interval"
    elif raw is not None:
        try:
            us = float(raw)
        except ValueError:
            raise ValueError(f"{ENV} must be a number of microseconds, got {raw!r}") from None
        what = ENV
    else:
        return sys.getswitchinterval()
    if not math.isfinite(us) or us <= 0:
        raise ValueError(f"{what} must be a finite number of microseconds > 0, got {us}")
    sys.setswitchinterval(us / 1e6)
    return sys.getswitchinterval()
