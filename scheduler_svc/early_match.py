"""Early Match: an arrival's admission Match sent by the Generate handler that received it, before the loop takes it.

The loop admits a waiting request on the receipt of a locking Match (``Planner._admit``). Sent by the loop, that
Match costs the loop a cache round trip (~1.5-2 ms on the H200 hosts, most of it two grpcio crossings) during which
it takes no arrival and applies no Forward reply; and it starts only once the loop has taken the request. On the
editor's path (H200 run 15, p50) the request waited 1.3 ms for the loop (``generate -> taken``) and then 1.8 ms for
its Match. An early Match is sent as a ``.future()`` when the request is accepted (``submit``: built before the
intake's lock, claimed under it by ``Intake.submit``'s ``on_accept``, sent after it: ~20 us under the lock instead of
~220-550), so it runs while the request waits for the loop and while the loop does other work; the loop takes its
receipt when it reaches the request (``reply``; it waits for the send and the reply if they are not done yet). The
cache client's channel holds a call open (``PollerKeeper``) so a ``.future()`` starts no thread of its own.

An early receipt may only say yes. Its counters are older than the loop's round: they may predate releases
deferred since (an abort just before the next keystroke) and already count the first chunks of other early
Matches that the round's ledger charges again. So admission admits on it when the request fits; when it does not,
the request is unlocked and judged on a Match of the loop's own, as without early Matches (``Planner._admit``).

It is sent only when the receipt will be used soon: the fcfs policy (lpm orders the queue on prefix lengths
first), fewer than ``MAX_WAITING`` requests waiting (under load the loop's group Match serves better), no prompt
logprobs wanted, the pool registered in the current session (``CacheClient.pool_session``: a resync's
RegisterPool may flush the pool), and the request id not being ended at the cache (``CacheClient.ending``: a
deferred release of an earlier request with the same id would make the cache refuse the registration). Its first
chunk (up to ``cfg.chunk_size``) is allocated from free pages in the same call (``MatchItem.allocate_up_to``); a
round whose chunk budget is smaller lets it go and matches again. The Match carries none of the cache operations
deferred by the loop: a keystroke's request may miss the few tokens the previous keystroke's aborted extend wrote
(H200 run 16: the server's prefix hit rate was the same with and without early Matches, 0.96).

Where an early registration is let go: a deferred admission (``RequestTable.unlock``), an abort while waiting
(``settle``, then a release), a head of the queue that does not fit while early-matched requests behind
it hold locks (``Planner._admit``, as for a group), an Allocate the pool cannot fund (``Planner._let_go_early``,
before anything running is retracted or failed), and a new session (the cache released the old one's requests: a
receipt from another session is dropped; a worker stall that fails waiting requests holding one resyncs,
``Recovery.on_worker_stalled``). A failed early Match raises from ``reply`` / ``settle`` as the loop's own cache
calls do (the loop resyncs).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from common import hop_trace
from scheduler_svc.admission_match import locked_from, match_item, match_key
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.errors import DependencyUnavailable
from scheduler_svc.request import Req

MAX_WAITING = 4  # waiting requests (taken or not) above which an arrival is matched by the loop


@dataclass
class Pending:
    """An early Match claimed for a request: its MatchRequest (and the session in it), then its grpc future once
    sent (``sent`` is set then, or with ``error`` when the send raised)."""

    request: object
    future: object = None
    error: BaseException | None = None
    sent: threading.Event = field(default_factory=threading.Event)

    @property
    def session_id(self) -> str:
        return self.request.session_id


class EarlyMatch:
    """Sends (``submit``, any thread) and collects (``reply``, ``settle``, the loop thread) early Matches through
    ``cache`` (a CacheClient). ``settings()`` is the loop's SchedulerConfig now (``early_match``, ``policy``;
    ``chunk_size``: the first chunk the Match allocates); ``waiting()`` the number of waiting requests."""

    def __init__(self, cache, settings: Callable[[], SchedulerConfig], waiting: Callable[[], int]) -> None:
        self.cache, self._settings, self._waiting = cache, settings, waiting

    def prepare(self, req: Req):
        """``req``'s early MatchRequest when the settings allow one (module docstring), else None. Any thread, before
        ``req`` is submitted (building it, ~60 us, stays out of the intake's lock)."""
        cfg = self._settings()
        key = match_key(req)
        if not cfg.early_match or cfg.policy != "fcfs" or key == 0:
            return None
        request = self.cache.early_request()
        if request is not None:
            match_item(req, key, into=request.items.add(), lock=True, max_match_tokens=key - 1,
                       allocate_up_to=cfg.chunk_size, compute_tokens=len(req.prompt_ids) + len(req.output_ids))
        return request

    def submit(self, req: Req, submit: Callable[..., None]) -> None:
        """``submit(on_accept)`` (``Intake.submit`` of ``req``) with ``req``'s early Match built before it
        (``prepare``), claimed under the intake's lock (``claim``) and sent after it (``send``). Raises what
        ``submit`` raises (nothing is sent then); a failed send is the loop's to raise (``send``)."""
        request = self.prepare(req)
        if request is None:
            submit(None)
            return
        claimed: list[Pending | None] = []
        submit(lambda r, inbox: claimed.append(self.claim(r, request, inbox)))
        self.send(req, claimed[0] if claimed else None)

    def claim(self, req: Req, request, inbox: int) -> Pending | None:
        """Sets ``req.early`` to ``request`` (from ``prepare``) and returns it when it may go now: fewer than
        ``MAX_WAITING`` waiting with ``inbox`` accepted and not yet taken, the id not ending at the cache, the
        session still the one whose pool registration was answered; else None. Called under the intake's lock,
        once ``req`` is accepted and before it is queued: the loop never sees it without its ``early``."""
        if (inbox + self._waiting() < MAX_WAITING and not self.cache.ending(req.rid)
                and request.session_id == self.cache.pool_session):
            req.early = Pending(request)
            return req.early
        return None

    def send(self, req: Req, pending: Pending | None) -> None:
        """Sends ``pending`` (what ``claim`` returned: the loop may have taken ``req.early`` already; None: nothing
        was claimed) and marks it sent. The request is queued by then: an error of the send (grpcio raises
        ValueError on a closed channel) is kept for the loop, whose ``reply`` raises it as the cache call's failure."""
        if pending is None:
            return
        try:
            hop_trace.mark(req.rid, "match_sent")
            pending.future = self.cache.match_early(pending.request)
        except BaseException as exc:  # kept, not dropped: ``reply`` raises DependencyUnavailable with it
            pending.error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            pending.sent.set()  # whatever happened: the loop never waits for a send that will not come

    def reply(self, req: Req):
        """Takes ``req.early`` (loop thread): its MatchResponse, or None when it has none or it was sent in another
        session (that session's registrations are gone with it). Waits for the reply when it is not in. Raises the
        cache client's errors."""
        pending, req.early = req.early, None
        if pending is None:
            return None
        pending.sent.wait()  # the Generate handler sends it right after queueing the request
        if pending.session_id != self.cache.pool_session:
            return None
        if pending.error is not None or pending.future is None:  # the loop resyncs, as for any failed cache call
            raise DependencyUnavailable("cache", self.cache.target,
                                        f"the early Match of {req.rid} was not sent: {pending.error!r}") from pending.error
        reply = self.cache.match_result(pending.request, pending.future)
        hop_trace.mark(req.rid, "match_back")
        return reply

    def settle(self, reqs: list[Req]) -> list[Req]:
        """Those of ``reqs`` (waiting, loop thread) registered at the cache by their early Match, each waited for
        and taken (``req.early`` cleared): the caller releases them. Raises the cache client's errors."""
        return [r for r in reqs if r.early is not None and self.reply(r) is not None]

    def locked(self, req: Req, budget: int, unlock: Callable[[list[Req]], object]):
        """``Planner._lock_prefixes``' answer for ``req`` from its early Match: ({rid: (cached, slots)}, counters,
        {rid: allocated slots}); None when it has none, it was sent in another session, or it allocated more than
        this round's chunk ``budget`` (then it is let go through ``unlock``: the loop matches it again). Raises
        the cache client's errors, and RuntimeError for a receipt that contradicts its item."""
        reply = self.reply(req)
        if reply is None:
            return None
        locked, counters, allocated = locked_from([req], [match_key(req)], reply)
        if len(allocated.get(req.rid, ())) > budget:
            unlock([req])
            return None
        return locked, counters, allocated

    def let_go(self, waiting: list[Req], unlock: Callable[[list[Req]], object], log) -> bool:
        """Relief before an allocation failure retracts or fails anything: the early registrations of ``waiting``
        (their locks and first chunks) are released through ``unlock`` (they are matched again by the loop later).
        True when some were."""
        held = self.settle(waiting)
        if held:
            unlock(held)
            log.info("early_matches_let_go", requests=len(held))
        return bool(held)
