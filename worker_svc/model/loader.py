"""Loads a Hugging Face GPTBigCode checkpoint directory into ``GPTBigCodeForCausalLM``.

Weights from ``model.safetensors``, a sharded ``model.safetensors.index.json``, or ``pytorch_model.bin``
(single or ``pytorch_model.bin.index.json``). Parameters are cast to the requested dtype on the device.
"""

from __future__ import annotations

import json
import pathlib
from typing import Iterator

import torch

from worker_svc.model.config import ModelConfig
from worker_svc.model.gpt_bigcode import GPTBigCodeForCausalLM

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Buffers some GPT-2-era checkpoints carry; not parameters of our model.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def weight_files(path: pathlib.Path) -> list[pathlib.Path]:
    """The weight files of a checkpoint directory, preferring safetensors. Raises FileNotFoundError."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = path / index_name
        if index.is_file():
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return [path / n for n in names]
    for single in ("model.safetensors", "pytorch_model.bin"):
        if (path / single).is_file():
            return [path / single]
    raise FileNotFoundError(f"no model.safetensors[.index.json] or pytorch_model.bin[.index.json] in {path}")


def iter_tensors(files: list[pathlib.Path], device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) from every file; safetensors are read straight to ``device``."""
    from safetensors import safe_open

    for f in files:
        if f.suffix == ".safetensors":
            dev = str(device) if device.type != "cpu" else "cpu"
            with safe_open(str(f), framework="pt", device=dev) as st:
                for name in st.keys():
                    yield name, st.get_tensor(name)
        else:
            for name, t in torch.load(str(f), map_location="cpu", weights_only=True).items():
                yield name, t


def canonical_name(name: str) -> str:
    """HF names of GPTBigCodeModel-only checkpoints lack the ``transformer.`` prefix; add it."""
    if name.startswith("transformer.") or name.startswith("lm_head."):
        return name
    return "transformer." + name


def load_model(path: str | pathlib.Path, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> tuple[ModelConfig, GPTBigCodeForCausalLM]:
    """Reads config.json and weights; returns (config, model in eval mode on ``device`` in ``dtype``).

    Raises FileNotFoundError (missing files), ValueError (unsupported config, missing or unexpected
    parameters, shape mismatches; the message names them).
    """
    path = pathlib.Path(path)
    device = torch.device(device)
    cfg = ModelConfig.from_dir(path)
    with torch.device("meta"):
        model = GPTBigCodeForCausalLM(cfg)
    model = model.to(dtype=dtype).to_empty(device=device)
    params = dict(model.named_parameters())
    seen: set[str] = set()
    unexpected: list[str] = []
    for raw, tensor in iter_tensors(weight_files(path), device):
        name = canonical_name(raw)
        if name.endswith(IGNORED_SUFFIXES):
            continue
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied to transformer.wte.weight
        if name not in params:
            unexpected.append(raw)
            continue
        p = params[name]
        if tuple(tensor.shape) != tuple(p.shape):
            raise ValueError(f"{raw}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(p.shape)} "
                             f"(multi_query={cfg.multi_query}, n_head={cfg.n_head}, n_embd={cfg.n_embd})")
        with torch.no_grad():
            p.copy_(tensor.to(device=device, dtype=dtype))
        seen.add(name)
    missing = sorted(set(params) - seen)
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match GPTBigCode config: missing {missing[:8]}"
                         f"{'...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}")
    model.eval()
    return cfg, model
