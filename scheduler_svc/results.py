"""Applying a Forward's reply to its requests: one function per kind of item, ``kv_len`` written in one place.

Kinds of item, by their entry and result:

- finishing: the request finished in an earlier Forward (it is in this one only because this one was sent
  before that one was applied): its result is dropped;
- skipped: the worker skipped an overlapped item of a request that stopped at a stop token in the Forward
  before (the scheduler has seen it finish, or an abort dropped those tokens);
- chunk: a prefill chunk that samples nothing (not the last one, or max_new_tokens 0);
- sampled: one sampled token (the last prefill chunk, or a one-step decode);
- multi-step: up to ``steps`` tokens of a multi-step decode (``worker_svc/multistep.py``).

Every written item sets ``worker_knows`` (the worker holds its slot table now) and ``kv_len`` (tokens whose K/V
is written: the entry's start plus what the item wrote that is part of the request). A request with an abort
pending gets its ``kv_len`` and prompt logprobs, and nothing else (the table ends it next round).
"""

from __future__ import annotations

from common import hop_trace
from scheduler_svc.request import Finish, Req, State
from scheduler_svc.requests import RequestTable
from scheduler_svc.stats import Stats


def apply(batch, reply, table: RequestTable, stats: Stats) -> list[Req]:
    """Applies ``reply`` (a ForwardResponse) to the requests of ``batch``; returns the ones that finished in it
    (still in ``table.running``: ``RequestTable.finish`` takes them next). Raises RuntimeError when the reply
    does not match the batch (a result missing, a skip of a request not seen finishing, no sample where one was
    asked, more tokens than steps)."""
    results = {r.request_id: r for r in reply.results}
    missing = [e.req.rid for e in batch.entries if e.req.rid not in results]
    if missing:
        raise RuntimeError(f"Forward answered no result for requests {missing}")
    finished: list[Req] = []
    generated = dropped = 0
    if batch.kind == "extend" and hop_trace.enabled():  # not on the decode path
        for e in batch.entries:
            hop_trace.mark(e.req.rid, "extend_reply")
    for e in batch.entries:
        req, res = e.req, results[e.req.rid]
        if req.state == State.FINISHED:  # finishing: it ended in the previous Forward
            dropped += 1
            continue
        if res.skipped:
            _skipped(req)
            continue
        req.worker_knows, req.prefix_slot_ids = True, []
        if req.wants_prompt_logprobs:
            req.prompt_logprobs.extend(res.prompt_logprobs)
            req.prompt_top_logprobs.extend(res.prompt_top_logprobs)
        if req.abort_requested:  # its tokens are dropped; its K/V is written all the same
            written = len(res.next_token_ids) if e.steps > 1 else e.n
        elif e.steps > 1:
            written, accepted = _multi_step(e, res)
            generated += 0 if req.params.health_probe else accepted
        elif e.sample:
            written = _sampled(e, res, table, stats)
            generated += 0 if req.params.health_probe else 1
        else:
            written = _chunk(e)
        req.kv_len = e.start + written
        if req.state == State.FINISHED:
            finished.append(req)
    stats.add("generation_tokens", generated)
    stats.add("decode_dropped", dropped)
    stats.batch_applied()
    return finished


def _skipped(req: Req) -> None:
    """Nothing was written or sampled. Raises RuntimeError unless an abort dropped the tokens it stopped at."""
    if not req.abort_requested:
        raise RuntimeError(f"worker skipped {req.rid} (stopped at a stop token) but the scheduler "
                           f"has not seen it finish")


def _chunk(e) -> int:
    """A chunk that samples nothing; when it was the last one (max_new_tokens 0) the request finishes with
    "length". Returns tokens written."""
    req = e.req
    if e.start + e.n == len(req.prompt_ids) + len(req.output_ids):  # prompt computed, nothing to generate
        req.stream.finish_without_token(Finish.LENGTH)
    return e.n


def _sampled(e, res, table: RequestTable, stats: Stats) -> int:
    """One sampled token, streamed; the first one ends the prefill. Returns tokens written."""
    req = e.req
    if not res.sampled:
        raise RuntimeError(f"worker did not sample for {req.rid} (sample=true)")
    if req.state == State.PREFILL:
        table.prefill_done(req)
        stats.add("prompt_tokens", len(req.prompt_ids) if req.retractions == 0 and not req.params.health_probe else 0)
    req.stream.on_token(res.next_token_id, res.logprob, res.top_logprobs if req.params.top_logprobs_num else None)
    return e.n


def _multi_step(e, res) -> tuple[int, int]:
    """The tokens of a multi-step result, fed to the stream until the request finishes (one message; later
    tokens are discarded). Returns (tokens written that are part of the request, never past its last token;
    tokens accepted)."""
    req, tokens = e.req, res.next_token_ids
    if not tokens or len(tokens) > e.steps:
        raise RuntimeError(f"worker returned {len(tokens)} tokens for {req.rid} ({e.steps} decode steps)")
    accepted = req.stream.on_tokens(tokens, res.logprobs)
    return min(len(tokens), accepted + 1), accepted
