"""The Generate and small-pool suites again with multi-step decode (``--decode-steps 4``): greedy output
equals HF token for token, stop strings / stop token ids / max_new_tokens cut inside a multi-step batch,
retraction and aborts free every slot (unused multi-step slots included)."""

import json
import time

import pytest

from tests.scheduler import test_generate, test_small_pool
from tests.scheduler.test_generate import *  # noqa: F401,F403  (collected again with the fixtures below)
from tests.scheduler.test_small_pool import (  # noqa: F401
    test_chunked_prefill_equals_hf_with_prompt_logprobs, test_p2_shared_long_prefix_under_a_small_pool,
    test_p3_cancelled_streams_free_every_slot_and_recompute_identically,
    test_pool_too_small_for_everyone_retracts_and_outputs_stay_equal)
from tests.stack import Backend, generate

STEPS = ("--decode-steps", "4")


@pytest.fixture(scope="module")
def backend(tmp_path_factory, model_path):
    with Backend.start(tmp_path_factory.mktemp("multistep-logs"), model_path=model_path, scheduler_args=STEPS) as be:
        yield be


@pytest.fixture(scope="module")
def small(tmp_path_factory, model_path):
    with Backend.start(tmp_path_factory.mktemp("multistep-small-logs"), model_path=model_path,
                       kv_tokens=test_small_pool.CAPACITY, chunk_size=test_small_pool.CHUNK, max_running_requests=16,
                       policy="lpm", scheduler_args=STEPS) as be:
        yield be


def test_multistep_batches_ran(backend):
    """The suite above must really have used multi-step decode (else it tests nothing new): 13 tokens
    are 1 from the prefill and 12 in decode Forwards of 4 steps each."""
    time.sleep(2.6)  # the loop logs its cumulative counters at most every 2 s: let earlier work be logged
    before = _last_stats(backend)
    out = generate(backend.scheduler, text="def main():", max_new_tokens=13, ignore_eos=True)
    assert len(out.token_ids) == 13
    deadline = time.monotonic() + 10
    while (after := _last_stats(backend))["decode_steps"] - before["decode_steps"] < 12 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert after["decode_steps"] - before["decode_steps"] == 12
    assert after["decode_batches"] - before["decode_batches"] == 3


def _last_stats(be) -> dict:
    lines = [ln for ln in be.stack.log_tail("scheduler", 200000).splitlines() if '"event": "loop_stats"' in ln]
    return json.loads(lines[-1]) if lines else {"decode_steps": 0, "decode_batches": 0}


def test_one_stream_message_per_forward(backend):
    """A multi-step Forward's tokens reach the client as one message (not one per token): 13 tokens =
    the prefill's token, then 3 Forwards of 4 steps (the last message also carries the finish)."""
    from tests.stack import request

    msgs = list(backend.scheduler.Generate(request(text="def main():", max_new_tokens=13, ignore_eos=True), timeout=60))
    with_tokens = [len(m.token_ids) for m in msgs if m.token_ids]
    assert with_tokens == [1, 4, 4, 4]
    assert msgs[-1].finish_reason == "length" and msgs[-1].completion_tokens == 13
