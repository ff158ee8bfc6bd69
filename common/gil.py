"""The interpreter's thread switch interval in the services (``sys.setswitchinterval``).

A service runs several Python threads: the worker's gRPC handlers (Forward N+1 is received and waits while N
runs), the scheduler's loop beside one handler thread per stream. When a thread that waits for the GIL is woken
(the worker's Forward N+1 once N is recorded done; the scheduler's loop when a Match reply lands) while another
runs Python (N's reply being built; a handler writing a stream message), CPython lets it wait until the holder
blocks or for the switch interval, 5 ms by default, before it forces a hand-over. On the H200 the worker's
chained Forwards (N+1 sent while N runs, as the scheduler sends them) took 0.7-1.3 ms a Forward longer than the
same Forwards sent one after the other (bench/results/h200-run12/call1: 1B B = 64, K = 8, 2.34 against 2.18 ms a
step): the GPU waited for N+1's launch behind N's reply. A shorter interval bounds that wait.
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_MS = 0.2  # bench/results/h200-run12 (worker bench --gil-switch-ms, chained Forwards); CPython's own: 5


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
