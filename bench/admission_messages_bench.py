"""What building one admission's messages costs the scheduler loop (not a test): the Match item, the first
ForwardItem (input ids, prefix slot and token ids) and the CacheItem of its prompt, for a keystroke-sized prompt,
with the request's ids copied repeated field to repeated field (``Req.prompt_field``, ``Req.extend_ids``, the
Match reply's slot ids kept as its field) against the same messages built from Python lists (``prompt_field``
None, the slot ids read into a list as the scheduler did before, ``common.proto_ints.as_list``): the baseline,
measured in the same run.

    python -m bench.admission_messages_bench [--prompt 1750] [--cached 1700] [--json PATH]

Prints microseconds per admission (median of 7 repeats of 400) for each way and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from codeserve.v1 import cache_pb2, common_pb2, scheduler_pb2
from common.proto_ints import as_list
from scheduler_svc.batch import Entry, forward_item
from scheduler_svc.admission_match import match_item
from scheduler_svc.request import Params, Req
from scheduler_svc.requests import written_item


def admission(req: Req, reply: cache_pb2.MatchResult, cached: int, total: int) -> None:
    """The messages of one admission, built by the scheduler's own ``match_item``, ``forward_item`` and
    ``written_item``."""
    match_item(req, total, lock=True, max_match_tokens=total - 1, compute_tokens=total)
    req.prefix_slot_ids = reply.slot_ids if req.prompt_field is not None else as_list(reply.slot_ids)  # as before
    forward_item(Entry(req, start=cached, n=total - cached, slot_ids=tuple(range(cached, total)), sample=True), (0,))
    req.kv_len = total
    written_item(req, finished=False)


def per_admission_us(with_field: bool, prompt: int, cached: int, repeat: int = 7, number: int = 400) -> float:
    ids = [(7 * i) % 49_000 for i in range(prompt)]
    params = Params(max_new_tokens=16, asked_max_new_tokens=16, sampling=common_pb2.SamplingParams())
    field = scheduler_pb2.TokenIds(ids=ids).ids if with_field else None
    reply = cache_pb2.MatchResult(request_id="r", cached_tokens=cached, slot_ids=range(10_000, 10_000 + cached))
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            admission(Req(rid="r", prompt_ids=ids, params=params, prompt_field=field), reply, cached, prompt)
        runs.append((time.perf_counter() - t) / number * 1e6)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=1750)
    ap.add_argument("--cached", type=int, default=1700)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    lists = per_admission_us(False, a.prompt, a.cached)
    fields = per_admission_us(True, a.prompt, a.cached)
    out = {"prompt_tokens": a.prompt, "cached_tokens": a.cached, "from_lists_us": round(lists, 1),
           "field_to_field_us": round(fields, 1), "ratio": round(fields / lists, 3)}
    print(f"one admission's messages, {a.prompt}-token prompt, {a.cached} cached: from lists {lists:.1f} us "
          f"(baseline), field to field {fields:.1f} us, ratio {fields / lists:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
