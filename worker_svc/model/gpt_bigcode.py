"""GPTBigCode (StarCoder / SantaCoder family) as a flat-token, paged-KV model.

Reads top to bottom like the architecture:

    h = wte[input_ids] + wpe[positions]
    for each block:  h = h + attn(ln_1(h));  h = h + mlp(ln_2(h))
    logits = ln_f(h) @ wte.T            (LM head tied to wte)

Tokens of all requests in a batch are concatenated ("flat"): ``input_ids`` and ``positions`` are
``[num_tokens]``. Each layer writes the new tokens' K and V into the KV pool at ``out_slots`` and asks the
attention backend for the output; the backend knows which slots each request attends to.

Parameter names are Hugging Face's (``transformer.h.0.attn.c_attn.weight`` ...), so a state dict loads 1:1.
The fused ``c_attn`` projection is laid out differently for the two attention kinds (as in HF):
- multi-query: ``[q (n_embd) | k (head_dim) | v (head_dim)]``;
- multi-head: per head ``[q_h | k_h | v_h]`` interleaved, i.e. view ``[n_head, 3 * head_dim]``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from worker_svc.model import fused
from worker_svc.model.config import ModelConfig


def activation(name: str):
    """The activation function named by ``activation_function`` in config.json (HF semantics)."""
    if name == "gelu_pytorch_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    if name == "gelu_new":
        return lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    if name == "gelu_fast":
        return lambda x: 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))
    if name == "relu":
        return F.relu
    raise ValueError(f"unknown activation {name!r}")


class Attention(nn.Module):
    """Self-attention over the paged KV pool. Parameters: ``c_attn`` (fused QKV) and ``c_proj``."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.multi_query = cfg.multi_query
        self.n_head, self.kv_heads, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.n_embd = cfg.n_embd
        self.c_attn = nn.Linear(cfg.n_embd, cfg.n_embd + 2 * cfg.kv_heads * cfg.head_dim)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def split_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[T, n_embd] -> q [T, n_head, head_dim], k and v [T, kv_heads, head_dim]."""
        qkv = self.c_attn(x)  # [T, n_embd + 2 * kv_heads * head_dim]
        t = x.shape[0]
        if self.multi_query:
            q, k, v = qkv.split((self.n_embd, self.head_dim, self.head_dim), dim=-1)
            return q.reshape(t, self.n_head, self.head_dim), k.reshape(t, 1, self.head_dim), v.reshape(t, 1, self.head_dim)
        qkv = qkv.view(t, self.n_head, 3 * self.head_dim)  # per head [q_h | k_h | v_h]
        q, k, v = qkv.split(self.head_dim, dim=-1)  # each [T, n_head, head_dim]
        return q, k, v

    def forward(self, x: torch.Tensor, kv_pool, backend, out_slots: torch.Tensor, fuse_kv: bool = False) -> torch.Tensor:
        """x [T, n_embd] -> [T, n_embd]; writes this layer's K/V of the T tokens at ``out_slots`` [T].
        ``fuse_kv`` (multi-query, CUDA): K and V written by one kernel from the c_attn output, q passed to the
        backend as a strided view of it (``fused.write_kv``)."""
        if fuse_kv:
            qkv = self.c_attn(x)  # [T, n_embd + 2 * head_dim]
            fused.write_kv(qkv, kv_pool.k[self.layer], kv_pool.v[self.layer], out_slots, self.n_embd, self.head_dim)
            q = qkv[:, :self.n_embd].unflatten(1, (self.n_head, self.head_dim))  # strided: rows of n_embd + 2 hd
            o = backend.attend(self.layer, q, kv_pool)
            return self.c_proj(o.reshape(x.shape[0], self.n_embd))
        q, k, v = self.split_qkv(x)
        kv_pool.write(self.layer, out_slots, k, v)
        o = backend.attend(self.layer, q.contiguous(), kv_pool)  # [T, n_head, head_dim]
        return self.c_proj(o.reshape(x.shape[0], self.n_embd))


class MLP(nn.Module):
    """c_fc -> activation -> c_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, cfg.n_inner)
        self.c_proj = nn.Linear(cfg.n_inner, cfg.n_embd)
        self.act = activation(cfg.activation_function)

    def forward(self, x: torch.Tensor, gelu_epilogue: bool = False) -> torch.Tensor:
        """x [T, n_embd] -> [T, n_embd]. ``gelu_epilogue``: bias + tanh GELU inside the c_fc GEMM (CUDA,
        ``gelu_pytorch_tanh`` models only; ``fused.mlp_up``)."""
        up = fused.mlp_up(x, self.c_fc) if gelu_epilogue else self.act(self.c_fc(x))
        return self.c_proj(up)


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = Attention(cfg, layer)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)

    def forward(self, h: torch.Tensor, kv_pool, backend, out_slots: torch.Tensor,
                gelu_epilogue: bool = False) -> torch.Tensor:
        h = h + self.attn(self.ln_1(h), kv_pool, backend, out_slots)
        return h + self.mlp(self.ln_2(h), gelu_epilogue)


class Transformer(nn.Module):
    """``transformer.*`` of the HF checkpoint: embeddings, blocks, final LayerNorm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)


class GPTBigCodeForCausalLM(nn.Module):
    """The model. ``forward`` gives final hidden states; ``logits`` applies the (tied) LM head.

    The attention scale (1/sqrt(head_dim), or 1 when ``scale_attn_weights`` is false) is the backend's.
    ``fuse_norms`` / ``gelu_epilogue`` (off by default; ``use_fused_kernels`` turns them on where they can
    run) switch to the fused kernels of ``model.fused``: the same arithmetic in fewer kernels, except that
    the GELU epilogue applies GELU to the float32 GEMM result without first rounding it to the model dtype.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.fuse_norms = False
        self.gelu_epilogue = False
        self.fuse_kv = False
        self.transformer = Transformer(cfg)
        # Only when the checkpoint unties the head (tie_word_embeddings: false); GPTBigCode ties it.
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_pool, backend,
                out_slots: torch.Tensor) -> torch.Tensor:
        """input_ids, positions, out_slots: int64 [T] -> hidden states after ln_f [T, n_embd] (model dtype).

        The caller has validated ids < vocab_size and positions < n_positions, and has planned ``backend``
        for this batch (``backend.plan(meta)``).
        """
        t = self.transformer
        h = t.wte(input_ids) + t.wpe(positions)  # [T, n_embd]
        if not self.fuse_norms:
            for block in t.h:
                h = block(h, kv_pool, backend, out_slots, self.gelu_epilogue)
            return t.ln_f(h)
        # the same blocks, each residual add fused with the LayerNorm that follows it
        y = t.h[0].ln_1(h)
        for i, block in enumerate(t.h):
            h, y = fused.add_layer_norm(h, block.attn(y, kv_pool, backend, out_slots, self.fuse_kv), block.ln_2)
            after = t.h[i + 1].ln_1 if i + 1 < len(t.h) else t.ln_f
            h, y = fused.add_layer_norm(h, block.mlp(y, self.gelu_epilogue), after)
        return y

    def use_fused_kernels(self, norms: bool = True, gelu: bool = True, kv: bool = True) -> None:
        """Turns the fused kernels on where they can run (CUDA with Triton; the GELU epilogue only for
        ``gelu_pytorch_tanh``, the family's activation; the K/V write (``kv``) only for multi-query layers,
        and with the fused norms, whose path it rides), off otherwise. Call before capturing graphs."""
        device = self.transformer.wte.weight.device
        ok = fused.enabled(device)
        self.fuse_norms = norms and ok
        self.gelu_epilogue = gelu and ok and self.cfg.activation_function == "gelu_pytorch_tanh"
        self.fuse_kv = kv and self.fuse_norms and self.cfg.multi_query

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, n_embd] -> float32 logits [N, vocab_size]."""
        w = self.transformer.wte.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, w).float()
