"""Chunked prefill pipelined through the real stack (cache, worker, scheduler processes; CPU fp32): prompts of
several chunks whose lengths are not page multiples, with page size 1 and 16, give transformers' greedy tokens
and logprobs, and the chunks were sent behind each other (``loop_stats.chunks_ahead``); with mixed chunks a
request decoding meanwhile rides the pipelined chunks from its last sample and still equals transformers. No slot
is left held."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.scheduler import hf
from tests.stack import Backend, generate

CODE = ("import os\nimport sys\n\n\ndef walk(root):\n    for name in sorted(os.listdir(root)):\n        path = "
        "os.path.join(root, name)\n        if os.path.isdir(path):\n            yield from walk(path)\n        else:\n"
        "            yield path\n\n\ndef main(argv):\n    total = 0\n    for path in walk(argv[1]):\n        total += "
        "os.path.getsize(path)\n    print(total)\n\n\nif __name__ == '__main__':\n    main(sys.argv)\n")


def stat(be: Backend, name: str) -> int:
    """A counter of the scheduler's last ``loop_stats`` log line (0 before any)."""
    lines = [ln for ln in (be.stack.log_dir / "scheduler.log").read_text().splitlines() if '"loop_stats"' in ln]
    return json.loads(lines[-1]).get(name, 0) if lines else 0


def chunks_ahead(be: Backend, at_least: int, timeout: float = 10.0) -> int:
    """The scheduler's ``chunks_ahead`` counter from its last ``loop_stats`` log line (logged every 2 s while the
    counters change), once it is ``at_least`` (or after ``timeout`` s)."""
    deadline, seen = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        for line in (be.stack.log_dir / "scheduler.log").read_text().splitlines():
            if '"loop_stats"' in line:
                seen = json.loads(line).get("chunks_ahead", 0)
        if seen >= at_least:
            return seen
        time.sleep(0.5)
    return seen


@pytest.mark.parametrize("page, chunk", [(1, 23), (16, 37)])
def test_prompts_of_several_chunks_pipelined_equal_hf(tmp_path, model_path, tokenizer, page, chunk) -> None:
    ids = tokenizer.encode(CODE).ids
    prompts = [ids[:150], ids[3:134]]  # 150 and 131 tokens: several chunks, neither a page multiple
    assert all(len(p) % 16 and len(p) % chunk for p in prompts)
    with Backend.start(tmp_path, kv_tokens=4096, page_size=page, chunk_size=chunk, max_running_requests=8) as be:
        for prompt in prompts:
            out = generate(be.scheduler, input_ids=prompt, max_new_tokens=12, return_logprob=True)
            want, lps = hf.greedy(model_path, prompt, 12)
            assert out.token_ids == want
            assert out.logprobs == pytest.approx(lps, abs=1e-4)
        behind = sum(-(-len(p) // chunk) - 1 for p in prompts)  # every chunk but each prompt's first
        assert chunks_ahead(be, behind) == behind
        be.idle_check()


RIDER_TOKENS = 60


def test_a_decoding_request_rides_pipelined_chunks_and_both_equal_hf(tmp_path, model_path, tokenizer) -> None:
    ids = tokenizer.encode(CODE).ids
    short, long = ids[:9], ids[5:150]
    with Backend.start(tmp_path, kv_tokens=4096, chunk_size=23, max_running_requests=8,
                       scheduler_args=("--mixed-chunk",)) as be:
        outs = {}
        rider = threading.Thread(target=lambda: outs.update(short=generate(be.scheduler, input_ids=short,
                                                                           max_new_tokens=RIDER_TOKENS)))
        rider.start()
        time.sleep(0.3)  # decoding by now
        outs["long"] = generate(be.scheduler, input_ids=long, max_new_tokens=12)
        rider.join(120)
        assert outs["short"].token_ids == hf.greedy(model_path, short, RIDER_TOKENS)[0]
        assert outs["long"].token_ids == hf.greedy(model_path, long, 12)[0]
        # 7 chunks: every one but the first sent ahead, or (when the long prompt arrives while the rider's decode
        # Forward runs, as on an idle box) its first chunk admitted ahead of the decode chain (extends_ahead) and
        # its second planned after that extend's reply (not pipelined: a known gap), the other 5 pipelined
        assert chunks_ahead(be, 6) + stat(be, "extends_ahead") >= 6
        be.idle_check()
