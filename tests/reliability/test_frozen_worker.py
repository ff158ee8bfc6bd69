"""R1 at the worker (handed-1 case R1): the worker frozen with SIGSTOP mid-stream. The scheduler's health probe
of the worker (``--worker-stall-timeout``, scheduler_svc/liveness.py) notices the silence: the stream ends with
an explicit error naming the worker within the stall timeout plus the probe deadline (not the 120 s Forward
deadline), new requests get 503 at once, /ready is 503; after SIGCONT the scheduler waits for the stale Forward,
resyncs, and serves the same greedy output as before the stall. The pool is clean afterwards (``settled``).

Every wait is a poll or an event with a generous bound; no fixed sleep decides an outcome.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from tests.reliability.client import generate
from tests.reliability.conftest import prompts
from tests.reliability.system import wait_for

STALL_S = 3.0  # --worker-stall-timeout (default 10 s; small here to keep CI short)
PROBE_S = 2.0  # the scheduler's health-probe deadline: a stall is seen at most this much after STALL_S
SLACK_S = 6.0  # scheduling delays on a loaded 2-core CI box
PROMPT, LONG_PROMPT = prompts(2, 12, seed=7)
NEW = 16
STALLED = "has not answered health checks for"


@pytest.fixture(scope="module")
def sys_(systems):
    return systems(kv_tokens=4096, max_running_requests=4, scheduler_args=("--worker-stall-timeout", str(STALL_S)))


def test_a_frozen_worker_fails_streams_and_new_requests_fast_and_serves_the_same_output_after_sigcont(
        sys_, settled, oracle):
    settled(sys_)
    assert sys_.status("/ready") == 200
    before = generate(sys_.url, PROMPT, NEW, stream=False)
    assert before.ok and before.ids == oracle(PROMPT, NEW), before

    streaming = threading.Event()
    out: dict = {}
    stream = threading.Thread(target=lambda: out.update(long=generate(
        sys_.url, LONG_PROMPT, 3000, stream=True, timeout=120, streaming=streaming)))
    stream.start()
    assert streaming.wait(60), "the long stream never produced a token"
    t0 = time.monotonic()
    sys_.kill("worker", signal.SIGSTOP)
    try:
        stream.join(STALL_S + PROBE_S + SLACK_S + 30)  # bound for a hang; the deadline is asserted below
        assert not stream.is_alive(), "the stream did not end while the worker was frozen"
        long = out["long"]
        ended = long.ended_at - t0
        assert long.status == 200 and STALLED in long.error and "worker" in long.error, long
        assert 0 < len(long.ids) < 3000 and long.finish == ""
        assert ended < STALL_S + PROBE_S + SLACK_S, f"the stream ended {ended:.1f} s after SIGSTOP"

        fresh = generate(sys_.url, PROMPT, 4, stream=False, timeout=20)
        assert fresh.status == 503 and fresh.retry_after and STALLED in fresh.error, fresh
        assert fresh.seconds < STALL_S / 2, f"a new request took {fresh.seconds:.2f} s to be refused"
        wait_for(lambda: sys_.status("/ready") == 503, 10, "/ready 503 while the worker is frozen")
        ready = sys_.http.get("/ready", timeout=10).json()["error"]["message"]
        assert "NOT_SERVING" in ready and STALLED in ready, ready  # /ready says why
    finally:
        t1 = time.monotonic()
        sys_.kill("worker", signal.SIGCONT)
    wait_for(lambda: sys_.status("/ready") == 200, 30, "/ready 200 after SIGCONT")
    after = wait_for(lambda: (o := generate(sys_.url, PROMPT, NEW, stream=False, timeout=60)).ok and o, 60,
                     "a request served after SIGCONT", interval=0.2)
    recovered = time.monotonic() - t1
    assert after.ids == before.ids
    log = sys_.be.stack.log_tail("scheduler", 200000)
    assert '"event": "worker_stalled"' in log and '"event": "resynced"' in log
    print(f"\nSIGSTOP worker: stream ended {ended:.2f} s after it (stall timeout {STALL_S} s), new request refused "
          f"in {fresh.seconds * 1000:.0f} ms, served again {recovered:.2f} s after SIGCONT")
