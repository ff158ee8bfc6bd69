"""Chunked prefill pipelined through the real stack (cache, worker, scheduler processes; CPU fp32) with many prompts
at once and a chunk size that cuts them: the extends behind carry continuation rows (a prompt cut at the previous
chunk's end), which the worker prepares at arrival and launches behind the extend ahead of them
(``worker_svc/extend_ahead.py``, ``extend_behind.py``). Greedy tokens and logprobs equal transformers'; no Forward is
rejected or fails at the worker, the scheduler never resyncs, and no slot is left held."""

from __future__ import annotations

import pytest

from tests.scheduler import hf
from tests.scheduler.test_chunk_pipeline_hf import CODE, stat
from tests.stack import Backend, generate_many

CHUNK = 29
NEW = 10


def _prompts(tokenizer) -> list[list[int]]:
    ids = tokenizer.encode(CODE).ids
    cuts = [(0, 150), (3, 134), (11, 52), (40, 77), (7, 99), (60, 121), (20, 45), (1, 89)]
    return [ids[a:b] for a, b in cuts]


@pytest.mark.parametrize("mixed", [False, True], ids=["plain", "mixed-chunk"])
def test_many_prompts_cut_across_pipelined_chunks_equal_hf(tmp_path, model_path, tokenizer, mixed) -> None:
    prompts = _prompts(tokenizer)
    assert all(len(p) % CHUNK for p in prompts) and sum(map(len, prompts)) > 8 * CHUNK
    want = [hf.greedy(model_path, p, NEW) for p in prompts]
    args = ("--mixed-chunk",) if mixed else ()
    with Backend.start(tmp_path, kv_tokens=4096, chunk_size=CHUNK, max_running_requests=16,
                       scheduler_args=args) as be:
        for _ in range(2):  # the second round: the prompts' prefixes are cached (has_prefix with a prefix)
            outs = generate_many(be.scheduler, [dict(input_ids=p, max_new_tokens=NEW, return_logprob=True)
                                                for p in prompts])
            for out, (tokens, lps) in zip(outs, want):
                assert out.token_ids == tokens
                assert out.logprobs == pytest.approx(lps, abs=1e-4)
        be.idle_check()
        worker = (be.stack.log_dir / "worker.log").read_text()
        sched = (be.stack.log_dir / "scheduler.log").read_text()
    assert "forward_rejected" not in worker and "forward_failed" not in worker
    assert '"resynced"' not in sched and '"dependency_error"' not in sched
