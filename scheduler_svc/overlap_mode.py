"""When overlapped decode sends Forward N+1 (``--overlap-mode``; the designs are described in
``scheduler_svc/scheduler.py``). Kept apart so that the scheduler's argument parser imports nothing heavy."""

# "queued" (default): at once: it waits at the worker behind N; arrivals' extends are sent with
# before_seq = N+1 and run first when they reach the worker before N+1 started (worker_svc/ordering.py).
# "just-in-time": when N's reply is in (arrivals' extends sent meanwhile run first).
OVERLAP_MODES = ("queued", "just-in-time")
DEFAULT_OVERLAP_MODE = "queued"
