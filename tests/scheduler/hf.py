"""HF oracle for the scheduler tests: transformers' GPTBigCodeForCausalLM, fp32 on CPU, greedy with a KV cache."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=2)
def model(path: str):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # a tiny model: one thread is faster, and the worker process needs the other core
    return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()


def greedy(path: str, prompt_ids: list[int], max_new_tokens: int, eos: int | None = 0) -> tuple[list[int], list[float]]:
    """(new token ids, their natural-log probabilities); stops after EOS (included) unless ``eos`` is None."""
    m = model(path)
    out: list[int] = []
    lps: list[float] = []
    with torch.no_grad():
        res = m(torch.tensor([prompt_ids]), use_cache=True)
        for _ in range(max_new_tokens):
            lp = torch.log_softmax(res.logits[0, -1].float(), dim=-1)
            tok = int(torch.argmax(lp))
            out.append(tok)
            lps.append(float(lp[tok]))
            if eos is not None and tok == eos:
                break
            res = m(torch.tensor([[tok]]), cache=res.past_key_values, use_cache=True)
    return out, lps


def prompt_logprobs(path: str, prompt_ids: list[int]) -> list[float]:
    """log p(prompt[i] | prompt[:i]) for i >= 1."""
    with torch.no_grad():
        logits = model(path)(torch.tensor([prompt_ids])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [float(lp[i - 1, prompt_ids[i]]) for i in range(1, len(prompt_ids))]
