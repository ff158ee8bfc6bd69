"""The cache service's retained history is bounded in tokens, not only in entries: found by the soak (cache RSS
51 -> 148 MiB in 5 min) — 10,000 prefix events each holding its full prefix, and 4,096 replayable operations each
holding its call's token ids, grow with prompt length (GiBs for 4k-token prompts). Units over the real classes."""

from __future__ import annotations

import random
import tracemalloc

from cache_svc.events import EventLog
from cache_svc.items import MatchItem
from cache_svc.sessions import OpLog


def test_event_log_retains_a_bounded_number_of_tokens():
    log = EventLog("p", retain=10_000, retain_tokens=100_000)
    for i in range(200):
        log.append("stored", "", list(range(3000 + i)), 10)
    kept = log.since(0)
    assert sum(len(e.token_ids) for e in kept) <= 100_000
    assert kept[-1].sequence == 200 and kept[0].sequence > 150  # the newest are kept, in order
    assert log.last_sequence == 200


def test_op_log_keeps_no_copy_of_the_call_and_bounds_the_results_it_keeps():
    ops = OpLog(capacity=4096, max_ints=50_000)
    rng = random.Random(0)
    calls = [("match", "s", "p", (MatchItem(request_id=f"r{i}", namespace="", lock=True, max_match_tokens=0,
                                            token_ids=tuple(rng.randrange(300, 50_000) for _ in range(3000))),))
             for i in range(100)]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i, fp in enumerate(calls):
        ops.record(f"op{i}", fp, ("result", tuple(range(100_000, 100_000 + 2000))), weight=2000)
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert ops.lookup("op99", calls[99]) == ("result", tuple(range(100_000, 102_000)))  # the newest replays
    assert ops.lookup("op0", calls[0]) is None  # the oldest went when the bound was passed
    assert grown < 3_000_000, grown  # results bounded (<= 50k ints); the 300k call token ids are not kept
