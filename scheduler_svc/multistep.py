"""Multi-step decode on the scheduler side: how many decode steps each running request gets in one Forward.

With ``--decode-steps K`` (> 1) a decode batch allocates up to K slots per request in one Cache.Allocate
and the worker runs up to K decode steps in one Forward (``worker_svc/multistep.py``), so gRPC and
scheduling happen once per K steps instead of once per step. A request gets fewer steps near its
``max_new_tokens`` (never more than it may still generate), and one step when it asks for what the worker
does per step only (penalties, top logprobs). The whole batch runs one step while requests wait for
admission and the running set has room, so a new arrival waits one step, not K, for its prefill
(``scheduler_svc/planner.py``). A multi-step result is applied in ``scheduler_svc/results.py``.
"""

from __future__ import annotations

from scheduler_svc.request import Req


def multistep_eligible(req: Req) -> bool:
    """True when the worker can run several steps of ``req`` without the host (no penalties, no top-N)."""
    s = req.params.sampling
    penalties = ((s.repetition_penalty not in (0.0, 1.0)) or s.frequency_penalty != 0.0 or s.presence_penalty != 0.0)
    return not penalties and req.params.top_logprobs_num == 0


def steps_for(req: Req, max_steps: int, left: int | None = None) -> int:
    """Decode steps for ``req`` in the next Forward (>= 1): at most ``max_steps`` and ``left``, the new tokens it
    may still generate when that Forward starts (default: its ``remaining_new_tokens``; a Forward chained
    behind an in-flight one passes what remains after that one's steps); 1 when it is not multi-step
    eligible."""
    if max_steps <= 1 or not multistep_eligible(req):
        return 1
    return max(1, min(max_steps, req.remaining_new_tokens if left is None else left))
