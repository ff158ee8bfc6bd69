"""The embedded default checkpoint: deterministic, HF-loadable, StarCoder special tokens (case K2's tokenizer
part), UTF-8 round trip, atomic concurrent creation, real-shape configs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from worker_svc.model import default
from worker_svc.model.default import SPECIAL_TOKENS, ensure_default_model, write_checkpoint

FIM = ("<fim_prefix>def quick_sort(arr):\n    if len(arr) <= 1:\n        return arr\n    <fim_suffix>\n"
       "    return quick_sort(left) + mid + quick_sort(right)\n<fim_middle>")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def raw_tokenizer(model_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def test_files_and_config(model_dir):
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (model_dir / f).is_file()
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["model_type"] == "gpt_bigcode" and cfg["multi_query"] is True and cfg["n_positions"] == 4096
    assert (cfg["n_embd"], cfg["n_layer"], cfg["n_head"], cfg["vocab_size"]) == (256, 2, 4, 1024)
    assert cfg["activation_function"] == "gelu_pytorch_tanh"
    assert json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"] == 0


def test_deterministic_bytes(model_dir, tmp_path):
    again = ensure_default_model(tmp_path / "again")
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (again / f).read_bytes() == (model_dir / f).read_bytes(), f


def test_special_tokens_are_single_ids(tokenizer, raw_tokenizer):
    for i, tok in enumerate(SPECIAL_TOKENS):
        assert tokenizer.convert_tokens_to_ids(tok) == i
        assert raw_tokenizer.encode(tok).ids == [i]
    assert tokenizer.eos_token_id == 0 and tokenizer.eos_token == "<|endoftext|>"


def test_fim_prompt_k2(tokenizer, raw_tokenizer):
    hf_ids = tokenizer(FIM)["input_ids"]
    assert raw_tokenizer.encode(FIM).ids == hf_ids  # prompt_tokens equals the HF tokenizer's count and ids
    for marker in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"):
        assert hf_ids.count(tokenizer.convert_tokens_to_ids(marker)) == 1
    assert hf_ids[0] == 1 and hf_ids[-1] == 2
    text = tokenizer.decode(hf_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert "<fim_" not in text and "def quick_sort(arr):\n    if len(arr)" in text


def test_code_whitespace_round_trips(tokenizer):
    s = "x = a ., b ! c ?\nrun(\"python3 ./src/main.py $IN $OUT\" , 'it' )\n\tindent\n    four"
    ids = tokenizer(s)["input_ids"]
    assert tokenizer.decode(ids, clean_up_tokenization_spaces=False) == s


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=0, max_size=60))
def test_any_utf8_round_trips(raw_tokenizer, s):
    enc = raw_tokenizer.encode(s, add_special_tokens=False)
    assert raw_tokenizer.decode(enc.ids, skip_special_tokens=False) == s


def test_concurrent_creation_is_atomic(tmp_path):
    target = tmp_path / "shared-model"
    code = "import sys; from worker_svc.model.default import ensure_default_model as e; print(e(sys.argv[1]))"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(target)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert set(outs) == {str(target)}
    assert sorted(os.listdir(tmp_path)) == ["shared-model"]  # no temp directories left behind
    assert default.is_complete(target)


def test_default_location_and_refusal_of_partial_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("CODESERVE_MODEL_DIR", str(tmp_path / "env-dir"))
    assert default.default_model_dir() == tmp_path / "env-dir"
    monkeypatch.delenv("CODESERVE_MODEL_DIR")
    assert default.default_model_dir() == default.repo_root() / ".cache" / "default-model"
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="not a complete checkpoint"):
        ensure_default_model(partial)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert default.is_complete(ensure_default_model(empty))


@pytest.mark.parametrize("shape,millions", [("tiny_starcoder_py", 164), ("gpt_bigcode-santacoder", 1125),
                                            ("starcoderbase-1b", 1137), ("starcoderbase-3b", 3043),
                                            ("starcoderbase-7b", 7327), ("starcoder", 15517)])
def test_real_shape_parameter_counts(shape, millions):
    cfg = default.model_config(shape)
    n = sum(math.prod(s) for _, s, _ in default._param_shapes(cfg))
    assert round(n / 1e6) == millions
    assert cfg["multi_query"] and cfg["n_positions"] in (2048, 8192)


def test_real_shape_checkpoint_pads_tokenizer_and_loads(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worker_svc.model.loader import load_model

    out = tmp_path / "tiny-shape"
    out.mkdir()
    write_checkpoint(out, shape="tiny_starcoder_py", dtype="bfloat16",
                     overrides={"n_layer": 1, "n_embd": 64, "n_head": 4, "n_inner": 128, "n_positions": 64})
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == 49152 and tok.convert_tokens_to_ids("<fim_middle>") == 2
    assert tok.decode([49151]) == "<unused_48127>"
    cfg, model = load_model(out, dtype=torch.bfloat16)
    assert cfg.vocab_size == 49152 and cfg.name == "codeserve-tiny_starcoder_py"
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert hf.config.vocab_size == 49152


def test_sharded_write(tmp_path, monkeypatch, model_dir):
    from worker_svc.model.loader import load_model

    monkeypatch.setattr(default, "SHARD_BYTES", 2_000_000)
    out = tmp_path / "sharded"
    out.mkdir()
    write_checkpoint(out)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    _, a = load_model(out)
    _, b = load_model(model_dir)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert default.is_complete(out)
