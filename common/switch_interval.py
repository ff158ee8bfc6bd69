"""The interpreter's thread switch interval in the services' processes.

Each service is one Python process with several threads (gRPC handler threads, the scheduler's loop, the
worker's engine, channel threads). A thread woken by another (a reply put on a request's queue, a Forward handed
to the engine) must take the GIL; while another thread runs Python code it gets it only when that thread blocks or
when the switch interval expires (``sys.setswitchinterval``, 5 ms by default in CPython: the holder is asked to
drop the GIL after that long). Every hand-off between threads on a request's path can wait up to that long.

``CODESERVE_SWITCH_INTERVAL_US`` (microseconds, > 0) sets it in every service that calls ``configure``; unset,
CPython's default stays.
"""

from __future__ import annotations

import math
import os
import sys

ENV = "CODESERVE_SWITCH_INTERVAL_US"


def configure() -> float:
    """Sets the switch interval from ``CODESERVE_SWITCH_INTERVAL_US`` when it is set and returns the interval in
    effect (seconds). Raises ValueError when the variable is not a finite number > 0."""
    raw = os.environ.get(ENV)
    if raw is not None:
        try:
            us = float(raw)
        except ValueError:
            raise ValueError(f"{ENV} must be a number of microseconds, got {raw!r}") from None
        if not math.isfinite(us) or us <= 0:
            raise ValueError(f"{ENV} must be a finite number of microseconds > 0, got {raw!r}")
        sys.setswitchinterval(us / 1e6)
    return sys.getswitchinterval()
