"""The prefix-cache counters (``vllm:prefix_cache_queries`` / ``hits``): each request's prompt once, at admission.

A request is matched against the radix tree at every admission attempt: a deferred one is released and matched
again each round, a retracted one (or one requeued after a worker restart) is matched again with prompt +
generated tokens and then "hits" what it cached itself. Only the first admission counts, with the tokens it
looked up and the cached prefix it was admitted with, which is the ``cached_tokens`` its first message reports
(``usage.prompt_tokens_details.cached_tokens``, ``meta_info.cached_tokens``): the counters and the answers
agree. A recompute is not a query nor a hit.
"""

from __future__ import annotations

from scheduler_svc.request import Req
from scheduler_svc.stats import Stats


def count_admission(stats: Stats, req: Req, cached_tokens: int) -> None:
    """Adds ``req``'s lookup to the ``prefix_query`` / ``prefix_hit`` counters (tokens) when this is its first
    admission (a health probe's, ``Params.health_probe``, never counts); call it before ``RequestTable.admit``
    (which records the first admission's cached tokens).
    Requests collecting prompt logprobs and 1-token prompts look up nothing (an empty key, see
    ``Planner._lock_prefixes``)."""
    if req.cached_tokens >= 0 or req.params.health_probe:  # admitted before (a recompute), or a readiness probe
        return
    stats.add("prefix_query", 0 if req.wants_prompt_logprobs or len(req.prompt_ids) < 2 else len(req.prompt_ids))
    stats.add("prefix_hit", cached_tokens)
