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
    r1.load = LoadSnapshot(others_requests=3, outage=OUTAGE)
    assert r0.state() is None
    assert r1.state() == f"the scheduler at 127.0.0.1:2 reports an outage: {OUTAGE}"
    assert replicas.routable() == [r0]
    r1.load = LoadSnapshot(others_requests=3)  # the next poll after its worker is back
    assert replicas.routable() == [r0, r1]


def test_when_every_replica_reports_an_outage_all_stay_routable() -> None:
    replicas = two()
    for r in replicas.replicas:
        r.load = LoadSnapshot(outage="cache service at cache:1 unavailable: UNAVAILABLE for 0.4 s")
    assert replicas.routable() == replicas.replicas


def test_an_excluded_replica_whose_probe_finds_it_gone_stays_excluded(tokenizer) -> None:
    """The exclusion lasts until a probe answers SERVING (docs/operations.md); a probe that finds the scheduler
    gone is no such answer, even though the last status it had seen was SERVING (it was readmitted at once, logging
    ``replica_readmitted`` for a replica that does not answer)."""
    import asyncio

    from tests.gateway.conftest import N_POSITIONS
    from tests.gateway.fake_scheduler import FakeScheduler, serve

    running = serve(FakeScheduler(tokenizer, N_POSITIONS))

    async def scenario() -> tuple[str | None, str | None]:
        replicas = ReplicaSet.build([ReplicaSpec(f"127.0.0.1:{running.port}", "cache:1", "pool-0"),
                                     ReplicaSpec("127.0.0.1:2", "cache:1", "pool-1")],
                                    retry_after_s=1, probe_interval_s=0.1, probe_timeout_s=0.3, load_interval_s=0)
        r0 = replicas.replicas[0]
        await r0.watch.probe_once()
        assert r0.state() is None  # SERVING, routable
        replicas.exclude(r0, "a call to r0 failed UNAVAILABLE")
        running.server.stop(0)  # the scheduler dies
        tasks = replicas.tasks()
        await asyncio.sleep(1.0)  # several probes, each finding it gone
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await replicas.close()
        return r0.client.down, r0.excluded

    down, excluded = asyncio.run(scenario())
    assert down is not None and "did not answer a health check" in down
    assert excluded == "a call to r0 failed UNAVAILABLE"


def test_an_outage_taking_a_replica_out_of_routing_is_logged_and_so_is_its_end(tokenizer) -> None:
    """A worker outage (GetLoad.outage_reason) takes the replica out of routing silently otherwise: its scheduler
    still answers (``scheduler_up`` stays 1) and no call failed (no ``replica_excluded``), so the gateway logs
    ``replica_outage`` when a poll first names it and ``replica_outage_over`` when one no longer does."""
    import asyncio

    from structlog.testing import capture_logs

    from tests.gateway.conftest import N_POSITIONS
    from tests.gateway.fake_scheduler import FakeScheduler, serve

    fake = FakeScheduler(tokenizer, N_POSITIONS)
    running = serve(fake)

    async def scenario() -> list[dict]:
        replicas = ReplicaSet.build([ReplicaSpec(f"127.0.0.1:{running.port}", "cache:1", "pool-0"),
                                     ReplicaSpec("127.0.0.1:2", "cache:1", "pool-1")],
                                    retry_after_s=1, probe_interval_s=0, probe_timeout_s=0.3, load_interval_s=0.05)
        with capture_logs() as logs:
            tasks = replicas.tasks()
            await asyncio.sleep(0.3)
            fake.load.outage_reason = OUTAGE
            await asyncio.sleep(0.3)
            fake.load.outage_reason = ""
            await asyncio.sleep(0.3)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await replicas.close()
        return [e for e in logs if e["event"].startswith("replica_outage")]

    try:
        events = asyncio.run(scenario())
    finally:
        running.server.stop(0)
    assert [(e["event"], e["replica"]) for e in events] == [("replica_outage", "r0"), ("replica_outage_over", "r0")]
    assert events[0]["reason"] == OUTAGE


def test_a_replica_whose_scheduler_serves_another_pool_is_out_of_routing_and_says_why(tokenizer) -> None:
    """``--replica ...,pool=poolX`` where the scheduler serves pool-1: the cache answers a probe naming poolX
    NOT_FOUND for the whole cache address, so every replica on that cache was routed as 0 cached while /ready said
    ready. Now the first GetLoad naming its pools takes the replica out of routing (/ready state
    ``misconfigured``, logged), the correctly named one stays routable, and a poll naming its pool lifts it."""
    import asyncio

    from structlog.testing import capture_logs

    from tests.gateway.conftest import N_POSITIONS
    from tests.gateway.fake_scheduler import FakeScheduler, serve

    fake = FakeScheduler(tokenizer, N_POSITIONS)
    fake.load.pools[0].pool_id = "pool-1"
    running = serve(fake)

    async def scenario():
        replicas = ReplicaSet.build([ReplicaSpec("127.0.0.1:2", "cache:1", "pool-0"),
                                     ReplicaSpec(f"127.0.0.1:{running.port}", "cache:1", "poolX")],
                                    retry_after_s=1, probe_interval_s=0, probe_timeout_s=0.3, load_interval_s=0.05)
        r0, r1 = replicas.replicas
        seen = []
        with capture_logs() as logs:
            tasks = replicas.tasks()
            await asyncio.sleep(0.3)
            seen.append((r1.condition(), replicas.routable()))
            fake.load.pools[0].pool_id = "poolX"  # the operator fixed the scheduler's --pool-id
            await asyncio.sleep(0.3)
            seen.append((r1.condition(), replicas.routable()))
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await replicas.close()
        return r0, r1, seen, [e["event"] for e in logs if e["event"].startswith(("replica_misconfigured", "replica_configured"))]

    try:
        r0, r1, seen, events = asyncio.run(scenario())
    finally:
        running.server.stop(0)
    (wrong, routable_then), (fixed, routable_after) = seen
    assert wrong == ("misconfigured", f"--replica names pool 'poolX' but the scheduler at 127.0.0.1:{running.port} "
                                      f"serves 'pool-1'")
    assert routable_then == [r0]
    assert fixed == ("ready", None) and routable_after == [r0, r1]
    assert events == ["replica_misconfigured", "replica_configured"]
