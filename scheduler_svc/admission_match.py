"""The admission Match's items and what its receipt says (``Planner._lock_prefixes``, ``early_match.py``)."""

from __future__ import annotations

from codeserve.v1 import cache_pb2
from common.proto_ints import as_tuple
from scheduler_svc.request import Req


def match_item(req: Req, key_len: int, into: cache_pb2.MatchItem | None = None, **fields) -> cache_pb2.MatchItem:
    """``req``'s MatchItem keyed by its first ``key_len`` ids (copied through ``Req.extend_ids``), with ``fields``;
    filled ``into`` an item already in a request (``request.items.add()``: no copy of the ids) when given."""
    item = into if into is not None else cache_pb2.MatchItem()
    item.request_id, item.namespace = req.rid, req.params.namespace
    for name, value in fields.items():
        setattr(item, name, value)
    req.extend_ids(item.token_ids, 0, key_len)
    return item


def match_key(req: Req) -> int:
    """How many of ``req``'s ids its admission Match is keyed by: all of them (prompt and output so far), or 0 (it
    matches nothing) when it collects prompt logprobs or has fewer than 2."""
    n = len(req.prompt_ids) + len(req.output_ids)
    return 0 if req.wants_prompt_logprobs or n < 2 else n


def locked_from(reqs: list[Req], keys: list[int], reply: cache_pb2.MatchResponse):
    """({rid: (cached tokens, their slots)}, counters after the locks, {rid: slots allocated}) of a locking Match
    ``reply`` for ``reqs`` keyed by ``keys`` ids (the cached slots are the reply's repeated field: the ForwardItem
    copies it in C). Raises RuntimeError for a receipt without counters or a result that contradicts its item."""
    if not reply.receipt.HasField("after"):
        raise RuntimeError(f"Match receipt without counters for {[r.rid for r in reqs]}: no budget is not a "
                           f"budget of 0")
    results = {r.request_id: r for r in reply.results}
    locked = {}
    for r, key in zip(reqs, keys):
        res = results.get(r.rid)
        if res is None or len(res.slot_ids) != res.cached_tokens or res.cached_tokens >= max(key, 1):
            raise RuntimeError(f"Match receipt for {r.rid}: {res and res.cached_tokens} cached tokens, "
                               f"{res and len(res.slot_ids)} slots, key of {key} tokens")
        locked[r.rid] = (res.cached_tokens, res.slot_ids)
    allocated = {r.request_id: as_tuple(r.allocated_slot_ids) for r in reply.results if r.allocated_slot_ids}
    return locked, reply.receipt.after, allocated
