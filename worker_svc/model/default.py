"""The embedded default GPTBigCode checkpoint, and random-weight checkpoints of real model shapes.

``ensure_default_model(path=None)`` writes (once) a deterministic small GPTBigCode checkpoint in
Hugging Face format that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load:

- config.json (model_type gpt_bigcode, multi-query attention, n_positions 4096),
- model.safetensors (fp32; the default shape's weights come from the shipped trained asset
  ``assets/default-weights.safetensors`` (fp16, made by ``train_default.py`` on the embedded code corpus),
  any other shape gets seeded random weights),
- tokenizer.json (byte-level BPE trained deterministically on ``corpus.CORPUS`` with StarCoder's special
  tokens first: ``<|endoftext|>`` is id 0), tokenizer_config.json, special_tokens_map.json,
- generation_config.json (eos 0),
- codeserve-stamp.json (a content stamp: a directory of ours with another stamp is stale and is replaced).

CLI::

    python -m worker_svc.model.default --out DIR
    python -m worker_svc.model.default --out DIR --shape starcoderbase-1b --dtype bfloat16 [--device cuda]

Writes are atomic: everything goes to a temporary sibling directory that is renamed into place, so two
processes calling this at once both end up with one complete checkpoint. A stale directory (written by an
older version: stamp missing or different) is swapped for a fresh one under a lock file, with an atomic
directory exchange (Linux ``renameat2(RENAME_EXCHANGE)``), so readers see the old or the new checkpoint.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import pathlib
import shutil
import tempfile

import torch
from safetensors.torch import save_file

from worker_svc.model import dir_swap
from worker_svc.model.corpus import CORPUS

ASSET = pathlib.Path(__file__).resolve().parent / "assets" / "default-weights.safetensors"
STAMP_FILE = "codeserve-stamp.json"
FORMAT_VERSION = 2  # bump when the written files change for reasons the stamp's inputs do not cover

# StarCoder's special tokens, in StarCoder's id order (ids 0..18).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<fim_prefix>",
    "<fim_middle>",
    "<fim_suffix>",
    "<fim_pad>",
    "<filename>",
    "<gh_stars>",
    "<issue_start>",
    "<issue_comment>",
    "<issue_closed>",
    "<jupyter_start>",
    "<jupyter_text>",
    "<jupyter_code>",
    "<jupyter_output>",
    "<empty_output>",
    "<commit_before>",
    "<commit_msg>",
    "<commit_after>",
    "<reponame>",
)

DEFAULT_VOCAB_SIZE = 1024
DEFAULT_SEED = 20261129
FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")

# The default model: tiny, multi-query, head_dim 64 (a size flashinfer's kernels support).
DEFAULT_CONFIG: dict = {
    "n_embd": 256,
    "n_layer": 2,
    "n_head": 4,
    "n_inner": 1024,
    "n_positions": 4096,
    "multi_query": True,
    "activation_function": "gelu_pytorch_tanh",
}

# Public config facts of real GPTBigCode models (their weights are not reachable here: random weights).
SHAPES: dict[str, dict] = {
    "default": DEFAULT_CONFIG,
    "tiny_starcoder_py": {"n_embd": 768, "n_layer": 20, "n_head": 12, "n_inner": 3072, "n_positions": 8192,
                          "multi_query": True, "activation_function": "gelu_pytorch_tanh", "vocab_size": 49152},
    "gpt_bigcode-santacoder": {"n_embd": 2048, "n_layer": 24, "n_head": 16, "n_inner": 8192, "n_positions": 2048,
                               "multi_query": True, "activation_function": "gelu_pytorch_tanh", "vocab_size": 49280},
    "starcoderbase-1b": {"n_embd": 2048, "n_layer": 24, "n_head": 16, "n_inner": 8192, "n_positions": 8192,
                         "multi_query": True, "activation_function": "gelu_pytorch_tanh", "vocab_size": 49152},
    "starcoderbase-3b": {"n_embd": 2816, "n_layer": 36, "n_head": 22, "n_inner": 11264, "n_positions": 8192,
                         "multi_query": True, "activation_function": "gelu_pytorch_tanh", "vocab_size": 49152},
    "starcoderbase-7b": {"n_embd": 4096, "n_layer": 42, "n_head": 32, "n_inner": 16384, "n_positions": 8192,
                         "multi_query": True, "activation_function": "gelu_pytorch_tanh", "vocab_size": 49152},
    "starcoder": {"n_embd": 6144, "n_layer": 40, "n_head": 48, "n_inner": 24576, "n_positions": 8192,
                  "multi_query": True, "activation_function": "gelu_pytorch_tanh", "vocab_size": 49152},
}

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SHARD_BYTES = 2 * 1024**3


def repo_root() -> pathlib.Path:
    """The repository root (the directory holding ``worker_svc/``)."""
    return pathlib.Path(__file__).resolve().parents[2]


def default_model_dir() -> pathlib.Path:
    """``$CODESERVE_MODEL_DIR`` if set, else ``<repo>/.cache/default-model``."""
    env = os.environ.get("CODESERVE_MODEL_DIR")
    return pathlib.Path(env) if env else repo_root() / ".cache" / "default-model"


def build_tokenizer_json(vocab_size: int = DEFAULT_VOCAB_SIZE) -> str:
    """Trains the byte-level BPE tokenizer on the embedded corpus; returns tokenizer.json text.

    Deterministic (same text for the same ``tokenizers`` version). Special tokens take ids 0..18.
    Raises RuntimeError if the corpus cannot fill ``vocab_size`` entries.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(CORPUS) * 2, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer corpus gave {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok.to_str()


def pad_tokenizer_json(text: str, vocab_size: int) -> str:
    """Extends a BPE tokenizer.json's vocab with unreachable ``<unused_N>`` entries up to ``vocab_size``.

    Used for real-shape checkpoints whose vocab is larger than the embedded tokenizer's: every id a
    random model may sample still decodes to text.
    """
    data = json.loads(text)
    vocab = data["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    i = 0
    while next_id < vocab_size:
        vocab[f"<unused_{i}>"] = next_id
        next_id += 1
        i += 1
    return json.dumps(data, ensure_ascii=False)


def model_config(shape: str = "default", vocab_size: int = DEFAULT_VOCAB_SIZE, dtype: str = "float32") -> dict:
    """The config.json dict for ``shape`` (a key of SHAPES). Raises KeyError naming known shapes."""
    if shape not in SHAPES:
        raise KeyError(f"unknown shape {shape!r}; known: {sorted(SHAPES)}")
    s = dict(SHAPES[shape])
    return {
        "architectures": ["GPTBigCodeForCausalLM"],
        "model_type": "gpt_bigcode",
        "vocab_size": s.pop("vocab_size", vocab_size),
        "n_embd": s["n_embd"],
        "n_layer": s["n_layer"],
        "n_head": s["n_head"],
        "n_inner": s["n_inner"],
        "n_positions": s["n_positions"],
        "multi_query": s["multi_query"],
        "activation_function": s["activation_function"],
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "attention_softmax_in_fp32": True,
        "scale_attention_softmax_in_fp32": True,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "use_cache": True,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "tie_word_embeddings": True,
        "torch_dtype": dtype,
        "codeserve_shape": shape,
    }


def _param_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(HF name, shape, init kind) for every parameter of a GPTBigCode config, in HF order."""
    d, inner, v = cfg["n_embd"], cfg["n_inner"], cfg["vocab_size"]
    head_dim = d // cfg["n_head"]
    kv = 1 if cfg["multi_query"] else cfg["n_head"]
    out = [("transformer.wte.weight", (v, d), "wte"), ("transformer.wpe.weight", (cfg["n_positions"], d), "wpe")]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        out += [
            (p + "ln_1.weight", (d,), "ln_w"), (p + "ln_1.bias", (d,), "ln_b"),
            (p + "attn.c_attn.weight", (d + 2 * kv * head_dim, d), "lin"), (p + "attn.c_attn.bias", (d + 2 * kv * head_dim,), "bias"),
            (p + "attn.c_proj.weight", (d, d), "proj"), (p + "attn.c_proj.bias", (d,), "bias"),
            (p + "ln_2.weight", (d,), "ln_w"), (p + "ln_2.bias", (d,), "ln_b"),
            (p + "mlp.c_fc.weight", (inner, d), "lin"), (p + "mlp.c_fc.bias", (inner,), "bias"),
            (p + "mlp.c_proj.weight", (d, inner), "proj"), (p + "mlp.c_proj.bias", (d,), "bias"),
        ]
    out += [("transformer.ln_f.weight", (d,), "ln_w"), ("transformer.ln_f.bias", (d,), "ln_b")]
    return out


# Init std per kind. Larger than GPT-2's 0.02 for the blocks so that random weights give varied greedy
# continuations instead of echoing the last token through the tied LM head.
INIT_STD = {"wte": 0.1, "wpe": 0.1, "lin": 0.2, "proj": 0.3, "bias": 0.02}


def random_weights(cfg: dict, seed: int, dtype: torch.dtype, device: str = "cpu"):
    """Yields (name, tensor) for seeded random weights of ``cfg``; deterministic per (seed, device)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, shape, kind in _param_shapes(cfg):
        if kind == "ln_w":
            t = torch.ones(shape, device=device) + 0.1 * torch.randn(shape, generator=gen, device=device)
        elif kind == "ln_b":
            t = 0.05 * torch.randn(shape, generator=gen, device=device)
        else:
            std = INIT_STD[kind]
            if kind in ("lin", "proj"):
                std = std * (256 / shape[1]) ** 0.5  # keep activations' scale as width grows
            t = std * torch.randn(shape, generator=gen, device=device)
        yield name, t.to(dtype).contiguous()


@functools.lru_cache(maxsize=1)
def _asset_sha256() -> str:
    return hashlib.sha256(ASSET.read_bytes()).hexdigest()


def uses_trained_asset(cfg: dict) -> bool:
    """True when ``cfg`` is the default shape and its parameter shapes equal the shipped asset's.

    Raises FileNotFoundError if the asset is missing (a broken install, not a reason to fall back).
    """
    from safetensors import safe_open

    if cfg.get("codeserve_shape") != "default":
        return False
    with safe_open(str(ASSET), framework="pt") as f:
        have = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    return have == {name: shape for name, shape, _ in _param_shapes(cfg)}


def trained_weights(cfg: dict, dtype: torch.dtype):
    """Yields (name, tensor) of the shipped trained asset (fp16) cast to ``dtype``, in HF order.

    Raises ValueError if ``cfg``'s parameter shapes differ from the asset's.
    """
    from safetensors.torch import load_file

    if not uses_trained_asset(cfg):
        raise ValueError(f"config does not match the trained asset {ASSET}")
    state = load_file(str(ASSET))
    for name, _, _ in _param_shapes(cfg):
        yield name, state[name].to(dtype).contiguous()


def checkpoint_stamp(cfg: dict, seed: int) -> str:
    """Hex sha256 naming the content ``write_checkpoint`` writes for ``cfg`` (config, tokenizer corpus,
    weights source: the asset's bytes or the seed)."""
    weights = f"asset:{_asset_sha256()}" if uses_trained_asset(cfg) else f"random:{seed}:{sorted(INIT_STD.items())}"
    blob = json.dumps({"format": FORMAT_VERSION, "config": cfg, "corpus": list(CORPUS), "weights": weights},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def _write_weights(out: pathlib.Path, cfg: dict, seed: int, dtype: torch.dtype, device: str) -> None:
    tensors = trained_weights(cfg, dtype) if uses_trained_asset(cfg) else random_weights(cfg, seed, dtype, device)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    total = 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t.cpu()
        size += nbytes
        total += nbytes
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata=meta)
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata=meta)
        weight_map.update({k: fname for k in shard})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True)
    )


def _tokenizer_config() -> dict:
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_prefix_space": False,
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "pad_token": None,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
        "added_tokens_decoder": added,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
    }


def write_checkpoint(out: pathlib.Path, shape: str = "default", dtype: str = "float32", seed: int = DEFAULT_SEED,
                     device: str = "cpu", overrides: dict | None = None) -> pathlib.Path:
    """Writes a complete checkpoint into the (existing, empty) directory ``out``; returns ``out``.

    ``overrides`` replaces config.json entries (e.g. ``{"multi_query": False, "activation_function": "gelu"}``
    for test variants); the weights follow the resulting shapes: the trained asset when the shape is
    "default" and the parameter shapes match it (``seed`` unused), else seeded random weights.
    Also writes STAMP_FILE (``checkpoint_stamp``).
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPES)}")
    cfg = model_config(shape, dtype=dtype)
    cfg.update(overrides or {})
    tok_json = build_tokenizer_json(DEFAULT_VOCAB_SIZE)
    if cfg["vocab_size"] != DEFAULT_VOCAB_SIZE:
        tok_json = pad_tokenizer_json(tok_json, cfg["vocab_size"])
    tc = _tokenizer_config()
    tc["model_max_length"] = cfg["n_positions"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "tokenizer.json").write_text(tok_json)
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
         "additional_special_tokens": list(SPECIAL_TOKENS[1:])}, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": 0, "do_sample": False}, indent=2, sort_keys=True) + "\n")
    _write_weights(out, cfg, seed, DTYPES[dtype], device)
    (out / STAMP_FILE).write_text(json.dumps({"stamp": checkpoint_stamp(cfg, seed)}, indent=2) + "\n")
    return out


def is_complete(path: pathlib.Path) -> bool:
    """True when ``path`` holds config, tokenizer and weights (single file or sharded index)."""
    have_weights = (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()
    return have_weights and all((path / f).is_file() for f in FILES)


def read_stamp(path: pathlib.Path) -> str | None:
    """The stamp in ``path``/STAMP_FILE, or None when the file is absent (a checkpoint from before stamps)."""
    f = path / STAMP_FILE
    return json.loads(f.read_text())["stamp"] if f.is_file() else None


def _written_shape(path: pathlib.Path) -> str | None:
    """config.json's ``codeserve_shape`` (set only by ``write_checkpoint``), None for other checkpoints."""
    return json.loads((path / "config.json").read_text()).get("codeserve_shape")


def _write_temp_sibling(target: pathlib.Path, shape: str, dtype: str, device: str) -> pathlib.Path:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write_checkpoint(tmp, shape=shape, dtype=dtype, device=device)
        for f in tmp.iterdir():  # mkdtemp makes 0700; readers may run as other users (containers)
            f.chmod(0o644)
        tmp.chmod(0o755)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _replace_stale(target: pathlib.Path, want: str, shape: str, dtype: str, device: str) -> None:
    """Swaps the stale checkpoint ``target`` for a fresh one; one writer at a time (lock file next to it),
    readers see the old or the new directory (``dir_swap.exchange``)."""
    with dir_swap.locked(target.parent / f".{target.name}.lock"):
        if read_stamp(target) == want:  # another process replaced it while we waited
            return
        tmp = _write_temp_sibling(target, shape, dtype, device)
        try:
            dir_swap.exchange(target, tmp)  # tmp now holds the stale checkpoint
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def ensure_default_model(path: str | os.PathLike | None = None, shape: str = "default", dtype: str = "float32",
                         device: str = "cpu") -> pathlib.Path:
    """Returns a directory holding the checkpoint, writing it first if missing or stale.

    ``path`` defaults to ``default_model_dir()``. Atomic: written into a temporary sibling directory and
    renamed into place; if another process wins the race its (identical) checkpoint is kept. A complete
    checkpoint written by ``write_checkpoint`` for the same ``shape`` whose stamp differs from the current
    one (older weights, tokenizer corpus or format) is replaced atomically (see ``_replace_stale``); a
    complete checkpoint not written by us (no ``codeserve_shape``), or of another shape, is returned as is.
    Raises FileExistsError if ``path`` exists, is non-empty and is not a complete checkpoint.
    """
    target = pathlib.Path(path) if path is not None else default_model_dir()
    target = target.resolve()
    if is_complete(target):
        if _written_shape(target) == shape:
            cfg = model_config(shape, dtype=dtype)
            want = checkpoint_stamp(cfg, DEFAULT_SEED)
            if read_stamp(target) != want:
                _replace_stale(target, want, shape, dtype, device)
        return target
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} exists and is not a complete checkpoint (config.json, tokenizer, weights)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_temp_sibling(target, shape, dtype, device)
    try:
        try:
            os.rename(tmp, target)  # atomic; replaces an empty directory
        except OSError:
            if not is_complete(target):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> None:
    """CLI: writes the checkpoint to --out (default: the default model directory) and prints its path."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="target directory (default $CODESERVE_MODEL_DIR or <repo>/.cache/default-model)")
    ap.add_argument("--shape", default="default", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--device", default="cpu", help="device that generates the random weights (cuda is faster for big shapes)")
    args = ap.parse_args(argv)
    print(ensure_default_model(args.out, shape=args.shape, dtype=args.dtype, device=args.device))


if __name__ == "__main__":
    main()
