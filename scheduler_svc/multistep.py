"""Multi-step decode on the scheduler side: how many decode steps each running request gets in one
Forward, and how a multi-step result is applied to a request.

With ``--decode-steps K`` (> 1) a decode batch allocates up to K slots per request in one Cache.Allocate
and the worker runs up to K decode steps in one Forward (``worker_svc/multistep.py``), so gRPC and
scheduling happen once per K steps instead of once per step. A request gets fewer steps near its
``max_new_tokens`` (never more than it may still generate), and one step when it asks for what the worker
does per step only (penalties, top logprobs). The whole batch runs one step while requests wait for
admission and the running set has room, so a new arrival waits one step, not K, for its prefill.
"""

from __future__ import annotations

from scheduler_svc.request import Req


def multistep_eligible(req: Req) -> bool:
    """True when the worker can run several steps of ``req`` without the host (no penalties, no top-N)."""
    s = req.params.sampling
    penalties = ((s.repetition_penalty not in (0.0, 1.0)) or s.frequency_penalty != 0.0 or s.presence_penalty != 0.0)
    return not penalties and req.params.top_logprobs_num == 0


def steps_for(req: Req, max_steps: int) -> int:
    """Decode steps for ``req`` in this batch (>= 1): at most ``max_steps`` and its remaining new tokens."""
    if max_steps <= 1 or not multistep_eligible(req):
        return 1
    return max(1, min(max_steps, req.remaining_new_tokens))


def stop_ids(req: Req, eos_token_id: int) -> list[int]:
    """Token ids that end the request (EOS unless ignore_eos, its stop token ids): the worker stops there."""
    ids = sorted(req.params.stop_token_ids)
    if not req.params.ignore_eos:
        ids.append(eos_token_id)
    return ids


def apply_tokens(req: Req, start: int, tokens, logprobs) -> int:
    """Feeds the tokens of a multi-step result (K/V written for ``len(tokens)`` tokens from position
    ``start``) to the request's stream until it finishes, as one message; later tokens are discarded. Sets ``kv_len`` to
    the written tokens that are part of the request (never past its last token). Returns tokens accepted."""
    accepted = req.stream.on_tokens(tokens, logprobs)  # one stream message per request per Forward
    req.kv_len = start + min(len(tokens), accepted + 1)
    return accepted
