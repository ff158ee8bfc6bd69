"""SIGTERM to each service under load drains: readiness turns non-200 at once, work in flight finishes within
the grace period (or, for a dependency, once it is back), what remains gets an explicit error, and the process
exits 0. Each service is then restarted and the system serves again."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import pytest

from tests.reliability.client import Load, generate
from tests.reliability.conftest import prompts
from tests.reliability.system import wait_for

PROMPTS = prompts(4, 16, seed=3)
DRAIN = 3.0  # the scheduler's --drain-seconds; the gateway's is its default, 5 s (streams abandoned after 4 s)
SHORT, LONG = 120, 3000  # new tokens: SHORT takes ~0.5 s here (still in flight when the signal follows its first
# token, done well within either drain), LONG ~12 s or more (outlives both)


@pytest.fixture(scope="module")
def sys_(systems):
    return systems(kv_tokens=8192, max_running_requests=8, progress_timeout=5.0,
                   scheduler_args=("--drain-seconds", str(DRAIN), "--outage-timeout", "20"),
                   gateway_args=("--probe-interval", "0.25", "--probe-timeout", "1"))


def terminate(sys_, name: str) -> tuple[int, float]:
    """SIGTERM; returns (exit code, seconds to exit)."""
    t0 = time.monotonic()
    sys_.kill(name, signal.SIGTERM)
    return sys_.exit_code(name), time.monotonic() - t0


def in_background(fn, *args, **kw) -> tuple[threading.Thread, list]:
    box: list = []
    thread = threading.Thread(target=lambda: box.append(fn(*args, **kw)), daemon=True)
    thread.start()
    return thread, box


def streaming(sys_, prompt: list[int], max_new: int) -> tuple[threading.Thread, list]:
    """Starts a streamed /generate call and returns once its first output tokens arrived (admitted and
    decoding); AssertionError naming the call's outcome when it ended first or nothing came within 60 s."""
    started = threading.Event()
    thread, box = in_background(generate, sys_.url, prompt, max_new, stream=True, timeout=30, streaming=started)
    deadline = time.monotonic() + 60
    while not started.wait(0.05) and thread.is_alive() and time.monotonic() < deadline:
        pass
    assert started.is_set(), (f"not streaming after 60 s ({max_new} new tokens)", box)
    return thread, box


def long_then_short(sys_) -> tuple[tuple[threading.Thread, list], tuple[threading.Thread, list]]:
    """Both requests in flight: the long one first, then the short one, each waited on until it streams.
    Sampling GetLoad().running == 2 instead (both sent together, the short one of 40 tokens) raced: the short
    one lived ~0.2 s, and on a loaded machine the long one was admitted only after it had finished, so
    running == 2 never happened ("not both running after 10 s")."""
    long_call = streaming(sys_, PROMPTS[1], LONG)
    short_call = streaming(sys_, PROMPTS[0], SHORT)
    return short_call, long_call


@pytest.mark.parametrize("name", ["cache", "worker"])
def test_sigterm_to_a_dependency_exits_0_and_requests_complete_after_it_returns(sys_, settled, oracle, name):
    settled(sys_)
    with Load(sys_.url, PROMPTS, 24, clients=3, timeout=60) as load:
        wait_for(lambda: sum(o.ok for _, o in load.outcomes) >= 3, 60, "steady load")
        t0 = time.monotonic()
        code, seconds = terminate(sys_, name)
        assert code == 0, sys_.be.stack.log_tail(name)
        sys_.restart(name)
        t1 = time.monotonic()
        wait_for(lambda: any(o.ok and s > t1 for s, o in load.outcomes), 30, "served again")
    for _, out in load.outcomes:
        assert out.ok and out.ids == oracle(out.prompt, out.max_new), out  # nothing lost: requeued and recomputed
    spanning = sum(1 for s, o in load.outcomes if s < t0 < s + o.seconds)
    print(f"\nSIGTERM {name}: exit 0 after {seconds:.2f} s; {spanning} calls in flight completed = HF after restart")


def test_sigterm_to_the_scheduler_drains_in_flight_work_and_fails_the_rest_explicitly(sys_, settled, oracle):
    settled(sys_)
    (short_t, short), (long_t, long) = long_then_short(sys_)
    t0 = time.monotonic()
    sys_.be.stack.procs["scheduler"].send_signal(signal.SIGTERM)
    wait_for(lambda: sys_.status("/ready") != 200, 2, "/ready non-200 after SIGTERM")
    ready_down = time.monotonic() - t0
    refused = generate(sys_.url, PROMPTS[2], 4, stream=False, timeout=10)
    assert refused.status == 503 and refused.retry_after, refused
    try:
        sys_.be.stack.procs["scheduler"].wait(DRAIN + 10)
    except subprocess.TimeoutExpired:  # show where it hangs: its threads' stacks (SIGUSR1) and its log
        sys_.be.stack.procs["scheduler"].send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        raise AssertionError(f"the scheduler did not exit {DRAIN + 10:g} s after SIGTERM:\n"
                             f"{sys_.be.stack.log_tail('scheduler', 200)}") from None
    exited = time.monotonic() - t0
    assert sys_.exit_code("scheduler") == 0, sys_.be.stack.log_tail("scheduler")
    short_t.join(10)
    long_t.join(10)
    assert short[0].ended_at > t0, short  # it was in flight at SIGTERM
    assert short[0].ok and short[0].ids == oracle(PROMPTS[0], SHORT), short  # finished within the grace period
    assert not long[0].ok and "shutting down" in long[0].error, long      # the rest: an explicit error
    sys_.restart("scheduler")
    wait_for(lambda: sys_.status("/ready") == 200, 30, "/ready 200 after restart")
    assert generate(sys_.url, PROMPTS[0], 8, stream=False).ok
    print(f"\nSIGTERM scheduler: /ready non-200 after {ready_down:.2f} s, refused new work with 503 "
          f"({refused.error!r}), exit 0 after {exited:.2f} s (drain {DRAIN} s); short request done "
          f"{short[0].ended_at - t0:.2f} s after SIGTERM; long request: {long[0].error!r}")


def test_sigterm_to_the_gateway_finishes_in_flight_requests_and_exits_0(sys_, settled, oracle):
    settled(sys_)
    (short_t, short), (long_t, long) = long_then_short(sys_)
    t0 = time.monotonic()
    sys_.be.stack.procs["gateway"].send_signal(signal.SIGTERM)
    wait_for(lambda: sys_.status("/ready") != 200, 2, "/ready non-200 after SIGTERM")
    ready_down = time.monotonic() - t0
    sys_.be.stack.procs["gateway"].wait(15)
    exited = time.monotonic() - t0
    assert sys_.exit_code("gateway") == 0, sys_.be.stack.log_tail("gateway")
    short_t.join(10)
    long_t.join(10)
    assert short[0].ended_at > t0, short  # it was in flight at SIGTERM
    assert short[0].ok and short[0].ids == oracle(PROMPTS[0], SHORT), short
    assert long[0].status == 200 and "gateway is shutting down" in long[0].error, long  # an error event
    sys_.restart("gateway")
    assert generate(sys_.url, PROMPTS[0], 8, stream=False).ok
    print(f"\nSIGTERM gateway: /ready non-200 after {ready_down:.2f} s, exit 0 after {exited:.2f} s; short request "
          f"done {short[0].ended_at - t0:.2f} s after SIGTERM; long request ended with {long[0].error!r}")
