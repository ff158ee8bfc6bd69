"""Prompt logprobs (``return_prompt_logprobs``): the log-probability of each prompt token given the ones before it,
as transformers' ``log_softmax(logits[:-1])`` gathered at ``input_ids[1:]`` (vLLM's / SGLang's prompt logprobs)."""

from __future__ import annotations

from typing import Callable

import torch

from worker_svc.types import ForwardItem


def prompt_logprobs(it: ForwardItem, hid: torch.Tensor, prev_hidden: torch.Tensor | None,
                    logits: Callable[[torch.Tensor], torch.Tensor]):
    """(logprob of each target, top-N (token id, logprob) pairs per target) of item ``it``'s new tokens.

    ``hid`` [n, n_embd]: the hidden rows of its n new tokens (row i predicts ``input_ids[i + 1]``); ``prev_hidden``
    [n_embd]: the last hidden row of the chunk before (required when ``position_start`` > 0: it predicts
    ``input_ids[0]``; validation makes sure it is kept); ``logits``: hidden rows [m, n_embd] -> float32 [m, vocab].
    Returns ((), ()) for a first chunk of one token (nothing to predict)."""
    rows = hid[:-1]
    targets = list(it.input_ids[1:])
    if it.position_start > 0:
        rows = torch.cat([prev_hidden[None, :], rows], dim=0)
        targets = list(it.input_ids)
    if not targets:
        return (), ()
    lp = torch.log_softmax(logits(rows), dim=-1)  # [n_targets, vocab]
    tgt = torch.tensor(targets, dtype=torch.long, device=lp.device)
    chosen = tuple(lp.gather(1, tgt[:, None])[:, 0].tolist())
    tops: tuple = ()
    if it.top_logprobs_num > 0:
        v, i = lp.topk(it.top_logprobs_num, dim=-1)
        tops = tuple(tuple(zip(ii, vv)) for ii, vv in zip(i.tolist(), v.tolist()))
    return chosen, tops
