"""Chunked prefill pipelined: when an extend is sent behind the one in flight, and what it holds (issue 15,
technique 4).

A prefill chunk that does not end its prompt samples nothing (``Entry.sample`` False), so where the request's
next chunk starts (``start + n`` of the chunk in flight) is known before that chunk's reply. The loop
(``Scheduler._chunk_ahead``) therefore plans, allocates and sends the next extend while the one in flight runs,
with ``after_seq`` = the one in flight, and applies the replies in order: the worker goes from chunk k to chunk
k+1 without waiting for chunk k's reply, its Match and Allocate and the send. At most two Forwards are in flight
(the one running and the one behind it).

The extend behind holds, in the running order (as ``Planner.extend``): every running request in PREFILL, at
``start + n`` of its entry in flight when it has one (``behind``: no prefix carried, the worker knows it from
that chunk) or at its ``kv_len`` (nothing of it is in flight: its state is applied), within the chunk budget;
then admissions in the budget left. Mixed chunks (``cfg.mixed_chunk``): every decoding request rides one step,
a rider of the extend in flight from its last sample (``input_from_last_sample`` at its entry's ``start + 1``,
as the decode continuation of overlapped decode: its token there is not known yet), one not in it at its
``kv_len`` with its last token; a rider whose ``max_new_tokens`` ends in the extend in flight is left out, one
that stops at a stop token there is skipped by the worker, and one ended there by a stop string is computed and
dropped (FINISHING until the extend behind is applied).

The same holds for admissions: while requests wait with room in the running set, the round after an extend is
an extend of admissions, and those do not depend on the reply in flight (Match and Allocate are the cache's), so
a burst of arrivals is prefilled in back-to-back extends too (the H200's c64 phase: 64 prompts of 1,024 tokens
are 8 extends of 8,192 tokens, none of whose prompts continues). Admission reads the running requests' unwritten
prompts before the reply in flight is applied: their reserve is larger than after it (never smaller).

Nothing is sent behind (the loop drains and takes the synchronous path) when the extend in flight holds no
prefill that continues and no admission is possible. A request with an abort pending gets no chunk or ride
behind: the loop ends it once no Forward in flight holds it (``RequestTable.abort``). A failure of the extend in flight drops the one behind (``Recovery.drop_in_flight``; the worker
answers it ABORTED) and the resync's new session frees both's slots at the cache.
"""

from __future__ import annotations

from typing import Sequence

from scheduler_svc.batch import Batch, Entry
from scheduler_svc.request import Req, State


def prefill_continues(e: Entry) -> bool:
    """True when ``e`` is a prefill chunk after which its request's prompt (prompt + output on a recompute) goes
    on: the next chunk starts at ``e.start + e.n``."""
    return (not e.from_last and e.req.state == State.PREFILL
            and e.start + e.n < len(e.req.prompt_ids) + len(e.req.output_ids))


def can_send_ahead(inflight: Batch, running: Sequence[Req], waiting: int, max_running: int) -> bool:
    """True when an extend can be sent behind ``inflight``: it is an extend, the round after it would be an
    extend too (a prefill in it continues, or ``waiting`` requests may be admitted: room in the running set;
    a request with an abort pending gets nothing behind: ``chunks_ahead``, ``riders_ahead``)."""
    if inflight.kind != "extend":
        return False
    return (bool(waiting) and len(running) < max_running) or any(prefill_continues(e) for e in inflight.entries)


def chunks_ahead(inflight: Batch, running: Sequence[Req], budget: int) -> list[tuple[Req, int, int, bool]]:
    """(request, start, tokens, behind) of the prefill chunks of the extend behind ``inflight``, within
    ``budget`` tokens: each running request in PREFILL, in running order, from the end of its entry in
    ``inflight`` (behind = True) or from its ``kv_len``; one whose prompt ends in ``inflight`` has none."""
    ends = {e.req.rid: e.start + e.n for e in inflight.entries if not e.from_last and e.req.state == State.PREFILL}
    plan = []
    for req in running:
        if req.state != State.PREFILL or req.abort_requested or budget <= 0:
            continue
        behind = req.rid in ends
        start = ends[req.rid] if behind else req.kv_len
        n = min(len(req.prompt_ids) + len(req.output_ids) - start, budget)
        if n > 0:
            plan.append((req, start, n, behind))
            budget -= n
    return plan


def riders_ahead(inflight: Batch, running: Sequence[Req]) -> list[tuple[Req, int, bool]]:
    """(request, start, from its last sample) of the one-step decode riders of the extend behind ``inflight``:
    each decoding request; a rider of ``inflight`` at its entry's ``start + 1`` from its last sample (left out
    when its ``max_new_tokens`` end there), any other at its ``kv_len``."""
    riding = {e.req.rid: e for e in inflight.entries if e.sample and e.req.state == State.DECODE}
    plan = []
    for req in running:
        if req.state != State.DECODE or req.abort_requested:
            continue
        e = riding.get(req.rid)
        if e is None:
            plan.append((req, req.kv_len, False))
        elif req.remaining_new_tokens > 1:  # one token of it comes from ``inflight``
            plan.append((req, e.start + 1, True))
    return plan
