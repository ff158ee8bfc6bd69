"""When overlapped decode sends Forward N+1 (``--overlap-mode``; the designs are described in
``scheduler_svc/overlap.py``). Kept apart so that the scheduler's argument parser imports nothing heavy."""

# "just-in-time": when N's reply is in (arrivals' extends sent meanwhile run first).
# "queued": at once, deferrable: it waits at the worker behind N; extends that reach the worker before N ends
# still run first (worker_svc/engine_gate.py).
OVERLAP_MODES = ("just-in-time", "queued")
