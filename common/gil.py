"""The interpreter's thread switch interval in the services (``sys.setswitchinterval``).

A service runs several Python threads: the worker's gRPC handlers (Forward N+1 is received and waits while N
runs), the scheduler's loop beside one handler thread per stream. When a thread that waits for the GIL is woken
while another runs Python, CPython lets it wait until the holder blocks or for the switch interval (5 ms by
default) before it forces a hand-over. Measured on the H200 (bench/results/h200-run12/call4, the worker bench's
chained Forwards at 5 / 0.2 / 0.05 ms): no gain in the worker (1B B = 64: 2.35 / 2.38 / 2.39 ms a step; B = 256
slower with shorter intervals), so the default stays CPython's; the flag is the A/B switch for the scheduler's
queue at keystroke rate (issue 13).
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_MS = 5.0  # CPython's own; 0.2 and 0.05 did not pay in the worker (bench/results/h200-run12/call4)


def add_flag(ap: argparse.ArgumentParser) -> None:
    """Adds ``--gil-switch-ms`` (milliseconds, default ``DEFAULT_MS``)."""
    ap.add_argument("--gil-switch-ms", type=float, default=DEFAULT_MS,
                    help="the interpreter's thread switch interval in ms (sys.setswitchinterval): how long a woken "
                         f"thread may wait for the GIL before it is handed over (default {DEFAULT_MS}; CPython's: 5; "
                         "common/gil.py says why)")


def apply(ms: float) -> None:
    """Sets the switch interval to ``ms`` milliseconds. Raises ValueError outside (0, 1000]."""
    if not 0 < ms <= 1000:
        raise ValueError(f"--gil-switch-ms must be in (0, 1000] (got {ms})")
    sys.setswitchinterval(ms / 1000)
