"""Validation of GenerateRequest: clear INVALID_ARGUMENT reasons; context-limit capping."""

import pytest

from codeserve.v1 import common_pb2, scheduler_pb2, worker_pb2
from scheduler_svc.detokenizer import load_tokenizer
from scheduler_svc.validate import InvalidRequest, build_request
from worker_svc.model.default import ensure_default_model

INFO = worker_pb2.WorkerInfo(n_positions=64, vocab_size=1024, eos_token_id=0)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(ensure_default_model())


def req(**kw):
    return scheduler_pb2.GenerateRequest(**kw)


def ids(n):
    return scheduler_pb2.TokenIds(ids=[5] * n)


@pytest.mark.parametrize("request_, message", [
    (req(text=""), "prompt is empty"),
    (req(), "prompt is empty"),
    (req(input_ids=ids(0)), "prompt is empty"),
    (req(input_ids=scheduler_pb2.TokenIds(ids=[1, 1024])), "token id 1024 at position 1 is outside the vocabulary"),
    (req(input_ids=scheduler_pb2.TokenIds(ids=[-1])), "token id -1"),
    (req(input_ids=ids(64)), "prompt has 64 tokens; the context limit (n_positions) is 64"),
    (req(input_ids=ids(3), max_new_tokens=-1), "max_new_tokens must be >= 0"),
    (req(input_ids=ids(3), sampling=common_pb2.SamplingParams(temperature=-0.5)), "temperature"),
    (req(input_ids=ids(3), sampling=common_pb2.SamplingParams(top_p=1.5)), "top_p"),
    (req(input_ids=ids(3), sampling=common_pb2.SamplingParams(top_k=-2)), "top_k"),
    (req(input_ids=ids(3), sampling=common_pb2.SamplingParams(min_p=2)), "min_p"),
    (req(input_ids=ids(3), sampling=common_pb2.SamplingParams(temperature=float("nan"))), "finite"),
    (req(input_ids=ids(3), sampling=common_pb2.SamplingParams(presence_penalty=3)), "presence_penalty"),
    (req(input_ids=ids(3), stop=["ok", ""]), "stop strings must be non-empty"),
    (req(input_ids=ids(3), stop_token_ids=[5000]), "stop token id 5000"),
    (req(input_ids=ids(3), stop=["x"] * 17), "stop has 17 strings; the limit is 16"),
    (req(input_ids=ids(3), stop=["x" * 1025]), "stop has a string of 1025 characters; the limit is 1024"),
    (req(input_ids=ids(3), top_logprobs_num=100), "top_logprobs_num"),
])
def test_invalid_requests_name_the_reason(tok, request_, message):
    with pytest.raises(InvalidRequest, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_request(request_, tok, INFO, capacity=1000)


def test_prompt_larger_than_the_pool_is_rejected(tok):
    with pytest.raises(InvalidRequest, match="KV pool holds 10 tokens"):
        build_request(req(input_ids=ids(10)), tok, INFO, capacity=10)


def test_generation_is_capped_at_the_context_limit(tok):
    r = build_request(req(input_ids=ids(60), max_new_tokens=16), tok, INFO, capacity=1000)
    assert r.params.max_new_tokens == 4 and r.params.asked_max_new_tokens == 16


def test_text_is_tokenized_with_the_checkpoint_tokenizer_and_ids_pass_through(tok):
    r = build_request(req(text="def main():", max_new_tokens=3, request_id="x"), tok, INFO, capacity=1000)
    assert r.prompt_ids == tok.encode("def main():").ids and r.rid == "x"
    assert build_request(req(input_ids=ids(2)), tok, INFO, 1000).rid  # an id is made when empty


def test_generation_is_capped_so_a_lone_request_fits_the_pool(tok):
    r = build_request(req(input_ids=ids(10), max_new_tokens=16), tok, INFO, capacity=20)
    assert r.params.max_new_tokens == 10


def test_stop_limits_at_the_limit_are_accepted(tok):
    r = build_request(req(input_ids=ids(3), stop=["y" * 1024] * 16), tok, INFO, capacity=1000)
    assert len(r.params.stop) == 16
