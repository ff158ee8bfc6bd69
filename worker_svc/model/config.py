"""GPTBigCode model facts read from a Hugging Face ``config.json``."""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

ACTIVATIONS = ("gelu_pytorch_tanh", "gelu", "gelu_new", "gelu_fast", "relu")


@dataclass(frozen=True)
class ModelConfig:
    """The config facts the worker uses. ``kv_heads`` is 1 for multi-query attention, ``n_head`` otherwise."""

    vocab_size: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int
    n_positions: int
    multi_query: bool
    activation_function: str
    layer_norm_epsilon: float
    scale_attn_weights: bool
    tie_word_embeddings: bool
    eos_token_id: int
    name: str

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return 1 if self.multi_query else self.n_head

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V for one token over all layers: 2 * n_layer * kv_heads * head_dim * dtype_bytes."""
        return 2 * self.n_layer * self.kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_dict(cls, d: dict, name: str = "gpt_bigcode") -> "ModelConfig":
        """Builds from a config.json dict. Raises ValueError for other model types or unsupported settings.

        ``name`` is the model name (the directory name); checkpoints written by ``model.default`` are
        named ``codeserve-<shape>``.
        """
        if d.get("model_type") != "gpt_bigcode":
            raise ValueError(f"model_type {d.get('model_type')!r} is not supported (only gpt_bigcode)")
        if d.get("add_cross_attention"):
            raise ValueError("add_cross_attention is not supported")
        act = d.get("activation_function", "gelu_pytorch_tanh")
        if act not in ACTIVATIONS:
            raise ValueError(f"activation_function {act!r} is not supported; supported: {ACTIVATIONS}")
        n_embd, n_head = int(d.get("n_embd", 768)), int(d.get("n_head", 12))
        if n_embd % n_head:
            raise ValueError(f"n_embd {n_embd} is not divisible by n_head {n_head}")
        eos = d.get("eos_token_id", 50256)
        if isinstance(eos, list):
            eos = eos[0]
        return cls(
            vocab_size=int(d.get("vocab_size", 50257)),
            n_embd=n_embd,
            n_layer=int(d.get("n_layer", 12)),
            n_head=n_head,
            n_inner=int(d["n_inner"]) if d.get("n_inner") is not None else 4 * n_embd,
            n_positions=int(d.get("n_positions", 1024)),
            multi_query=bool(d.get("multi_query", True)),
            activation_function=act,
            layer_norm_epsilon=float(d.get("layer_norm_epsilon", 1e-5)),
            scale_attn_weights=bool(d.get("scale_attn_weights", True)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
            eos_token_id=int(eos),
            name=f"codeserve-{d['codeserve_shape']}" if d.get("codeserve_shape") else name,
        )

    @classmethod
    def from_dir(cls, path: str | pathlib.Path) -> "ModelConfig":
        """Reads ``path/config.json``. Raises FileNotFoundError naming the file."""
        p = pathlib.Path(path) / "config.json"
        if not p.is_file():
            raise FileNotFoundError(f"no config.json in {pathlib.Path(path)}")
        d = json.loads(p.read_text())
        return cls.from_dict(d, name=pathlib.Path(path).resolve().name)
