"""The clients users have, against all four real services: the `openai` client (completions streamed
and not, chat), native /generate, and a gRPC client calling the scheduler's Generate directly."""

from __future__ import annotations

import openai

from tests.scheduler import hf
from tests.stack import generate

PROMPT = "def fibonacci(n):\n"


def test_openai_completions_equal_hf_greedy(url, model_name, model_path, tokenizer) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    ids = tokenizer(PROMPT)["input_ids"]
    want, _ = hf.greedy(model_path, ids, 24)
    want_text = tokenizer.decode(want, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    reply = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=24, temperature=0)
    assert reply.choices[0].text == want_text
    assert reply.usage.prompt_tokens == len(ids) and reply.usage.completion_tokens == len(want)
    streamed = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=24, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == want_text


def test_openai_chat_streams_the_same_text(url, model_name) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    messages = [{"role": "user", "content": "Write a function that reverses a string."}]
    reply = client.chat.completions.create(model=model_name, messages=messages, max_tokens=16, temperature=0)
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage.completion_tokens == 16 or reply.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model=model_name, messages=messages, max_tokens=16, temperature=0,
                                              stream=True)
    text = "".join((c.choices[0].delta.content or "") for c in streamed if c.choices)
    assert text == reply.choices[0].message.content


def test_native_generate_single_and_batch(http, model_path, tokenizer) -> None:
    ids = tokenizer(PROMPT)["input_ids"]
    want, _ = hf.greedy(model_path, ids, 12)
    one = http.post("/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 12, "temperature": 0}})
    assert one.status_code == 200, one.text
    assert one.json()["output_ids"] == want
    assert one.json()["meta_info"]["prompt_tokens"] == len(ids)
    batch = http.post("/generate", json={"input_ids": [ids, ids[:-1]],
                                         "sampling_params": {"max_new_tokens": 12, "temperature": 0}})
    assert batch.status_code == 200, batch.text
    outs = batch.json()
    assert outs[0]["output_ids"] == want
    assert outs[1]["output_ids"] == hf.greedy(model_path, ids[:-1], 12)[0]


def test_grpc_generate_with_text_and_with_token_ids(backend, model_path, tokenizer) -> None:
    ids = tokenizer(PROMPT)["input_ids"]
    want, want_lp = hf.greedy(model_path, ids, 10)
    by_text = generate(backend.scheduler, text=PROMPT, max_new_tokens=10, return_logprob=True,
                       skip_special_tokens=True)
    by_ids = generate(backend.scheduler, input_ids=ids, max_new_tokens=10, return_logprob=True)
    assert by_text.prompt_token_ids == ids
    assert by_text.token_ids == want and by_ids.token_ids == want
    assert max(abs(a - b) for a, b in zip(by_ids.logprobs, want_lp)) < 1e-4
    assert by_text.text == tokenizer.decode(want, skip_special_tokens=True, clean_up_tokenization_spaces=False)
