"""The replica set: the schedulers (each with its worker and its pool) that the gateway routes across.

A replica is (scheduler address, cache address, pool id), parsed from ``--replica
scheduler=HOST:PORT,cache=HOST:PORT,pool=ID``; today's single ``--scheduler HOST:PORT`` is one replica without a
cache address (nothing to probe: the router is not consulted). Each replica has its own SchedulerClient; its
state comes from two sources:

- the health probe (gateway.readiness.SchedulerWatch, one per replica): ``client.down`` while the scheduler does
  not answer, ``watch.last_status`` its ServingStatus;
- the calls themselves: an UNAVAILABLE from a Generate call excludes the replica at once (``exclude``), until
  its next health probe answers SERVING.

A replica is routable while it is reachable, not excluded, (when it has been probed) SERVING and its last GetLoad
names no outage (``outage_reason``: its worker or its cache unreachable; a SERVING scheduler would queue the request
until the restart). Its load, for routing, is the gateway's own calls there (counted exactly by the pending table) plus
the last GetLoad's count of the others' calls (``others``, polled every ``load_interval_s``): every call carries the
gateway's ``router_id``, so no poll can miss or double-count one of its own calls (a poll racing a call did, both
ways: a call routed just before a poll and seen after it, or just after a poll and seen by it).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

import structlog
from grpc_health.v1 import health_pb2

from gateway.errors import ApiError
from gateway.readiness import SchedulerWatch
from gateway.replica_spec import ReplicaSpec
from gateway.scheduler_client import SchedulerClient

log = structlog.get_logger()
SERVING = health_pb2.HealthCheckResponse.SERVING
UNPROBED_EXCLUSION_S = 2.0  # how long an exclusion lasts when no health probe runs (--probe-interval 0)


@dataclass(frozen=True)
class LoadSnapshot:
    """The last GetLoad answer's load of the calls this gateway did not send (``GetLoadResponse.others``: other
    routers', or sent straight to the scheduler): ``others_requests`` live calls, ``others_waiting_tokens`` prompt
    tokens they have queued. The gateway's own calls are counted by its pending table, exactly."""

    others_requests: int = 0
    others_waiting_tokens: int = 0
    outage: str = ""  # GetLoad.outage_reason: the scheduler's cache or worker unreachable ("" when none)


@dataclass
class Replica:
    """One replica: ``index`` in the set, ``name`` ("r0", "r1", ...) used in logs, metrics and answers."""

    index: int
    spec: ReplicaSpec
    client: SchedulerClient
    watch: SchedulerWatch | None = None
    load: LoadSnapshot = field(default_factory=LoadSnapshot)
    excluded: str | None = None  # why a call's UNAVAILABLE excluded it (None: not excluded)
    misconfigured: str | None = None  # its scheduler serves another pool than its --replica names (GetLoad)
    page_size: int = 1           # learned from the cache's probe answers (PoolProbe.page_size)

    @property
    def name(self) -> str:
        return f"r{self.index}"

    def state(self) -> str | None:
        """None while routable, else why not (unreachable, excluded after a failed call, NOT_SERVING, or its last
        GetLoad named an outage: its worker or cache unreachable, so what it takes waits for the restart)."""
        return self.condition()[1]

    def condition(self) -> tuple[str, str | None]:
        """(name, reason): ``ready`` with reason None while routable, else ``unreachable``, ``excluded``,
        ``misconfigured``, ``not_serving`` or ``outage`` (/ready's names) and why (``state``'s sentence)."""
        if self.client.down is not None:
            return "unreachable", self.client.down
        if self.excluded is not None:
            return "excluded", self.excluded
        if self.misconfigured is not None:
            return "misconfigured", self.misconfigured
        status = self.watch.last_status if self.watch is not None else None
        if status is not None and status != SERVING:
            name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            return "not_serving", f"the scheduler at {self.spec.scheduler} is {name}"
        if self.load.outage:
            return "outage", f"the scheduler at {self.spec.scheduler} reports an outage: {self.load.outage}"
        return "ready", None


class ReplicaSet:
    """The replicas, in the order given. ``probe_interval_s``/``probe_timeout_s``/``retry_after_s`` are the health
    probe's settings (gateway.readiness); ``load_interval_s`` the GetLoad poll period (0 = no poll)."""

    def __init__(self, replicas: list[Replica], probe_interval_s: float, probe_timeout_s: float,
                 retry_after_s: int, load_interval_s: float = 0.25) -> None:
        if not replicas:
            raise ValueError("a replica set needs at least one replica")
        self.replicas = replicas
        self.router_id = uuid.uuid4().hex  # GenerateRequest.router_id of the calls this gateway routes
        self.retry_after_s = retry_after_s
        self.load_interval_s = load_interval_s
        for r in replicas:
            r.watch = SchedulerWatch(r.client, probe_interval_s, probe_timeout_s, retry_after_s)
        self._probe_interval_s = probe_interval_s

    @staticmethod
    def build(specs: list[ReplicaSpec], retry_after_s: int, probe_interval_s: float, probe_timeout_s: float,
              load_interval_s: float = 0.25, unary_timeout_s: float = 5.0) -> "ReplicaSet":
        """One SchedulerClient per spec."""
        return ReplicaSet([Replica(i, s, SchedulerClient(s.scheduler, retry_after_s, unary_timeout_s))
                           for i, s in enumerate(specs)], probe_interval_s, probe_timeout_s, retry_after_s,
                          load_interval_s)

    @property
    def single(self) -> bool:
        """True for one replica: routing is not consulted and the gateway behaves as with one scheduler."""
        return len(self.replicas) == 1

    def routable(self) -> list[Replica]:
        """The replicas new requests may go to: routable ones; when none is, those that still answer (a
        NOT_SERVING scheduler queues or refuses work itself, as with one scheduler); may be empty."""
        ok = [r for r in self.replicas if r.state() is None]
        return ok or [r for r in self.replicas if r.client.down is None and r.excluded is None]

    def exclude(self, replica: Replica, reason: str) -> None:
        """Takes ``replica`` out of routing at once (a call failed UNAVAILABLE); its next health probe that answers
        SERVING brings it back (with the probe off, ``UNPROBED_EXCLUSION_S`` later). A no-op for a single replica (it
        has no alternative: behaves as before). Call it in the serving event loop."""
        if self.single:
            return
        if replica.excluded is None:
            log.error("replica_excluded", replica=replica.name, scheduler=replica.spec.scheduler, reason=reason)
            if self._probe_interval_s == 0:  # no health probe to readmit it: the exclusion lapses
                asyncio.get_running_loop().call_later(UNPROBED_EXCLUSION_S, self._readmit, replica)
        replica.excluded = reason

    @staticmethod
    def _readmit(replica: Replica) -> None:
        if replica.excluded is not None:
            log.warning("replica_readmitted", replica=replica.name, scheduler=replica.spec.scheduler)
            replica.excluded = None

    def all_down(self) -> ApiError:
        """The 503 when no replica can take a request, naming each replica and why."""
        why = "; ".join(f"{r.name} ({r.spec.scheduler}): {r.state()}" for r in self.replicas)
        return ApiError(503, f"no replica can take the request: {why}", "service_unavailable",
                        retry_after_s=self.retry_after_s)

    async def _probe_loop(self, replica: Replica) -> None:
        assert replica.watch is not None
        while True:
            started = time.monotonic()
            await replica.watch.probe_once()
            # a probe that found it gone keeps the last status it saw (SERVING): that is no answer
            if replica.client.down is None and replica.watch.last_status == SERVING:
                self._readmit(replica)
            await asyncio.sleep(max(0.0, self._probe_interval_s - (time.monotonic() - started)))

    async def _load_loop(self, replica: Replica) -> None:
        while True:
            asked_at = time.monotonic()
            if replica.client.down is None:
                try:
                    load = await replica.client.get_load(router_id=self.router_id)
                except ApiError as exc:  # the health probe decides reachability; the last snapshot stands
                    log.warning("replica_load_failed", replica=replica.name, error=exc.message)
                else:
                    if load.outage_reason and not replica.load.outage:  # out of routing: say so (no call failed)
                        log.error("replica_outage", replica=replica.name, scheduler=replica.spec.scheduler,
                                  reason=load.outage_reason)
                    elif replica.load.outage and not load.outage_reason:
                        log.warning("replica_outage_over", replica=replica.name, scheduler=replica.spec.scheduler)
                    replica.load = LoadSnapshot(load.others.live, load.others.waiting_tokens, load.outage_reason)
                    self._check_pool(replica, [p.pool_id for p in load.pools])
            await asyncio.sleep(max(0.0, self.load_interval_s - (time.monotonic() - asked_at)))

    @staticmethod
    def _check_pool(replica: Replica, served: list[str]) -> None:
        """Takes ``replica`` out of routing while its scheduler's GetLoad names pools (``served``) without the one
        its ``--replica`` gives: the cache would answer a probe of that pool NOT_FOUND, for the whole cache
        address, so every replica on that cache would be routed as 0 cached. Logged when it starts and ends."""
        wrong = bool(served) and replica.spec.pool not in served
        if wrong and replica.misconfigured is None:
            replica.misconfigured = (f"--replica names pool {replica.spec.pool!r} but the scheduler at "
                                     f"{replica.spec.scheduler} serves {', '.join(repr(p) for p in served)}")
            log.error("replica_misconfigured", replica=replica.name, reason=replica.misconfigured)
        elif not wrong and replica.misconfigured is not None:
            replica.misconfigured = None
            log.warning("replica_configured", replica=replica.name, pool=replica.spec.pool)

    def tasks(self) -> list[asyncio.Task]:
        """Starts the background loops (call in the serving event loop): for one replica, today's health watch
        only; for several, a health probe and a load poll per replica."""
        if self.single:
            watch = self.replicas[0].watch
            return [asyncio.create_task(watch.run())] if self._probe_interval_s > 0 and watch is not None else []
        out = []
        for r in self.replicas:
            if self._probe_interval_s > 0:
                out.append(asyncio.create_task(_logged(self._probe_loop(r), "replica_watch_failed", r)))
            if self.load_interval_s > 0:
                out.append(asyncio.create_task(_logged(self._load_loop(r), "replica_load_watch_failed", r)))
        return out

    async def close(self) -> None:
        """Closes every client's channel."""
        for r in self.replicas:
            await r.client.close()


async def _logged(loop, event: str, replica: Replica) -> None:
    """Runs a background loop; an unexpected error is logged (the gateway stops noticing that replica's state,
    so it must be seen) and re-raised."""
    try:
        await loop
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception(event, replica=replica.name, scheduler=replica.spec.scheduler)
        raise
