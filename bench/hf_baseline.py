"""transformers' static-batch ``generate`` on the same checkpoint and workload, and the device's copy
bandwidth, as the side-by-side reference of ``bench/serve_bench.py`` (run in its own process so its
memory is returned before the stack starts).

    python -m bench.hf_baseline --model-path DIR --batch 64 --input-len 1024 --output-len 256 --json-out F

Greedy, ``min_new_tokens = max_new_tokens`` (like ignore_eos), random prompt token ids (seeded), one
warm-up ``generate`` with the same batch and 8 new tokens first. Prints and writes JSON: output tokens/s,
the seconds, the copy bandwidth (bytes/s, read + write), the parameter bytes.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from worker_svc.bench import copy_bandwidth, sync

    dev = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                       ("cpu" if args.device == "auto" else args.device))
    dtype = {"auto": torch.bfloat16 if dev.type == "cuda" else torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16, "float32": torch.float32}[args.dtype]
    bw = copy_bandwidth(dev, (1 << 30) if dev.type == "cuda" else (64 << 20))
    model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=dtype).to(dev).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(100, min(vocab, 1000) if vocab <= 1024 else vocab - 200, (args.batch, args.input_len),
                        generator=g).to(dev)
    mask = torch.ones_like(ids)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, **kw)  # warm-up
        sync(dev)
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=args.output_len, min_new_tokens=args.output_len, **kw)
        sync(dev)
        secs = time.perf_counter() - t0
    new = int((out.shape[1] - args.input_len) * out.shape[0])
    result = {
        "what": "transformers generate, static batch", "transformers": __import__("transformers").__version__,
        "torch": torch.__version__, "device": str(dev), "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "",
        "dtype": str(dtype).replace("torch.", ""), "batch": args.batch, "input_len": args.input_len,
        "output_len": args.output_len, "seconds": round(secs, 3), "output_tokens": new,
        "output_tok_s": round(new / secs, 1), "copy_bandwidth_Bps": bw,
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "attn_implementation": getattr(model.config, "_attn_implementation", ""),
    }
    print(json.dumps(result), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
