"""Two schedulers on one pool (issue 11), with the real cache, worker and scheduler processes: a second
scheduler of another owner registering the pool exits naming the pool and the owner holding it, and the first
keeps serving with its cache intact (before, the second flushed the first's pool, and the two flushed each other
in a loop); a restart of the first (same owner) registers again and serves."""

import signal
import subprocess
import time

from codeserve.v1 import cache_pb2
from launcher.config import commands
from launcher.ports import free_port
from tests.scheduler import hf
from tests.stack import Backend, generate

PROMPT = list(range(300, 340))


def probe(be: Backend) -> int:
    reply = be.cache.ProbePrefix(cache_pb2.ProbePrefixRequest(token_ids=PROMPT, pool_ids=[be.pool_id]), timeout=10)
    return reply.pools[0].cached_tokens


def second_scheduler(be: Backend, owner: str) -> subprocess.CompletedProcess:
    argv = commands(be.stack.cfg, be.stack.model_path)["scheduler"]
    argv[argv.index("--listen") + 1] = f"127.0.0.1:{free_port()}"
    return subprocess.run(argv + ["--owner", owner, "--connect-timeout", "20"], capture_output=True, text=True,
                          timeout=60)


def test_a_second_owner_is_refused_and_the_first_keeps_its_cache(tmp_path, model_path):
    with Backend.start(tmp_path, model_path=model_path, kv_tokens=2048) as be:
        expected = hf.greedy(model_path, PROMPT, 8, eos=None)[0]
        assert generate(be.scheduler, input_ids=PROMPT, max_new_tokens=8, ignore_eos=True).token_ids == expected
        assert probe(be) == len(PROMPT)
        out = second_scheduler(be, "scheduler-1")
        log = out.stdout + out.stderr
        assert out.returncode == 2, log
        assert '"event": "pool_held"' in log and "pool 'default' is held by live session" in log
        assert "of owner 'scheduler-0'" in log
        assert probe(be) == len(PROMPT)                                      # not flushed
        again = generate(be.scheduler, input_ids=PROMPT, max_new_tokens=8, ignore_eos=True)
        assert again.token_ids == expected and again.cached_tokens == len(PROMPT) - 1   # served from its cache
        assert '"event": "connected"' in be.stack.log_tail("scheduler", 100000)
        assert be.stack.log_tail("scheduler", 100000).count('"event": "resynced"') == 0
        be.idle_check()


def test_a_restart_of_the_same_owner_registers_again_and_serves(tmp_path, model_path):
    with Backend.start(tmp_path, model_path=model_path, kv_tokens=2048) as be:
        generate(be.scheduler, input_ids=PROMPT, max_new_tokens=4, ignore_eos=True)
        argv = commands(be.stack.cfg, be.stack.model_path)["scheduler"]
        be.stack.kill("scheduler")
        be.stack.start_one("scheduler", argv)                                # same owner, same worker epoch
        out = generate(be.scheduler, input_ids=PROMPT, max_new_tokens=8, ignore_eos=True)
        assert out.token_ids == hf.greedy(model_path, PROMPT, 8, eos=None)[0]
        assert out.cached_tokens == len(PROMPT) - 1                          # the restart kept the pool's cache
        be.idle_check()


def test_a_scheduler_whose_pool_was_taken_while_it_was_away_stops_instead_of_fighting(tmp_path, model_path):
    """Paused past its lease, the first scheduler's pool is taken by another owner; when it resumes its resync
    gets FAILED_PRECONDITION: it stops (exit 1, the reason logged) and does not retry or flush that pool."""
    with Backend.start(tmp_path, model_path=model_path, kv_tokens=2048, lease_seconds=2.0,
                       scheduler_args=("--lease-seconds", "2")) as be:
        generate(be.scheduler, input_ids=PROMPT, max_new_tokens=4, ignore_eos=True)
        sched = be.stack.procs["scheduler"]
        sched.send_signal(signal.SIGSTOP)
        try:
            time.sleep(3)                                                     # its 2 s lease runs out
            other = be.cache.OpenSession(cache_pb2.OpenSessionRequest(owner="scheduler-1"), timeout=10).session_id
            pool = be.cache.GetPool(cache_pb2.GetPoolRequest(pool_id=be.pool_id), timeout=10).pools[0]
            be.cache.RegisterPool(cache_pb2.RegisterPoolRequest(
                op_id="take-over", pool_id=be.pool_id, page_size=pool.page_size, members=pool.members,
                session_id=other), timeout=10)
        finally:
            sched.send_signal(signal.SIGCONT)
        assert sched.wait(timeout=60) == 1
        log = be.stack.log_tail("scheduler", 100000)
        assert '"event": "pool_held"' in log and "of owner 'scheduler-1'" in log
        assert probe(be) == len(PROMPT)                                      # the pool was not flushed
