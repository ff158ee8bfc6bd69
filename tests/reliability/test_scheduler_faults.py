"""R1 at the HTTP level: the scheduler killed (SIGKILL) or frozen (SIGSTOP) under steady load. The gateway's
readiness probes go non-200 within their timeouts, requests fail fast with 503 + Retry-After instead of hanging,
in-flight ones end with an explicit error, the cache releases the old session's locks and slots (lease expiry /
session replacement), and service returns after a restart / SIGCONT with outputs equal to HF greedy."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from tests.reliability.client import Load, Outcome, generate
from tests.reliability.conftest import prompts
from tests.reliability.system import wait_for

PROMPTS = prompts(4, 12, seed=1)
NEW = 24
HEALTH_TIMEOUT = 3.0
PROBE_TIMEOUT = 1.0
LONG_NEW = 2000  # tokens: seconds of decode on the embedded model, far longer than the steps to the kill
LEASE = 6.0  # > the seconds from the SIGKILL to the restarted scheduler's session (2.3 s seen on a loaded 2-core)


@pytest.fixture(scope="module")
def sys_(systems):
    return systems(kv_tokens=4096, max_running_requests=8, lease_seconds=LEASE, progress_timeout=3.0,
                   scheduler_args=("--lease-seconds", str(LEASE)),
                   gateway_args=("--health-timeout", str(HEALTH_TIMEOUT), "--probe-timeout", str(PROBE_TIMEOUT),
                                 "--probe-interval", "0.25"))


def check_outcomes(outcomes, oracle, fault_at: float, back_at: float, bound: float) -> dict:
    """Every call either completed with HF's output or got an explicit error; none took longer than ``bound`` s.
    Returns counts."""
    counts = {"ok": 0, "error": 0, "ok_after": 0}
    for started, out in outcomes:
        assert out.seconds < bound, f"a call took {out.seconds:.1f} s: {out}"
        if out.ok:
            assert out.ids == oracle(out.prompt, out.max_new)
            counts["ok"] += 1
            counts["ok_after"] += started > back_at
        else:
            assert out.status == 503 or out.status == 200 and out.error, out
            assert out.error, out
            if out.status == 503:
                assert out.retry_after is not None, out
            counts["error"] += 1
    return counts


def steady(load: Load, n: int = 4) -> None:
    wait_for(lambda: sum(o.ok for _, o in load.outcomes) >= n, 60, f"{n} calls served")


def test_scheduler_sigstop_fails_fast_releases_its_session_and_recovers_on_sigcont(sys_, settled, oracle):
    settled(sys_)
    assert sys_.status("/ready") == 200 and sys_.status("/health_generate") == 200
    with Load(sys_.url, PROMPTS, NEW, clients=3, timeout=30) as load:
        steady(load)
        t0 = time.monotonic()
        sys_.kill("scheduler", signal.SIGSTOP)
        wait_for(lambda: sys_.status("/ready", timeout=5) != 200, PROBE_TIMEOUT + 2, "/ready non-200")
        ready_down = time.monotonic() - t0
        r = sys_.http.get("/health_generate", timeout=HEALTH_TIMEOUT + 5)
        assert r.status_code == 503 and r.headers.get("retry-after")
        fresh = generate(sys_.url, PROMPTS[0], 4, stream=False, timeout=20)
        assert fresh.status == 503 and fresh.retry_after and fresh.seconds < 1.0, fresh
        time.sleep(max(0.0, t0 + LEASE + 1.5 - time.monotonic()))  # past the lease
        c = sys_.counters()  # this call makes the cache expire the frozen scheduler's session
        assert (c.owned, c.protected, c.available + c.evictable) == (0, 0, c.capacity), c
        assert sys_.integrity() == []
        t1 = time.monotonic()
        sys_.kill("scheduler", signal.SIGCONT)
        wait_for(lambda: sys_.status("/ready") == 200, 30, "/ready 200 after SIGCONT")
        recovered = time.monotonic() - t1
        wait_for(lambda: any(o.ok and s > t1 for s, o in load.outcomes), 30, "served again after SIGCONT")
    counts = check_outcomes(load.outcomes, oracle, t0, t1, bound=15)
    assert counts["error"] >= 1 and counts["ok_after"] >= 1, counts
    print(f"\nSIGSTOP scheduler: /ready non-200 after {ready_down:.2f} s, /ready 200 {recovered:.2f} s after "
          f"SIGCONT, {counts}")


def test_scheduler_sigkill_fails_fast_and_a_restart_replaces_its_session(sys_, settled, oracle):
    settled(sys_)
    long_out: list[Outcome] = []
    decoding = threading.Event()
    with Load(sys_.url, PROMPTS, NEW, clients=3, timeout=30) as load:
        steady(load)
        # A request that cannot finish before the kill, so the dead session surely holds slots. (Was: a kill
        # timed by polling the counters, which the short calls could all leave between waves: held == 0 in CI.)
        long = threading.Thread(target=lambda: long_out.append(
            generate(sys_.url, PROMPTS[1], LONG_NEW, timeout=30, streaming=decoding)), daemon=True)
        long.start()
        assert decoding.wait(30), "the long request never started decoding"
        t0 = time.monotonic()
        sys_.kill("scheduler")
        c = sys_.counters()
        held = c.owned + c.protected  # the dead scheduler's requests still hold slots (lease not over)
        wait_for(lambda: sys_.status("/ready", timeout=5) != 200, PROBE_TIMEOUT + 2, "/ready non-200")
        ready_down = time.monotonic() - t0
        assert sys_.http.get("/health_generate", timeout=HEALTH_TIMEOUT + 5).status_code == 503
        fresh = generate(sys_.url, PROMPTS[0], 4, stream=False, timeout=20)
        assert fresh.status == 503 and fresh.retry_after and fresh.seconds < 1.0, fresh
        long.join(30)
    assert held > 0
    assert long_out and long_out[0].error and len(long_out[0].ids) < LONG_NEW, long_out  # cut, with an error
    t1 = time.monotonic()
    restart_s = sys_.restart("scheduler")  # opens a session with the same owner: replaces the dead one
    c = sys_.counters()
    since_kill = time.monotonic() - t0
    assert since_kill < LEASE, "too slow to tell replacement from lease expiry"
    assert (c.owned, c.protected, c.available + c.evictable) == (0, 0, c.capacity), c
    connected = [json.loads(line) for line in (sys_.be.stack.log_dir / "scheduler.log").read_text().splitlines()
                 if line.startswith("{") and '"event": "connected"' in line]
    assert connected[-1]["replaced"] == connected[-2]["session"], connected[-2:]  # the dead one's, replaced
    wait_for(lambda: sys_.status("/ready") == 200, 30, "/ready 200 after restart")
    recovered = time.monotonic() - t1
    with Load(sys_.url, PROMPTS, NEW, clients=3, timeout=30) as after:
        steady(after)
    counts = check_outcomes(load.outcomes + after.outcomes, oracle, t0, t1, bound=15)
    assert counts["error"] >= 1 and counts["ok_after"] >= 1, counts
    print(f"\nSIGKILL scheduler: /ready non-200 after {ready_down:.2f} s, {held} slots held by the dead session "
          f"released by the restarted scheduler's session (restart {restart_s:.2f} s, {since_kill:.1f} s "
          f"< lease {LEASE} s), /ready 200 {recovered:.2f} s after the restart began; {counts}")
