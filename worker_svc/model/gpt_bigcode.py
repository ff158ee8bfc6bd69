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

from worker_svc.model import decode_gemms, fused, skinny_gemm
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

    def start(self, x: torch.Tensor, kv_pool, out_slots: torch.Tensor, fuse_kv: bool = False,
              mm=None, pdl: bool = False, write_kv: bool = True) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The part before attention: x [T, n_embd] (ln_1's output) -> (q [T, n_head, head_dim], (k, v)
        [T, kv_heads, head_dim] each: views of the c_attn output, what this layer writes into ``kv_pool`` at
        ``out_slots`` [T] (int64); the ragged prefill path reads them, ``attention.ragged``). ``fuse_kv``
        (multi-query, CUDA): K and V written by one kernel from the c_attn output, q a strided view of it
        (``fused.write_kv``); otherwise q is contiguous. ``mm`` (``decode_gemms.DecodeGemms``) runs the projection
        when given, on the ``fuse_kv`` path only (the unfused path keeps ``c_attn``); ``pdl``:
        the K/V write as a programmatic dependent launch. ``write_kv`` False (``fuse_kv`` only, else RuntimeError):
        nothing is written here, the attention backend writes the returned (k, v) (``writes_new_kv``)."""
        if fuse_kv:
            qkv = self.c_attn(x) if mm is None else mm(x, self.c_attn)  # [T, n_embd + 2 * head_dim]
            if write_kv:
                fused.write_kv(qkv, kv_pool.k[self.layer], kv_pool.v[self.layer], out_slots, self.n_embd,
                               self.head_dim, pdl=pdl)
            e, d = self.n_embd, self.head_dim
            q = qkv[:, :e].unflatten(1, (self.n_head, d))  # strided: rows of n_embd + 2 hd
            return q, (qkv[:, e:e + d].unsqueeze(1), qkv[:, e + d:].unsqueeze(1))  # [T, 1, hd], the same rows
        if not write_kv:
            raise RuntimeError("an attention backend that writes the new K/V needs the model's fused K/V path")
        q, k, v = self.split_qkv(x)
        kv_pool.write(self.layer, out_slots, k, v)
        return q.contiguous(), (k, v)

    def finish(self, o: torch.Tensor, mm=None) -> torch.Tensor:
        """The part after attention: o [T, n_head, head_dim] -> c_proj output [T, n_embd] (through ``mm``
        when given)."""
        o = o.reshape(o.shape[0], self.n_embd)
        return self.c_proj(o) if mm is None else mm(o, self.c_proj)


class MLP(nn.Module):
    """c_fc -> activation -> c_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, cfg.n_inner)
        self.c_proj = nn.Linear(cfg.n_inner, cfg.n_embd)
        self.act = activation(cfg.activation_function)

    def forward(self, x: torch.Tensor, gelu_epilogue: bool = False, mm=None) -> torch.Tensor:
        """x [T, n_embd] -> [T, n_embd]. ``gelu_epilogue``: bias + tanh GELU inside the c_fc GEMM (CUDA,
        ``gelu_pytorch_tanh`` models only; ``fused.mlp_up``, or ``mm``'s kernel when given)."""
        if mm is not None and gelu_epilogue:
            return mm(mm(x, self.c_fc, gelu=True), self.c_proj)
        up = fused.mlp_up(x, self.c_fc) if gelu_epilogue else self.act(self.c_fc(x))
        return self.c_proj(up) if mm is None else mm(up, self.c_proj)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: its parameters (the model's ``piece`` runs it)."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = Attention(cfg, layer)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)


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
        self.pdl = False  # the fused kernels as programmatic dependent launches
        self.mm = None  # decode_gemms.DecodeGemms: the projections of batches of few rows
        self.transformer = Transformer(cfg)
        # Only when the checkpoint unties the head (tie_word_embeddings: false); GPTBigCode ties it.
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_pool, backend,
                out_slots: torch.Tensor) -> torch.Tensor:
        """input_ids, positions, out_slots: int64 [T] -> hidden states after ln_f [T, n_embd] (model dtype).

        The caller has validated ids < vocab_size and positions < n_positions, and has planned ``backend``
        for this batch (``backend.plan(meta)`` or ``backend.plan_ragged(meta)``). The pieces (``piece``) with
        attention between them, each layer's new K/V handed to it (``new_kv``: what the ragged path reads).
        """
        write = not backend.writes_new_kv  # (else attend writes each layer's new K/V)
        h, x, kv = self.piece(0, kv_pool, out_slots, input_ids=input_ids, positions=positions, write_kv=write)
        for i in range(self.cfg.n_layer):
            h, x, kv = self.piece(i + 1, kv_pool, out_slots, h=h, o=backend.attend(i, x, kv_pool, new_kv=kv),
                                  write_kv=write)
        return x

    @torch.inference_mode()
    def piece(self, i: int, kv_pool, out_slots: torch.Tensor, *, input_ids: torch.Tensor | None = None,
              positions: torch.Tensor | None = None, h: torch.Tensor | None = None,
              o: torch.Tensor | None = None, write_kv: bool = True) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
        """Piece ``i`` of the forward, 0 <= i <= n_layer: everything between two attention calls.

        Piece 0 embeds ``input_ids`` / ``positions`` (int64 [T]) and starts layer 0; piece i (0 < i < n_layer)
        finishes layer i - 1 from the residual ``h`` [T, n_embd] and that layer's attention output ``o``
        [T, n_head, head_dim] (c_proj, residual adds, MLP) and starts layer i (ln_1, c_attn, K/V written at
        ``out_slots``); piece n_layer finishes the last layer. Returns (residual h, layer i's query [T, n_head,
        head_dim], layer i's new (k, v) [T, kv_heads, head_dim] each, as ``Attention.start`` gives them), or (h,
        hidden states after ln_f [T, n_embd], None) for piece n_layer. ``extend_graph.ExtendGraphs`` captures each
        piece as a graph and runs attention eagerly between them. ``write_kv`` False: the new K/V are not written
        here (the attention backend writes them: ``AttentionBackend.writes_new_kv``)."""
        t = self.transformer
        if i == 0:
            h = t.wte(input_ids) + t.wpe(positions)  # [T, n_embd]
            y = t.h[0].ln_1(h)
        else:
            h, y = self._finish_layer(i - 1, h, o)
        if i == self.cfg.n_layer:
            return h, y, None
        return h, *t.h[i].attn.start(y, kv_pool, out_slots, self.fuse_kv, self._mm(y), self.pdl, write_kv)

    def _mm(self, x: torch.Tensor):
        """The GEMM runner for x's rows: ``self.mm`` when it takes them, else None (torch's modules)."""
        return self.mm if self.mm is not None and x.shape[0] <= self.mm.max_rows else None

    def _finish_layer(self, i: int, h: torch.Tensor, o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i after its attention: (h + attn + mlp, the next LayerNorm of it), the next one being layer
        i + 1's ln_1 or ln_f. With ``fuse_norms`` each residual add is fused with the LayerNorm after it."""
        t = self.transformer
        block = t.h[i]
        after = t.h[i + 1].ln_1 if i + 1 < len(t.h) else t.ln_f
        mm = self._mm(h)
        a = block.attn.finish(o, mm)
        if self.fuse_norms:
            h, y = fused.add_layer_norm(h, a, block.ln_2, pdl=self.pdl)
            return fused.add_layer_norm(h, block.mlp(y, self.gelu_epilogue, mm), after, pdl=self.pdl)
        h = h + a
        h = h + block.mlp(block.ln_2(h), self.gelu_epilogue, mm)
        return h, after(h)

    def use_fused_kernels(self, norms: bool = True, gelu: bool = True, kv: bool = True, splitk_rows: int = 0,
                          pdl: bool = False, resident_rows: int = 0, resident_mm_rows: int = 0) -> None:
        """Turns the fused kernels on where they can run (CUDA with Triton; the GELU epilogue only for
        ``gelu_pytorch_tanh``, the family's activation; the K/V write (``kv``) only for multi-query layers,
        and with the fused norms, whose path it rides), off otherwise. ``splitk_rows`` > 0: the projections of
        batches up to that many rows through ``skinny_gemm`` (split-K Triton GEMMs; float16 / bfloat16 models
        only: in float32 Triton's dot rounds to TF32, so fp32 keeps cuBLAS); ``resident_rows`` > 0 (at most
        ``resident_gemv.MAX_ROWS``): the projections of batches up to that many rows through ``resident_gemv``
        (each CTA reads its weights before the kernel ahead ends; same dtypes); ``resident_mm_rows`` (at most
        ``resident_gemm.MAX_ROWS``): the small projections of batches above ``resident_rows`` up to that
        many rows through ``resident_gemm`` (the same, on tensor cores); ``pdl``: the Triton kernels as
        programmatic dependent launches. Call before capturing graphs."""
        device = self.transformer.wte.weight.device
        ok = fused.enabled(device)
        self.fuse_norms = norms and ok
        self.gelu_epilogue = gelu and ok and self.cfg.activation_function == "gelu_pytorch_tanh"
        self.fuse_kv = kv and self.fuse_norms and self.cfg.multi_query
        self.pdl = pdl and ok
        blk = self.transformer.h[0]
        linears = (blk.attn.c_attn, blk.attn.c_proj, blk.mlp.c_fc, blk.mlp.c_proj)
        half = self.transformer.wte.weight.dtype in skinny_gemm.HALF_DTYPES  # fp32 keeps cuBLAS's fp32 GEMMs
        self.mm = (decode_gemms.DecodeGemms([lin.weight.shape for lin in linears], splitk_rows, device, self.pdl,
                                            resident_rows=resident_rows, mm_rows=resident_mm_rows)
                   if max(splitk_rows, resident_rows, resident_mm_rows) > 0 and ok and half else None)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, n_embd] -> float32 logits [N, vocab_size]."""
        return self.raw_logits(hidden).float()

    @torch.inference_mode()  # called on its own by the decode graphs: the weights are parameters (requires_grad)
    def raw_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, n_embd] -> logits [N, vocab_size] in hidden's dtype (``logits`` without the float32 cast, which
        is exact: the decode graphs pick greedy tokens from these, ``greedy.GreedyArgmax``)."""
        w = self.transformer.wte.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, w)
