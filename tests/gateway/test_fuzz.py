"""Bad input never gets a 500: random JSON for the request fields of every generation endpoint
(hypothesis), through the real HTTP server against the fake scheduler."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=3)), max_leaves=8)
token_ids = st.lists(st.integers(min_value=-5, max_value=500), max_size=6)
prompts = st.one_of(st.text(max_size=20), st.lists(st.text(max_size=6), max_size=3), token_ids,
                    st.lists(token_ids, max_size=3), json_values)

COMMON = {
    "max_tokens": st.one_of(st.integers(min_value=-3, max_value=40), json_values),
    "temperature": st.one_of(st.floats(min_value=-1, max_value=3), json_values),
    "top_p": st.one_of(st.floats(min_value=-0.5, max_value=1.5), json_values),
    "top_k": st.one_of(st.integers(min_value=-3, max_value=50), json_values),
    "n": st.one_of(st.integers(min_value=-1, max_value=20), json_values),
    "stop": st.one_of(st.text(max_size=4), st.lists(st.text(max_size=4), max_size=3), json_values),
    "seed": st.one_of(st.integers(min_value=-(2**65), max_value=2**65), json_values),
    "stream": st.booleans(),
    "echo": st.one_of(st.booleans(), json_values),
    "logprobs": st.one_of(st.integers(min_value=-2, max_value=25), json_values),
    "stop_token_ids": st.one_of(token_ids, json_values),
}


def _check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def _post(url: str, payload) -> httpx.Response:
    with httpx.stream("POST", url, json=payload, timeout=30) as r:
        r.read()
        return r


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(prompt=prompts, fields=st.fixed_dictionaries({}, optional=COMMON))
def test_completions_never_500(gateway, fake, prompt, fields):
    _check(_post(f"{gateway.url}/v1/completions", {"prompt": prompt, **fields}))


messages = st.one_of(
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "bot", 3]),
                                     "content": st.one_of(st.text(max_size=10), json_values)}), max_size=3),
    json_values)


@FUZZ
@given(msgs=messages, fields=st.fixed_dictionaries({}, optional={
    **COMMON, "logprobs": st.one_of(st.booleans(), json_values),
    "top_logprobs": st.one_of(st.integers(min_value=-1, max_value=25), json_values)}))
def test_chat_never_500(gateway, fake, msgs, fields):
    _check(_post(f"{gateway.url}/v1/chat/completions", {"messages": msgs, **fields}))


sampling = st.one_of(st.fixed_dictionaries({}, optional={
    "max_new_tokens": st.one_of(st.integers(min_value=-2, max_value=40), json_values),
    "temperature": st.one_of(st.floats(min_value=-1, max_value=3), json_values),
    "stop": st.one_of(st.text(max_size=4), json_values),
    "stop_token_ids": st.one_of(token_ids, json_values),
    "n": st.integers(min_value=0, max_value=3),
    "ignore_eos": st.one_of(st.booleans(), json_values),
}), st.lists(st.fixed_dictionaries({}), max_size=3), json_values)


@FUZZ
@given(fields=st.fixed_dictionaries({}, optional={
    "text": st.one_of(st.text(max_size=12), st.lists(st.text(max_size=6), max_size=3), json_values),
    "input_ids": st.one_of(token_ids, st.lists(token_ids, max_size=3), json_values),
    "sampling_params": sampling, "stream": st.booleans(), "return_logprob": st.one_of(st.booleans(), json_values),
    "top_logprobs_num": st.one_of(st.integers(min_value=-1, max_value=25), json_values),
    "logprob_start_len": st.one_of(st.integers(min_value=-3, max_value=30), json_values),
    "rid": st.one_of(st.text(max_size=4), st.lists(st.text(max_size=4), max_size=3), json_values),
}))
def test_native_generate_never_500(gateway, fake, fields):
    fake.requests.clear()
    _check(_post(f"{gateway.url}/generate", fields))


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
@FUZZ
@given(body=json_values)
def test_tokenizer_endpoints_never_500(gateway, path, body):
    _check(_post(f"{gateway.url}{path}", body))
