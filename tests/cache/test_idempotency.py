"""Every mutating CacheCore operation is idempotent by op_id (CacheCore._recorded): a retry returns the first
outcome marked replayed and changes nothing; the op_id with other arguments is InvalidArgument; an operation
that raised stored nothing, so its op_id works once the cause is fixed."""

from __future__ import annotations

import dataclasses

import pytest

from cache_svc.core import CacheCore
from cache_svc.errors import InvalidArgument, NotFound
from cache_svc.items import CacheItem, MatchItem, Member

P = "p"
MEMBERS = (Member("w0", "e1", 32),)


def ready() -> tuple[CacheCore, str]:
    """A core with pool P and a session holding request "a" (4 prompt tokens locked, 4 slots allocated)."""
    core = CacheCore()
    core.register_pool("reg", P, 1, MEMBERS)
    sid = core.open_session("owner").session_id
    core.match("m0", sid, P, [MatchItem("a", "", (1, 2, 3, 4), True)])
    core.allocate("a0", sid, P, [("a", 4)])
    return core, sid


# op name -> (call with op_id, same op_id with other arguments)
OPS = {
    "register": (lambda c, s, op: c.register_pool(op, P, 1, (Member("w0", "e2", 32),)),
                 lambda c, s, op: c.register_pool(op, P, 1, (Member("w0", "e3", 32),))),
    "match": (lambda c, s, op: c.match(op, s, P, [MatchItem("b", "", (1, 2), True)]),
              lambda c, s, op: c.match(op, s, P, [MatchItem("b", "", (1, 2, 3), True)])),
    "allocate": (lambda c, s, op: c.allocate(op, s, P, [("a", 2)]),
                 lambda c, s, op: c.allocate(op, s, P, [("a", 3)])),
    "cache": (lambda c, s, op: c.cache_requests(op, s, P, [CacheItem("a", (1, 2, 3, 4), True)]),
              lambda c, s, op: c.cache_requests(op, s, P, [CacheItem("a", (1, 2, 3), True)])),
    "release": (lambda c, s, op: c.release_requests(op, s, P, ["a"]),
                lambda c, s, op: c.release_requests(op, s, P, ["a", "a"])),
    "evict": (lambda c, s, op: c.evict(op, P, 2), lambda c, s, op: c.evict(op, P, 3)),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_a_retry_replays_the_first_outcome_and_changes_nothing(name: str) -> None:
    core, sid = ready()
    call, other = OPS[name]
    first = call(core, sid, "op-1")
    counters = core.pool_status(P)[0].counters
    again = call(core, sid, "op-1")
    assert not first.receipt.replayed and again.receipt.replayed
    assert again == dataclasses.replace(first, receipt=dataclasses.replace(first.receipt, replayed=True))
    assert core.pool_status(P)[0].counters == counters
    with pytest.raises(InvalidArgument, match="op_id 'op-1' was already used for a different call"):
        other(core, sid, "op-1")
    assert core.check_integrity(P) == []


@pytest.mark.parametrize("name", ["match", "allocate", "evict"])
def test_an_operation_that_raised_stored_nothing(name: str) -> None:
    core = CacheCore()
    sid = core.open_session("owner").session_id
    call, _ = OPS[name]
    with pytest.raises(NotFound, match="unknown pool"):
        call(core, sid, "op-1")
    core.register_pool("reg", P, 1, MEMBERS)
    if name == "allocate":
        core.match("m0", sid, P, [MatchItem("a", "", (1, 2, 3, 4), True)])
    outcome = call(core, sid, "op-1")
    assert not outcome.receipt.replayed and outcome.receipt.operation == ("evict" if name == "evict" else name)
