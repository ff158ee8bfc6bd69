"""A replica whose scheduler reports an outage in GetLoad (``outage_reason``: its worker or cache unreachable) is
out of routing while the other is routable; when every replica reports one (a shared cache down), all stay
routable, each queueing as one scheduler does."""

from __future__ import annotations

from gateway.replica_spec import ReplicaSpec
from gateway.replicas import LoadSnapshot, Replica, ReplicaSet
from gateway.scheduler_client import SchedulerClient

OUTAGE = "worker service at 127.0.0.1:9 refused its health check: UNAVAILABLE: connection refused"


def two() -> ReplicaSet:
    replicas = [Replica(i, ReplicaSpec(f"127.0.0.1:{1 + i}", f"cache:{1 + i}", f"pool-{i}"),
                        SchedulerClient(f"127.0.0.1:{1 + i}")) for i in range(2)]
    return ReplicaSet(replicas, probe_interval_s=0.5, probe_timeout_s=1, retry_after_s=1, load_interval_s=0)


def test_a_replica_reporting_an_outage_is_not_routed_while_another_is_routable() -> None:
    replicas = two()
    r0, r1 = replicas.replicas
    r1.load = LoadSnapshot(running=3, outage=OUTAGE)
    assert r0.state() is None
    assert r1.state() == f"the scheduler at 127.0.0.1:2 reports an outage: {OUTAGE}"
    assert replicas.routable() == [r0]
    r1.load = LoadSnapshot(running=3)  # the next poll after its worker is back
    assert replicas.routable() == [r0, r1]


def test_when_every_replica_reports_an_outage_all_stay_routable() -> None:
    replicas = two()
    for r in replicas.replicas:
        r.load = LoadSnapshot(outage="cache service at cache:1 unavailable: UNAVAILABLE for 0.4 s")
    assert replicas.routable() == replicas.replicas
