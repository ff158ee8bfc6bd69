"""A forward batch: extend (prefill chunks) or decode (one token per request), and its ForwardItems."""

from __future__ import annotations

from dataclasses import dataclass

from codeserve.v1 import cache_pb2, worker_pb2
from scheduler_svc.request import Req, stop_ids


@dataclass(frozen=True, init=False)
class Entry:
    """One request in a batch: tokens ``all_ids[start:start+n]`` are written at ``slot_ids`` (len n);
    ``sample``: a next token is sampled (False for a non-final prefill chunk). ``steps`` > 1: a multi-step
    decode entry (n = 1 input token, ``steps`` slots; the worker writes K/V for as many tokens as it returns).
    ``from_last``: an overlapped decode entry sent before the previous Forward's reply: its input is the token
    the worker sampled last (not known here yet) and ``start`` is the predicted position. ``behind``: sent behind
    the request's previous entry, still in flight, which creates the request at the worker (a prefill chunk behind
    its previous chunk, ``scheduler_svc/chunk_ahead.py``; a first decode behind its last chunk, ``chain.py``): it
    carries no prefix though ``req.worker_knows`` is not set yet, and ``start`` is where that entry ends."""

    req: Req
    start: int
    n: int
    slot_ids: tuple[int, ...]
    sample: bool
    steps: int = 1
    from_last: bool = False
    behind: bool = False

    def __init__(self, req: Req, *, start: int, n: int, slot_ids: tuple[int, ...], sample: bool, steps: int = 1,
                 from_last: bool = False, behind: bool = False) -> None:
        # keyword-only: start, n and steps are all ints, a swap must not pass silently. The dataclass __init__
        # of a frozen class sets each field through object.__setattr__ (a decode batch builds one Entry per
        # running request per Forward); fields are set once, here
        self.__dict__.update(req=req, start=start, n=n, slot_ids=slot_ids, sample=sample, steps=steps,
                             from_last=from_last, behind=behind)


@dataclass(frozen=True)
class Batch:
    """``kind`` is "extend" or "decode"."""

    kind: str
    entries: tuple[Entry, ...]


def forward_item(e: Entry, stop_token_ids=()) -> worker_pb2.ForwardItem:
    """The worker's view of an entry. When the worker does not know the request yet (first chunk of an
    admission, not ``behind`` one in flight), the item carries the locked prefix (slots and token ids, length ``start``). ``stop_token_ids``:
    where the worker ends a multi-step entry early and marks the request stopped.
    Raises ValueError when the entry is inconsistent (slots vs tokens, prefix vs position)."""
    req = e.req
    total = len(req.prompt_ids) + len(req.output_ids)
    if (len(e.slot_ids) != max(e.n, e.steps) or e.n <= 0 or (e.start + e.n > total and not e.from_last)
            or (e.steps > 1 and e.n != 1) or (e.from_last and (e.n != 1 or not (req.worker_knows or e.behind)))):
        raise ValueError(f"{req.rid}: entry start={e.start} n={e.n} slots={len(e.slot_ids)} tokens={total} "
                         f"from_last={e.from_last} worker_knows={req.worker_knows}")
    p = req.params
    item = worker_pb2.ForwardItem(
        request_id=req.rid, position_start=e.start, slot_ids=e.slot_ids, sampling=p.sampling, sample=e.sample,
        prompt_len=len(req.prompt_ids))  # fields left at their defaults are not set (reads the same)
    if e.from_last:
        item.input_from_last_sample = True
    else:
        req.extend_ids(item.input_ids, e.start, e.start + e.n)
    if p.return_logprob and e.sample:
        item.return_logprob = True
    if p.top_logprobs_num:
        item.top_logprobs_num = p.top_logprobs_num
    if req.wants_prompt_logprobs:
        item.return_prompt_logprobs = True
    if stop_token_ids:
        item.stop_token_ids.extend(stop_token_ids)
    if e.steps > 1:
        item.decode_steps = e.steps
    if not req.worker_knows and not e.behind:
        if len(req.prefix_slot_ids) != e.start:
            raise ValueError(f"{req.rid}: prefix of {len(req.prefix_slot_ids)} slots for position {e.start}")
        item.has_prefix = True
        item.prefix_slot_ids.extend(req.prefix_slot_ids)  # the Match reply's field: copied in C
        req.extend_ids(item.prefix_token_ids, 0, e.start)
    return item


def forward_items(batch: Batch, eos_token_id: int) -> list[worker_pb2.ForwardItem]:
    """The ForwardItems of ``batch``; a sampling entry carries the request's stop ids (``request.stop_ids``).
    Raises ValueError as ``forward_item``."""
    return [forward_item(e, stop_ids(e.req.params, eos_token_id) if e.sample else ()) for e in batch.entries]


def slots_by_request(reply: cache_pb2.AllocateResponse, plan: list[tuple[Req, int]]) -> dict[str, tuple[int, ...]]:
    """Slots per request id from an Allocate receipt; raises RuntimeError when it delivered other counts
    than ``plan`` (request, tokens) asked: decisions are made on what was delivered."""
    slots = {r.request_id: tuple(r.slot_ids[:]) for r in reply.results}  # a slice of a repeated field is a list
    for req, n in plan:
        if len(slots.get(req.rid, ())) != n:
            raise RuntimeError(f"Allocate receipt gave {len(slots.get(req.rid, ()))} slots to {req.rid}, "
                               f"asked {n} (receipt {reply.receipt})")
    return slots
