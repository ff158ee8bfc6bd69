"""The overlapped decode chain (``Scheduler._chain``): when the loop chains decode Forward N+1 behind N instead of
draining (``can_chain``, ``admits_first``), and what N+1 holds (``continuation`` for the requests of N,
``continuation_batch`` with those at their first decode too; ``Planner.continuation`` decides the steps and
allocates).
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from scheduler_svc.batch import Batch, Entry
from scheduler_svc.chunk_ahead import prefill_continues
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.multistep import steps_for
from scheduler_svc.pipeline import InFlight, Pipeline
from scheduler_svc.request import Req, State, stop_ids
from scheduler_svc.stats import Stats
from scheduler_svc.worker_client import PendingForward


def admits_first(waiting: int, running: int, cfg: SchedulerConfig) -> bool:
    """True when the overlapped chain admits ``waiting`` requests before it waits (``cfg.chain_admissions`` and
    room under ``max_running_requests``)."""
    return cfg.chain_admissions and waiting > 0 and running < cfg.max_running_requests


def last_chunk(e: Entry) -> bool:
    """True when ``e`` is a request's last prefill chunk: it samples the request's first token."""
    return not e.from_last and e.req.state == State.PREFILL and e.sample and not prefill_continues(e)


def ends_prefills(inflight: Batch, running: Sequence[Req]) -> bool:
    """True when extend ``inflight`` holds the last chunk of every running request in PREFILL (none continues
    after it), and none of its requests collects prompt logprobs (the worker answers those with an input it is
    sent, never from its last sample): once it is applied every running request decodes."""
    last = {e.req.rid for e in inflight.entries if last_chunk(e)}
    return (not any(prefill_continues(e) or e.req.wants_prompt_logprobs for e in inflight.entries)
            and all(r.rid in last for r in running if r.state == State.PREFILL))


def can_chain(inflight: Batch, running: Sequence[Req], waiting: int, cfg: SchedulerConfig) -> bool:
    """True in steady decode: the in-flight batch is decode, and no running request is in PREFILL (its extend
    is not applied yet). Also behind an extend (``cfg.chain_after_extend``) that ends every prefill
    (``ends_prefills``) while no waiting request has room (those go in an extend behind it: ``chunk_ahead``): the
    first decode of its requests is chained behind it, each from the token it samples. A request with an abort pending does not stop it: the continuation leaves it out, and
    the loop ends it once no Forward in flight holds it (``RequestTable.abort``). A decoding request not in the in-flight batch (admitted while
    it ran, its extend applied) joins the continuation at its first decode (``Planner.continuation``). Requests
    waiting with room do not stop it: the chain admits them first (``Scheduler._chain``), so an arrival's extend
    runs after the decode in flight, not after a drain of it and of the one queued behind it. Without
    ``cfg.chain_admissions`` (``--no-chain-admissions``): False while ``waiting`` requests have room or a running
    request is not in the in-flight batch (the loop drains, the synchronous path admits). Never without
    ``cfg.overlap``."""
    if not cfg.overlap:  # (``--no-overlap``: nothing is chained)
        return False
    if inflight.kind == "extend":
        return (cfg.chain_after_extend and not (waiting and len(running) < cfg.max_running_requests)
                and ends_prefills(inflight, running))
    if inflight.kind != "decode":
        return False
    if not cfg.chain_admissions:
        held = {e.req.rid for e in inflight.entries}
        if (waiting and len(running) < cfg.max_running_requests) or any(r.rid not in held for r in running):
            return False
    return not any(r.state == State.PREFILL for r in running)


def chain_past(pipeline: Pipeline, planner, table, cfg: SchedulerConfig, items: Callable[[Batch], list],
               stats: Stats) -> InFlight | None:
    """With ``pipeline`` [the last extend E ahead of a decode D, D] and D's reply in (D started before E reached the
    worker and ran first), sends the next decode Forward now, behind E (``planner``: the Planner, ``table``: the
    RequestTable, neither imported here: the planner imports this module): every running request's, D's continuing
    ones and E's from their last samples (``planner.continuation(E, D)``, ``items(batch)`` its ForwardItems), rather
    than after both replies are applied (``Scheduler._drain_extends``). When ``can_chain`` would chain behind E,
    in the ``queued`` overlap mode, E and D holding no request in common. Returns D (applied by
    the caller once E is) or None (nothing sent). The start of a wave of fixed-length requests (H100 run 29, 1B
    c64): the arrivals' extends queued ahead of a decode of the first few requests, which ran first; the decode of
    all of them was built once the last extend's reply was applied and reached the worker ~11 ms after the device
    went idle."""
    if len(pipeline) != 2 or cfg.overlap_mode != "queued":
        return None
    head, tail = pipeline.inflight
    e, d = head.batch, tail.batch
    if (e.kind != "extend" or d.kind != "decode" or not tail.pending.ok()
            or not can_chain(e, table.running, len(table.waiting), cfg)
            or {x.req.rid for x in e.entries} & {x.req.rid for x in d.entries}):
        return None
    sent = _send_next(pipeline, planner, table, items, stats, "decode_past_extends", head.seq, (e, d))
    return tail if sent else None


def chain_ahead(pipeline: Pipeline, planner, table, cfg: SchedulerConfig, items: Callable[[Batch], list],
                stats: Stats, eos: int) -> bool:
    """Chain depth 2 (``cfg.chain_depth``): with ``pipeline`` [N, N+1], both decode and nothing between them, and
    N's reply in but not applied, sends N+2 now, after N+1 (``planner.continuation(N+1, unapplied=(N,))``: N's
    tokens counted as in flight, ``items(batch)`` its ForwardItems), so it reaches the worker while N+1 runs, in
    time to be prepared and launched behind it; N is applied after. Depth 1 sends N+2 only once N is applied: at
    c256 on an H100 (run 32, ``bench/results/h200-run32/call1/c256_decodes.txt``) 26 of 30 256-row decodes
    reached the worker 1-9 ms before the Forward ahead ended and waited 6-18 ms for their launch. Only in the
    ``queued`` overlap mode, in steady decode (``can_chain`` of N+1) with nothing waiting (an arrival's extend goes
    ahead of N+2 while N+2 has not started at the worker, ``before_seq``). The requests N stopped at a stop id
    (``stopped_in``; ``eos``: the model's EOS id) are left out of N+2. Returns True when N+2 was sent."""
    if cfg.chain_depth < 2 or cfg.overlap_mode != "queued" or len(pipeline) != 2 or table.waiting:
        return False
    head, tail = pipeline.inflight
    if (head.batch.kind != "decode" or tail.batch.kind != "decode" or not head.pending.ok()
            or not can_chain(tail.batch, table.running, 0, cfg)):
        return False
    return _send_next(pipeline, planner, table, items, stats, "decode_chained_ahead", tail.seq, (tail.batch,),
                      unapplied=(head.batch,), stopped=stopped_in(head, eos))


def _send_next(pipeline: Pipeline, planner, table, items: Callable[[Batch], list], stats: Stats, counter: str,
               after_seq: int, inflight: tuple[Batch, ...], **kw) -> bool:
    """Plans the decode Forward behind ``inflight`` (``planner.continuation(*inflight, **kw)``, the table published
    after its Allocate) and sends it to run after Forward ``after_seq``, counted under ``decode_chained`` and
    ``counter``; False when no request continues or the pool cannot fund it (nothing sent)."""
    nxt = planner.continuation(*inflight, **kw)
    table.publish()
    if nxt is None:
        return False
    pipeline.send(nxt, pipeline.prepare(items(nxt), after_seq=after_seq))
    stats.add("decode_chained")
    stats.add(counter)
    return True


def stopped_in(head: InFlight, eos: int) -> set[str]:
    """Ids of the requests that Forward ``head`` (its reply in, not applied) stopped at a stop id (or skipped): the
    worker answers their rows in the Forward behind it skipped, and a Forward after that one holding such a row could
    not be prepared ahead nor launched behind it (``Engine._prepare_ahead``: the row's table is shorter)."""
    results = {r.request_id: r for r in head.pending.result().results}
    out = set()
    for e in head.batch.entries:
        r = results.get(e.req.rid)
        if r is None:
            continue
        last = r.next_token_ids[-1] if r.next_token_ids else r.next_token_id  # (read only when it sampled)
        if r.skipped or (r.sampled and last in stop_ids(e.req.params, eos)):
            out.add(e.req.rid)
    return out


def chained_pair(pipeline: Pipeline) -> bool:
    """True when ``pipeline`` is [N, N+1], both decode: N+1 was sent by ``chain_ahead`` before N was applied (the
    loop's next round waits for N's reply, ``Scheduler._chain``)."""
    return len(pipeline) == 2 and all(f.batch.kind == "decode" for f in pipeline.inflight)


def continuation(inflight: Batch, max_steps: int, ahead: dict[str, int] | None = None,
                 stopped: frozenset[str] | set[str] = frozenset()) -> list[tuple[Entry, int]]:
    """(in-flight entry, decode steps) for each request that continues in the next Forward: not finished (a
    request finished while an earlier Forward was processed is in ``inflight`` only to be dropped), no abort
    pending, and tokens left after the in-flight entry's (it yields exactly ``steps`` tokens unless the request
    ends at a stop token, which the worker then knows). In an extend: its decode riders, and the requests whose
    last prefill chunk it is (they sample their first token there). ``max_steps``: 1 when any request of the next
    Forward is not multi-step eligible (``Planner.continuation`` decides it once for all of them). ``ahead``: per
    request id, the tokens of Forwards before ``inflight`` whose replies are not applied yet (``chain_ahead``);
    ``stopped``: ids of requests one of those stopped (``stopped_in``), left out."""
    ahead = ahead or {}
    plan = []
    for e in inflight.entries:
        req = e.req
        if (not (req.state == State.DECODE or (inflight.kind == "extend" and last_chunk(e))) or req.abort_requested
                or req.rid in stopped):
            continue
        after = req.remaining_new_tokens - ahead.get(req.rid, 0) - e.steps
        if after > 0:
            plan.append((e, steps_for(req, max_steps, after)))
    return plan


def continuation_batch(plan: list[tuple[Entry, int]], first: list[tuple[Req, int]],
                       slots: dict[str, tuple[int, ...]]) -> Batch:
    """The next decode Batch: per continuing request one ``from_last`` entry where its in-flight entry ends (``start
    + n - 1 + steps``: a decode's ``start + steps``, a last prefill chunk's ``start + n``; ``behind`` when that entry
    creates the request at the worker), then per request at its ``first`` decode (admitted while ``inflight`` ran,
    not in it) one entry at its ``kv_len``; each with ``slots[rid]`` (as many as its steps)."""
    return Batch("decode", tuple(Entry(e.req, start=e.start + e.n - 1 + e.steps, n=1, slot_ids=slots[e.req.rid],
                                       sample=True, steps=k, from_last=True, behind=not e.req.worker_knows)
                                 for e, k in plan)
                 + tuple(Entry(r, start=r.kv_len, n=1, slot_ids=slots[r.rid], sample=True, steps=k) for r, k in first))


def wait_reply_or_arrival(pending: PendingForward, wake: threading.Event, arrived,
                          idle: Callable[[], None] | None = None) -> bool:
    """Waits until ``pending``'s reply is in (False) or ``arrived()`` says a request can be admitted (True),
    whichever comes first. ``wake`` is the intake's event (set on every submit and abort); the reply sets it
    too. ``arrived`` runs on this thread after each wake-up. ``idle`` (when given) runs once, the first time
    nothing has arrived and the reply is not in yet: work for the loop's idle time (it raises what it raises),
    after which arrivals and the reply are looked at again before waiting."""
    pending.add_done_callback(wake.set)
    idled = idle is None
    while True:
        wake.clear()  # state is read after clearing: a set that comes later wakes the next wait
        if arrived():
            return True
        if pending.done():
            return False
        if not idled:
            idled = True
            idle()
            continue
        wake.wait(1.0)  # the reply, a submit or an abort sets it; 1 s only bounds a lost wake-up
