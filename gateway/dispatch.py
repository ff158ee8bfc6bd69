"""Starting a Generate call on a replica: the routing decision, its pending entry, its log lines, the retry.

With one replica the call goes to it as it always did (no probe, no pending entry, no retry: there is no other
replica). With several, for each call (each prompt of a list and each of the ``n`` copies is a call of its own,
routed in order; the copies of one prompt follow the first through its pending entry, as they share its prefix,
unless the cost says the holder is too loaded):

1. The call is tagged with the gateway's router id (its scheduler's GetLoad then counts it out of the others'
   load). ``Router.decide`` ranks the routable replicas; the best one gets the call and a pending entry (its prompt,
   its predicted uncached tokens), logged as ``route_decision`` with every candidate's cost terms.
2. At the call's first message the entry stops being pending (its prefill is written: the cache's probe sees it
   now; it counts as one of the gateway's calls on that replica until it ends) and ``route_realized`` logs the predicted and realized cached tokens (the message's cached_tokens).
3. A call refused before its first message with RESOURCE_EXHAUSTED (429) or UNAVAILABLE is retried once, same
   request, on the next replica of the ranking that is still routable; never after a message was read. An
   UNAVAILABLE (before or after the first message) also excludes the replica at once (ReplicaSet.exclude).
"""

from __future__ import annotations

import itertools

import grpc
import structlog

from codeserve.v1 import scheduler_pb2
from gateway.errors import ApiError
from gateway.generation import GenerationStream
from gateway.pending import PendingTable
from gateway.replicas import ReplicaSet
from gateway.router import Decision, Router
from gateway.routing_metrics import RoutingMetrics
from gateway.scheduler_client import SchedulerClient

log = structlog.get_logger()
RETRIED_CODES = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)
_CALLS = itertools.count()  # numbers the routed calls of this process (their pending-table keys)


class Dispatcher:
    """Routes and starts Generate calls (``start``). Handed the replica set, the router (None for one replica), the
    pending table the router reads and the routing metrics."""

    def __init__(self, replicas: ReplicaSet, router: Router | None, pending: PendingTable | None,
                 metrics: RoutingMetrics | None) -> None:
        if not replicas.single and (router is None or pending is None or metrics is None):
            raise ValueError("several replicas need a router, a pending table and routing metrics")
        self.replicas, self.router, self.pending, self.metrics = replicas, router, pending, metrics

    async def start(self, request: scheduler_pb2.GenerateRequest, retry_after_s: int,
                    timeout_s: float | None) -> GenerationStream:
        """The started call. Raises ApiError 503 when no replica can take it (or, with one replica, what its client
        raises when its scheduler is known down)."""
        if self.replicas.single:
            return GenerationStream(self.replicas.replicas[0].client, request, retry_after_s, timeout_s)
        assert self.router is not None and self.pending is not None and self.metrics is not None
        ids = list(request.input_ids.ids)
        request.router_id = self.replicas.router_id  # its scheduler's GetLoad counts it out of the others' load
        decision = await self.router.decide(request.namespace, ids, uses_cache=not request.return_prompt_logprobs)
        best = decision.best
        log.info("route_decision", rid=request.request_id, policy=decision.policy.value, replica=best.name,
                 predicted_cached=best.predicted_cached, prompt_tokens=decision.prompt_tokens,
                 candidates=[c.terms() for c in decision.ranking],
                 **({"probe_failed": {a: f"{e}; its replicas routed as 0 cached"
                                      for a, e in decision.probe_errors.items()}} if decision.probe_errors else {}))
        hooks = RouteHooks(self, request, decision)
        client = hooks.place(0)
        try:
            return GenerationStream(client, request, retry_after_s, timeout_s, hooks)
        except BaseException:  # not started (its scheduler is known down): the placed call is not in flight
            hooks.ended()
            raise


class RouteHooks:
    """The StreamHooks of one routed call (gateway.stream_hooks): its pending entry, realized log and retry."""

    def __init__(self, dispatcher: Dispatcher, request: scheduler_pb2.GenerateRequest, decision: Decision) -> None:
        self._d = dispatcher
        self._request = request
        self._decision = decision
        # its key in the pending table: a client may give two calls the same request id (they then run on two
        # replicas, or the second is refused 409 on the same one), and each must count as a call of its own
        self._key = f"{request.request_id}#{next(_CALLS)}"
        self._at = 0           # index in decision.ranking of the replica the call is on
        self._retried = False
        self._done = False

    def place(self, at: int) -> SchedulerClient:
        """Puts the call on ``decision.ranking[at]``: its pending entry and routed count; returns its client."""
        self._at = at
        c = self._decision.ranking[at]
        self._d.pending.add(self._key, c.replica, self._request.namespace,
                            self._request.input_ids.ids, c.uncached)
        self._d.metrics.count_routed(c.name, self._decision.policy.value)
        return self._d.replicas.replicas[c.replica].client

    def first_message(self, msg: scheduler_pb2.GenerateResponse) -> None:
        c = self._decision.ranking[self._at]
        self._d.pending.started(self._key)
        log.info("route_realized", rid=self._request.request_id, replica=c.name, policy=self._decision.policy.value,
                 predicted_cached=c.predicted_cached, realized_cached=msg.cached_tokens,
                 exact=c.predicted_cached == msg.cached_tokens)
        self._d.metrics.count_prediction(c.predicted_cached, msg.cached_tokens)

    def failed(self, code: grpc.StatusCode, error: ApiError, before_first: bool) -> SchedulerClient | None:
        c = self._decision.ranking[self._at]
        replica = self._d.replicas.replicas[c.replica]
        self._d.pending.end(self._key)
        if code == grpc.StatusCode.UNAVAILABLE:
            self._d.replicas.exclude(replica, f"a call to {c.name} failed UNAVAILABLE: {error.message}")
        self._done = True  # ended here; a retry (below) places it anew, to be ended by ``ended``
        if not before_first or self._retried or code not in RETRIED_CODES:
            return None
        routable = {r.index for r in self._d.replicas.routable()}
        following = [i for i in range(self._at + 1, len(self._decision.ranking))
                     if self._decision.ranking[i].replica in routable]
        if not following:
            return None
        self._done = False
        self._retried = True
        self._d.metrics.count_retry(c.name, code.name)
        nxt = self._decision.ranking[following[0]]
        log.warning("route_retry", rid=self._request.request_id, refused_by=c.name, code=code.name,
                    error=error.message, replica=nxt.name, predicted_cached=nxt.predicted_cached)
        return self.place(following[0])

    def ended(self) -> None:
        if not self._done:
            self._done = True
            self._d.pending.end(self._key)
