"""Trains the default GPTBigCode (``default.DEFAULT_CONFIG``, vocab 1024) on the embedded code corpus.

The result is the shipped asset ``worker_svc/model/assets/default-weights.safetensors`` (fp16, the HF
parameter names; the LM head is tied to ``transformer.wte.weight``). ``default.ensure_default_model``
writes the fp32 checkpoint from it. Regenerate with::

    python -m worker_svc.model.train_default --out worker_svc/model/assets/default-weights.safetensors

Deterministic: fixed seeds, a fixed number of steps (not a wall-clock budget), a fixed thread count and
``torch.use_deterministic_algorithms(True)``: the same torch version on the same CPU ISA gives the same
bytes. 1200 steps of 8 x 512 tokens (bf16 autocast, fp32 master weights); windows of 512 tokens so that a FIM
copy of a document (up to ~450 tokens) fits whole, middle included. About 5 minutes on 2 idle CPU cores, longer
when other processes share the cores. Memorizing the corpus is the goal: greedy continuations of
``def fibonacci(n):``, ``import os``, ``SELECT `` look like code, and documents end with ``<|endoftext|>``;
with StarCoder's FIM transformation (``fim_variants``) the model also fills a middle between a prefix and a
suffix (PSM and SPM).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import pathlib
import time

import torch

STEPS = 1200
BATCH = 8
SEQ_LEN = 512
LR = 4e-3
WARMUP = 30
SPLIT_P = 0.06  # share of space-prefixed tokens split into "Ġ" + rest (prompts ending with a space)
SEED = 20261129
THREADS = 2
# StarCoder's FIM transformation (bigcode Megatron-LM ``permute``): a document is cut at two character
# positions drawn uniformly into prefix / middle / suffix with probability FIM_RATE, then laid out as PSM
# (<fim_prefix> prefix <fim_suffix> suffix <fim_middle> middle) or, with probability FIM_SPM_RATE, as SPM
# (<fim_prefix> <fim_suffix> suffix <fim_middle> prefix middle); the parts are tokenized separately.
# FIM_VARIANTS cuts are drawn per document once (seeded), each occurrence in a batch picks one of them (enough
# that the model learns to fill any cut, not a few memorized ones).
FIM_RATE = 0.5
FIM_SPM_RATE = 0.5
FIM_VARIANTS = 256


def corpus_token_stream(tokenizer_json: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(all training documents' ids concatenated (int64 [N]), per-document id tensors).

    Every document ends with ``<|endoftext|>`` (id 0), so the model learns to stop.
    """
    from tokenizers import Tokenizer

    from worker_svc.model.corpus import training_documents

    tok = Tokenizer.from_str(tokenizer_json)
    docs = [torch.tensor(tok.encode(d, add_special_tokens=False).ids, dtype=torch.long) for d in training_documents()]
    for d in docs:
        if int(d[-1]) != 0:
            raise ValueError("a training document does not end with <|endoftext|>")
    return torch.cat(docs), docs


def fim_variants(tokenizer_json: str, gen: torch.Generator) -> list[list[torch.Tensor]]:
    """Per training document, FIM_VARIANTS FIM-transformed copies (int64 id tensors ending with
    ``<|endoftext|>``); an empty list for the documents that already are FIM examples.

    Marker ids come from the tokenizer (``<fim_prefix>``, ``<fim_suffix>``, ``<fim_middle>``). Each copy: two
    character cuts drawn uniformly in [0, len(text)], PSM or (with probability FIM_SPM_RATE) SPM, as in
    StarCoder's training (bigcode Megatron-LM). Raises KeyError if the tokenizer lacks a marker.
    """
    from tokenizers import Tokenizer

    from worker_svc.model.corpus import training_documents

    tok = Tokenizer.from_str(tokenizer_json)
    pre, mid, suf = (tok.token_to_id(t) for t in ("<fim_prefix>", "<fim_middle>", "<fim_suffix>"))
    eos = tok.token_to_id("<|endoftext|>")
    if None in (pre, mid, suf, eos):
        raise KeyError("the default tokenizer lacks a FIM marker or <|endoftext|>")

    out: list[list[torch.Tensor]] = []
    for doc in training_documents():
        text = doc[: -len("<|endoftext|>")]
        if "<fim_prefix>" in text:
            out.append([])
            continue
        cuts = [sorted(torch.randint(len(text) + 1, (2,), generator=gen).tolist()) for _ in range(FIM_VARIANTS)]
        spm = (torch.rand(FIM_VARIANTS, generator=gen) < FIM_SPM_RATE).tolist()
        parts = [p for a, b in cuts for p in (text[:a], text[a:b], text[b:])]
        ids = [e.ids for e in tok.encode_batch(parts, add_special_tokens=False)]
        variants = []
        for k in range(FIM_VARIANTS):
            prefix, middle, suffix = ids[3 * k], ids[3 * k + 1], ids[3 * k + 2]
            if spm[k]:
                seq = [pre, suf] + suffix + [mid] + prefix + middle
            else:
                seq = [pre] + prefix + [suf] + suffix + [mid] + middle
            variants.append(torch.tensor(seq + [eos], dtype=torch.long))
        out.append(variants)
    return out


def space_split_map(tokenizer_json: str) -> tuple[int, torch.Tensor]:
    """(id of the lone-space token "Ġ", int64 [vocab]: for a token "Ġrest" whose "rest" is a token too, the id of
    "rest", else -1). Used to teach that "SELECT" "Ġ" "id" means "SELECT" "Ġid": a prompt ending with a space
    ("SELECT ") tokenizes to a lone "Ġ" that the corpus alone never shows before a word."""
    vocab = json.loads(tokenizer_json)["model"]["vocab"]
    out = torch.full((max(vocab.values()) + 1,), -1, dtype=torch.long)
    for piece, i in vocab.items():
        if piece.startswith("\u0120") and len(piece) > 1 and piece[1:] in vocab:
            out[i] = vocab[piece[1:]]
    return vocab["\u0120"], out


def _batch(docs: list[torch.Tensor], fims: list[list[torch.Tensor]], gen: torch.Generator, batch: int,
           seq_len: int, split: tuple[int, torch.Tensor]) -> torch.Tensor:
    """[batch, seq_len + 1] windows of a freshly shuffled concatenation of the documents, each document
    replaced by one of its FIM copies (``fim_variants``) with probability FIM_RATE.

    Half of the rows start exactly at a document start (position 0 = start of text, as prompts are).
    SPLIT_P of the splittable space-prefixed tokens are split in two (``space_split_map``).
    """
    space_id, split_map = split
    rows = []
    for b in range(batch):
        order = torch.randperm(len(docs), generator=gen).tolist()
        use_fim = (torch.rand(len(docs), generator=gen) < FIM_RATE).tolist()
        pick = torch.randint(FIM_VARIANTS, (len(docs),), generator=gen).tolist()
        chosen = [fims[i][pick[i]] if use_fim[i] and fims[i] else docs[i] for i in order]
        stream = torch.cat(chosen)
        if b % 2 == 0:
            starts = torch.cumsum(torch.tensor([0] + [d.numel() for d in chosen[:-1]]), 0)
            ok = starts[starts <= stream.numel() - seq_len - 1]
            s = int(ok[torch.randint(ok.numel(), (1,), generator=gen)])
        else:
            s = int(torch.randint(stream.numel() - seq_len, (1,), generator=gen))
        row = stream[s: s + seq_len + 1]
        rest = split_map[row]
        cut = (rest >= 0) & (torch.rand(row.shape, generator=gen) < SPLIT_P)
        out: list[int] = []
        for t, r, c in zip(row.tolist(), rest.tolist(), cut.tolist()):
            out.extend((space_id, r) if c else (t,))
        rows.append(torch.tensor(out[: seq_len + 1]))
    return torch.stack(rows)


def train(steps: int = STEPS, batch: int = BATCH, seq_len: int = SEQ_LEN, lr: float = LR, seed: int = SEED,
          threads: int = THREADS, log_every: int = 50) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Trains from a seeded init; returns (fp16 state dict in HF names without ``lm_head``, metadata strings)."""
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

    from worker_svc.model.default import DEFAULT_VOCAB_SIZE, build_tokenizer_json, model_config

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    tok_json = build_tokenizer_json(DEFAULT_VOCAB_SIZE)
    _, docs = corpus_token_stream(tok_json)
    split = space_split_map(tok_json)
    fims = fim_variants(tok_json, torch.Generator().manual_seed(seed + 1))
    cfg = model_config("default")
    hf_cfg = GPTBigCodeConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")})
    model = GPTBigCodeForCausalLM(hf_cfg).float()
    model.config._attn_implementation = "sdpa"
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.98), eps=1e-8)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.monotonic()
    loss_val = float("nan")
    for step in range(steps):
        cur = lr * min(1.0, (step + 1) / WARMUP) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for g in opt.param_groups:
            g["lr"] = cur
        x = _batch(docs, fims, gen, batch, seq_len, split)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # fp32 master weights; ~2x faster on CPU
            out = model(input_ids=x[:, :-1], labels=x[:, :-1].clone())
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_val = float(out.loss.detach())
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:4d} loss {loss_val:.4f} lr {cur:.2e} {time.monotonic() - t0:6.1f}s", flush=True)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()
             if not k.startswith("lm_head") and not k.endswith(".attn.bias") and not k.endswith("masked_bias")}
    meta = {"steps": str(steps), "batch": str(batch), "seq_len": str(seq_len), "split_p": str(SPLIT_P),
            "fim_rate": str(FIM_RATE), "fim_spm_rate": str(FIM_SPM_RATE), "fim_variants": str(FIM_VARIANTS), "lr": str(lr), "seed": str(seed),
            "threads": str(threads), "torch": torch.__version__, "final_loss": f"{loss_val:.4f}",
            "tokenizer_sha256": hashlib.sha256(tok_json.encode()).hexdigest()}
    return state, meta


def main(argv: list[str] | None = None) -> None:
    """CLI: trains and writes the fp16 safetensors asset to --out."""
    from safetensors.torch import save_file

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output .safetensors path")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--threads", type=int, default=THREADS)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    state, meta = train(steps=args.steps, threads=args.threads)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # one metadata key: safetensors writes several keys in hash-map order (bytes would vary run to run)
    save_file(state, str(out), metadata={"codeserve_training": json.dumps(meta, sort_keys=True)})
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB) in {time.monotonic() - t0:.1f}s; {meta}")


if __name__ == "__main__":
    main()
