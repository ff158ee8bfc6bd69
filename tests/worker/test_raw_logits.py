"""``GPTBigCodeForCausalLM.raw_logits`` on its own (the decode graphs call it without ``logits``' inference mode)."""

from __future__ import annotations

import torch

from tests.worker.helpers import cached_model


def test_raw_logits_takes_an_inference_tensor_outside_inference_mode_and_equals_logits(model_dir):
    """The hidden rows a forward returns are inference tensors; the lm_head weight is a parameter (requires_grad).
    Called outside inference mode, as ``cuda_graph.DecodeGraphs`` does, ``raw_logits`` must not record autograd
    (H100 run 28 call 1: every decode-graph test failed with 'Inference tensors cannot be saved for backward')."""
    _, model = cached_model(str(model_dir))
    with torch.inference_mode():
        hidden = torch.randn(3, model.cfg.n_embd)
    assert hidden.is_inference() and not torch.is_inference_mode_enabled()
    raw = model.raw_logits(hidden)
    assert raw.shape == (3, model.cfg.vocab_size) and not raw.requires_grad
    assert torch.equal(raw.float(), model.logits(hidden))
