"""Fixtures shared by the worker tests: the default checkpoint, its HF model and tokenizer, variants."""

from __future__ import annotations

import pathlib

import pytest
import torch

from worker_svc.model.default import ensure_default_model, write_checkpoint

CODE_PROMPTS = (
    "def fibonacci(n):\n",
    "def main():",
    "import os\nimport sys\n\nclass Stack:\n    def __init__(self):\n        self._items = []\n",
    "SELECT u.id, COUNT(o.id) FROM users AS u",
    "function debounce(fn, wait) {\n  let timer = null;",
    "package main\n\nimport (\n\t\"fmt\"\n)\n\nfunc main() {",
    "<fim_prefix>def quick_sort(arr):\n    if len(arr) <= 1:\n        return arr\n    <fim_suffix>\n    return quick_sort(left) + mid + quick_sort(right)\n<fim_middle>",
)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> pathlib.Path:
    return ensure_default_model(tmp_path_factory.mktemp("worker-model") / "default")


@pytest.fixture(scope="session")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def prompts(tokenizer) -> list[list[int]]:
    return [tokenizer(p)["input_ids"] for p in CODE_PROMPTS]


def variant_dir(tmp_path_factory, name: str, **overrides) -> pathlib.Path:
    """A small checkpoint with config overrides (e.g. multi_query=False)."""
    out = tmp_path_factory.mktemp(f"variant-{name}")
    small = {"n_positions": 512}
    return write_checkpoint(out, overrides={**small, **overrides}, seed=7)


@pytest.fixture(scope="session")
def mha_gelu_dir(tmp_path_factory) -> pathlib.Path:
    return variant_dir(tmp_path_factory, "mha-gelu", multi_query=False, activation_function="gelu")


@pytest.fixture(scope="session")
def mha_tanh_dir(tmp_path_factory) -> pathlib.Path:
    return variant_dir(tmp_path_factory, "mha-tanh", multi_query=False, activation_function="gelu_pytorch_tanh")


@pytest.fixture(scope="session")
def mqa_gelu_dir(tmp_path_factory) -> pathlib.Path:
    return variant_dir(tmp_path_factory, "mqa-gelu", multi_query=True, activation_function="gelu",
                       layer_norm_epsilon=1e-3)


@pytest.fixture(scope="session")
def unscaled_dir(tmp_path_factory) -> pathlib.Path:
    return variant_dir(tmp_path_factory, "unscaled", multi_query=False, activation_function="gelu_new",
                       scale_attn_weights=False)
