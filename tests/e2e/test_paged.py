"""Page size > 1 through cache, worker and scheduler (case P1 with pages): prompts padded to whole pages,
a full hit, and two prompts sharing the padded prefix; outputs equal HF, cached lengths are whole pages and
a full hit still recomputes at least one token; no slot leaks."""

from __future__ import annotations

import pytest

from tests.scheduler import hf
from tests.stack import Backend, generate

PAGE = 4


@pytest.fixture(scope="module")
def paged(tmp_path_factory):
    with Backend.start(tmp_path_factory.mktemp("paged-logs"), kv_tokens=4096, page_size=PAGE, chunk_size=32) as be:
        yield be


def test_p1_with_pages_equals_hf(paged, model_path, tokenizer) -> None:
    base = tokenizer("import os\nimport sys\n\ndef main():\n")["input_ids"]
    p0 = (base * 3)[: (len(base) * 3 // PAGE) * PAGE]  # an exact multiple of the page size
    assert len(p0) % PAGE == 0
    p1 = p0 + tokenizer("    args = sys.argv")["input_ids"]
    p2 = p0 + tokenizer("    path = os.getcwd()")["input_ids"]
    for i, prompt in enumerate([p0, p0, p1, p2, p1]):
        out = generate(paged.scheduler, input_ids=prompt, max_new_tokens=16, return_logprob=True)
        paged.wait_idle()  # its insert, deferred after its answer (docs/architecture.md, Finish), sent before the next
        want, lps = hf.greedy(model_path, prompt, 16)
        assert out.token_ids == want, i
        assert out.logprobs == pytest.approx(lps, abs=1e-4)
        assert out.cached_tokens % PAGE == 0 and out.cached_tokens <= len(prompt) - 1
        if i == 1:  # a full hit of p0: all but the last page is reused, the rest recomputed
            assert out.cached_tokens == len(p0) - PAGE
        if i >= 2:
            assert out.cached_tokens >= len(p0) - PAGE
    paged.idle_check()
