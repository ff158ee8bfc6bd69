"""Generate through the real cache, worker and scheduler: HF equality, logprobs, limits, errors."""

import grpc
import pytest

from codeserve.v1 import scheduler_pb2
from tests.scheduler import hf
from tests.stack import generate, status_of

CODE_PROMPTS = [
    "def main():",
    "def fibonacci(n):\n",
    "import os\nimport sys\n\ndef read_config(path):\n    \"\"\"Read a JSON config file.\"\"\"\n",
    "function debounce(fn, ms) {\n  // Returns a debounced version of fn.\n",
    "SELECT name, COUNT(*) FROM users\nWHERE",
    "// Sum returns the sum of xs.\nfunc Sum(xs []int) int {\n",
    "<fim_prefix>def quick_sort(arr):\n    if len(arr) <= 1:\n        return arr\n    <fim_suffix>\n"
    "    return quick_sort(left) + mid + quick_sort(right)\n<fim_middle>",
]


@pytest.mark.parametrize("prompt", CODE_PROMPTS)
def test_greedy_equals_hf_token_for_token_with_logprobs(backend, model_path, tokenizer, prompt):
    ids = tokenizer.encode(prompt).ids
    out = generate(backend.scheduler, text=prompt, max_new_tokens=32, return_logprob=True, skip_special_tokens=True)
    expected, expected_lps = hf.greedy(model_path, ids, 32)
    assert out.prompt_token_ids == ids and out.prompt_tokens == len(ids)
    assert out.token_ids == expected
    assert out.logprobs == pytest.approx(expected_lps, abs=1e-4)
    assert out.completion_tokens == len(expected)
    if expected[-1] == 0:
        assert (out.finish_reason, out.matched_stop) == ("stop", "0")
    else:
        assert out.finish_reason == "length"
    assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert "<fim_" not in out.text


def test_fim_markers_are_single_special_ids(tokenizer):
    ids = tokenizer.encode(CODE_PROMPTS[-1]).ids
    for marker in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"):
        assert ids.count(tokenizer.token_to_id(marker)) == 1


def test_exactly_n_tokens_and_one_token_is_the_first_of_a_longer_answer(backend):
    prompt = "def add(a, b):\n"
    long = generate(backend.scheduler, text=prompt, max_new_tokens=8, ignore_eos=True, return_logprob=True)
    for n in (1, 2):
        out = generate(backend.scheduler, text=prompt, max_new_tokens=n, ignore_eos=True, return_logprob=True)
        assert out.token_ids == long.token_ids[:n] and len(out.logprobs) == n
        assert (out.finish_reason, out.completion_tokens) == ("length", n)


def test_zero_new_tokens_returns_prompt_info_and_prompt_logprobs(backend, model_path, tokenizer):
    prompt = "def add(a, b):\n    return a + b"
    ids = tokenizer.encode(prompt).ids
    plain = generate(backend.scheduler, text=prompt, max_new_tokens=0)
    assert (plain.token_ids, plain.text, plain.finish_reason, plain.prompt_tokens) == ([], "", "length", len(ids))
    with_lps = generate(backend.scheduler, text=prompt, max_new_tokens=0, return_prompt_logprobs=True)
    assert with_lps.token_ids == [] and with_lps.finish_reason == "length"
    assert with_lps.prompt_logprobs == pytest.approx(hf.prompt_logprobs(model_path, ids), abs=1e-4)


def test_prompt_logprobs_are_complete_even_when_the_prompt_is_cached(backend, model_path, tokenizer):
    prompt = "class Stack:\n    def __init__(self):\n        self.items = []\n"
    ids = tokenizer.encode(prompt).ids
    generate(backend.scheduler, text=prompt, max_new_tokens=4)  # caches the prompt
    out = generate(backend.scheduler, text=prompt, max_new_tokens=4, return_prompt_logprobs=True)
    assert out.prompt_logprobs == pytest.approx(hf.prompt_logprobs(model_path, ids), abs=1e-4)


def test_stop_strings_hold_back_and_stream_equals_non_stream(backend):
    base = generate(backend.scheduler, text="def main():", max_new_tokens=24, ignore_eos=True)
    stop = base.text[5:9]
    assert stop, base.text
    out = generate(backend.scheduler, text="def main():", max_new_tokens=24, ignore_eos=True, stop=[stop])
    assert (out.finish_reason, out.matched_stop) == ("stop", stop)
    assert out.text == base.text[: base.text.find(stop)]
    streamed = ""
    for msg in out.messages:
        streamed += msg.text
        assert stop not in streamed
    kept = generate(backend.scheduler, text="def main():", max_new_tokens=24, ignore_eos=True, stop=[stop],
                    no_stop_trim=True)
    assert kept.text == base.text[: base.text.find(stop) + len(stop)]


def test_stop_at_the_very_start_gives_empty_text(backend):
    base = generate(backend.scheduler, text="x = 1\n", max_new_tokens=4, ignore_eos=True)
    first = base.text[:1]
    assert first
    out = generate(backend.scheduler, text="x = 1\n", max_new_tokens=4, ignore_eos=True, stop=[first])
    assert (out.text, out.finish_reason, out.matched_stop) == ("", "stop", first)


def test_stop_token_ids_end_the_request(backend):
    base = generate(backend.scheduler, text="def main():", max_new_tokens=8, ignore_eos=True)
    target = base.token_ids[3]
    out = generate(backend.scheduler, text="def main():", max_new_tokens=8, ignore_eos=True, stop_token_ids=[target])
    k = base.token_ids.index(target)
    assert out.token_ids == base.token_ids[: k + 1]
    assert (out.finish_reason, out.matched_stop) == ("stop", str(target))


@pytest.mark.parametrize("kw, message", [
    (dict(text=""), "prompt is empty"),
    (dict(input_ids=[]), "prompt is empty"),
    (dict(input_ids=[1, 5000]), "outside the vocabulary"),
    (dict(input_ids=[7] * 4106, max_new_tokens=1), "prompt has 4106 tokens; the context limit (n_positions) is 4096"),
    (dict(text="x", max_new_tokens=-1), "max_new_tokens must be >= 0"),
    (dict(text="x", max_new_tokens=1, temperature=-1.0), "temperature"),
])
def test_bad_input_is_invalid_argument_and_changes_nothing(backend, kw, message):
    backend.wait_idle()  # with overlapped decode a finished request is released just after its end is streamed
    before = backend.counters()
    code, details = status_of(lambda: generate(backend.scheduler, **kw))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details
    assert backend.counters() == before
    assert generate(backend.scheduler, text="x = 1", max_new_tokens=2).completion_tokens == 2


def test_context_limit_caps_generation(backend):
    info = backend.scheduler.ServerInfo(scheduler_pb2.ServerInfoRequest())
    n = info.n_positions - 4
    out = generate(backend.scheduler, input_ids=[7] * n, max_new_tokens=16, ignore_eos=True)
    assert (len(out.token_ids), out.finish_reason) == (4, "length")


def test_server_info_and_load(backend):
    info = backend.scheduler.ServerInfo(scheduler_pb2.ServerInfoRequest())
    assert (info.n_positions, info.vocab_size, info.eos_token_id, info.chunk_size) == (4096, 1024, 0, 512)
    assert info.pools[0].capacity == 8192
    load = backend.wait_idle()
    assert load.batches_completed > 0 and load.generation_tokens_total > 0
    assert load.pools[0].capacity == 8192


def test_load_of_others_leaves_out_one_routers_calls(backend):
    """GetLoad with a router id: ``others`` counts the live calls not tagged with it (a router counts its own)."""
    mine = backend.scheduler.Generate(scheduler_pb2.GenerateRequest(
        text="def forever():", max_new_tokens=3000, ignore_eos=True, request_id="lo-mine", router_id="gw-a"))
    theirs = backend.scheduler.Generate(scheduler_pb2.GenerateRequest(
        text="def forever():", max_new_tokens=3000, ignore_eos=True, request_id="lo-theirs", router_id="gw-b"))
    assert next(mine).token_ids and next(theirs).token_ids
    try:
        a = backend.scheduler.GetLoad(scheduler_pb2.GetLoadRequest(router_id="gw-a"))
        assert (a.running, a.others.live, a.others.waiting, a.others.waiting_tokens) == (2, 1, 0, 0)
        none = backend.scheduler.GetLoad(scheduler_pb2.GetLoadRequest(router_id="gw-c"))
        assert none.others.live == 2
        assert not backend.scheduler.GetLoad(scheduler_pb2.GetLoadRequest()).HasField("others")
    finally:
        mine.cancel()
        theirs.cancel()
    backend.wait_idle(timeout=10)
    backend.idle_check()


def test_abort_of_a_running_request_frees_its_slots(backend):
    stream = backend.scheduler.Generate(
        scheduler_pb2.GenerateRequest(text="def forever():", max_new_tokens=3000, ignore_eos=True, request_id="ab-1"))
    first = next(stream)
    assert first.token_ids
    assert backend.scheduler.Abort(scheduler_pb2.AbortRequest(request_id="ab-1")).found
    rest = list(stream)
    assert rest[-1].finish_reason == "abort"
    assert not backend.scheduler.Abort(scheduler_pb2.AbortRequest(request_id="ab-1")).found
    backend.idle_check()


def test_client_disconnect_aborts_the_request(backend):
    stream = backend.scheduler.Generate(
        scheduler_pb2.GenerateRequest(text="def forever():", max_new_tokens=3000, ignore_eos=True))
    next(stream)
    stream.cancel()
    load = backend.wait_idle(timeout=10)
    assert load.running == 0
    backend.idle_check()
