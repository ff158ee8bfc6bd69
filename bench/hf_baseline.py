"""transformers' own generation paths on the same checkpoint and workload, as the side-by-side references
of ``bench/serve_bench.py``; each baseline runs in its own process (``serve_bench`` starts one per
baseline, with a time limit) so its memory is returned before the next one starts.

    python -m bench.hf_baseline --baseline static --model-path DIR --batch 64 --input-len 1024 \\
        --output-len 256 --json-out F                        # static cache + torch.compile (CUDA)
    python -m bench.hf_baseline --baseline dynamic ...       # default DynamicCache, sdpa, eager
    python -m bench.hf_baseline --baseline generate_batch --batch 256 ...   # continuous batching

Baselines (all greedy, EOS ignored, random prompt token ids from ``--seed``, all prompts of one length):

- ``static``: ``model.generate(ids, cache_implementation="static", compile_config=CompileConfig(...))``:
  transformers compiles the decode forward itself (``GenerationMixin._valid_auto_compile_criteria``: CUDA and
  a compileable cache; ``CompileConfig`` defaults: inductor, mode ``reduce-overhead`` = CUDA graphs). One
  warm-up ``generate`` of exactly the timed shape (batch, input length, ``max_new_tokens``: the static cache
  and the compiled graphs depend on them), then the timed one. ``compile_seconds`` = warm-up seconds - timed
  seconds (what the first call cost beyond a warm one). Compile requested but not used raises.
- ``dynamic``: ``model.generate`` with the default DynamicCache and attention (sdpa), eager; a warm-up of
  8 new tokens, then the timed one.
- ``generate_batch``: ``model.generate_batch(inputs=list_of_lists, generation_config=GenerationConfig(
  do_sample=False, max_new_tokens=N, eos_token_id=-1), continuous_batching_config=ContinuousBatchingConfig(
  num_blocks=..., max_batch_tokens=...))`` (transformers' continuous batching, paged attention); a warm-up
  call of ``min(8, batch)`` requests x 16 new tokens, then the timed call over all requests at once.
  ``generate_batch`` logs and drops failed requests instead of raising: every request's result is checked
  (present, no error, exactly N tokens) and a missing or short one raises.

``generate`` gets ``min_new_tokens = max_new_tokens`` and ``eos_token_id=None`` (EOS ignored).
Output: JSON (stdout and ``--json-out``) with output tokens/s, seconds, settings, versions, the device copy
bandwidth (bytes/s, read + write), parameter bytes and ``tokens_sha256`` (see ``tokens_digest``). On
failure the JSON has ``ok: false`` and a typed ``error`` (``type``, ``message``, ``stage``: load or run,
``traceback``) and the exit status is 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import traceback

import torch

BASELINES = ("static", "dynamic", "generate_batch")
CB_WARMUP_REQUESTS, CB_WARMUP_NEW_TOKENS = 8, 16


class BaselineError(RuntimeError):
    """A baseline that ran but did not do what was asked (no compile, missing or short outputs)."""


@dataclasses.dataclass(frozen=True)
class GenerateRun:
    """One timed generation.

    ``tokens``: the generated ids, int64 [batch, max_new_tokens] on the CPU. ``seconds``: wall seconds of
    the timed call (device synchronised). ``warmup_seconds``: the warm-up call. ``settings``: what was run
    (JSON-able). ``extra``: measured facts beyond the timing (compile counters, resolved configs).
    """

    tokens: torch.Tensor
    seconds: float
    warmup_seconds: float
    settings: dict
    extra: dict

    @property
    def output_tokens(self) -> int:
        return int(self.tokens.numel())

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def tokens_sha256(self) -> str:
        """sha256 of the generated ids as little-endian int64 [batch, max_new_tokens] (row-major)."""
        return tokens_digest(self.tokens)


def tokens_digest(tokens: torch.Tensor) -> str:
    """sha256 hex of ``tokens`` as contiguous little-endian int64 (compare baselines' outputs by JSON)."""
    import hashlib

    return hashlib.sha256(tokens.to(torch.int64).contiguous().numpy().astype("<i8").tobytes()).hexdigest()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pick_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """``device``: auto | cpu | cuda[:i]; ``dtype``: auto | bfloat16 | float16 | float32 (auto: bf16 on CUDA,
    fp32 on CPU). Raises ValueError for an unknown dtype name."""
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    names = {"auto": torch.bfloat16 if dev.type == "cuda" else torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16, "float32": torch.float32}
    if dtype not in names:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(names)}")
    return dev, names[dtype]


def load_model(model_path: str, device: torch.device, dtype: torch.dtype):
    """The checkpoint as ``AutoModelForCausalLM`` (GPTBigCodeForCausalLM), eval mode, on ``device``."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()


def random_prompts(batch: int, input_len: int, vocab_size: int, seed: int) -> torch.Tensor:
    """int64 [batch, input_len] on the CPU, uniform in [100, 1000) for vocabularies <= 1024 (the default
    model), else [100, vocab_size - 200) (clear of special tokens at either end)."""
    hi = min(vocab_size, 1000) if vocab_size <= 1024 else vocab_size - 200
    return torch.randint(100, hi, (batch, input_len), generator=torch.Generator().manual_seed(seed))


def _dynamo_counts() -> dict:
    """torch.compile's cumulative counters: graph breaks, graphs compiled, CUDA graph skips (a compiled
    graph run without CUDA graphs, e.g. for mutated inputs)."""
    from torch._dynamo.utils import counters

    return {"graph_breaks": int(sum(counters["graph_break"].values())),
            "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "calls_captured": int(counters["stats"].get("calls_captured", 0)),
            "cudagraph_skips": int(counters["inductor"].get("cudagraph_skips", 0))}


def run_generate(model, ids: torch.Tensor, max_new_tokens: int, cache: str, compile: bool) -> GenerateRun:
    """Static-batch ``model.generate``: greedy, ``min_new_tokens = max_new_tokens``, EOS ignored.

    ``ids``: int64 [batch, input_len] (moved to the model's device). ``cache``: "dynamic" (the default
    DynamicCache; warm-up of 8 new tokens) or "static" (``cache_implementation="static"``; warm-up of the
    timed shape). ``compile`` (static only): pass ``compile_config=CompileConfig()`` so generate compiles
    the decode forward; on a device other than CUDA the config is flagged ``_compile_all_devices`` (how
    transformers' own tests compile on CPU). Raises BaselineError when compile was asked for and
    the warm-up compiled no graph (torch._dynamo's ``unique_graphs`` counter did not move), or when the output
    is not [batch, input_len + max_new_tokens]; ValueError for an unknown cache or compile with "dynamic".
    """
    from transformers import CompileConfig

    if cache not in ("dynamic", "static"):
        raise ValueError(f"cache must be 'dynamic' or 'static', got {cache!r}")
    if compile and cache != "static":
        raise ValueError("compile needs the static cache (transformers compiles only with a compileable cache)")
    dev = model.device
    ids = ids.to(dev)
    mask = torch.ones_like(ids)
    kw: dict = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    compile_config = None
    if cache == "static":
        kw["cache_implementation"] = "static"
        if compile:
            compile_config = CompileConfig()
            if dev.type != "cuda":
                compile_config._compile_all_devices = True
            kw["compile_config"] = compile_config
        else:
            kw["disable_compile"] = True
    warm_new = max_new_tokens if cache == "static" else min(8, max_new_tokens)
    extra: dict = {}
    with torch.no_grad():
        before = _dynamo_counts()
        _sync(dev)
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=warm_new, min_new_tokens=warm_new, **kw)
        _sync(dev)
        warm = time.perf_counter() - t0
        after_warm = _dynamo_counts()
        if compile and after_warm["unique_graphs"] == before["unique_graphs"]:
            raise BaselineError("compile_config was given but generate compiled no graph "
                                "(transformers' auto-compile criteria were false: device, cache type)")
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, **kw)
        _sync(dev)
        secs = time.perf_counter() - t0
        after = _dynamo_counts()
    if tuple(out.shape) != (ids.shape[0], ids.shape[1] + max_new_tokens):
        raise BaselineError(f"generate returned shape {tuple(out.shape)}, expected "
                            f"{(ids.shape[0], ids.shape[1] + max_new_tokens)}")
    if compile:
        extra["dynamo_warmup"] = {k: after_warm[k] - before[k] for k in before}
        extra["dynamo_timed"] = {k: after[k] - after_warm[k] for k in before}
        extra["compile_seconds"] = round(warm - secs, 3)
    settings = {"cache_implementation": cache, "compiled": compile, "warmup_new_tokens": warm_new,
                "compile_config": compile_config.to_dict() if compile_config is not None else None,
                "attn_implementation": getattr(model.config, "_attn_implementation", "")}
    return GenerateRun(out[:, ids.shape[1]:].cpu(), secs, warm, settings, extra)


def cb_config(num_blocks: int | None, max_batch_tokens: int | None):
    """A ``ContinuousBatchingConfig`` with the two sizes (None: transformers infers it from free memory,
    which needs psutil on a CPU), everything else at transformers' defaults (page size 256, named
    ``block_size`` in 5.17 and ``page_size`` from 5.24 on; FIFO scheduler; CUDA graphs and async batching
    decided by transformers: off with paged sdpa, which needs an attention mask)."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    return ContinuousBatchingConfig(num_blocks=num_blocks, max_batch_tokens=max_batch_tokens)


def _resolved_cb_config(model) -> dict:
    """The cached manager's resolved continuous-batching config (sizes, CUDA graphs, async), JSON-able."""
    manager = getattr(model, "_cached_continuous_batching_manager", None)
    if manager is None:
        raise BaselineError("generate_batch(persistent_manager=True) left no cached manager to read")
    cfg = manager.continuous_batching_config
    keys = ("block_size", "page_size", "num_blocks", "max_batch_tokens", "max_requests_per_batch",
            "max_blocks_per_request", "use_cuda_graph", "use_async_batching", "max_memory_percent", "scheduler_type")
    out = {k: getattr(cfg, k) for k in keys if hasattr(cfg, k)}
    out["use_cuda_graph"] = list(out["use_cuda_graph"]) if isinstance(out.get("use_cuda_graph"), tuple) else out.get("use_cuda_graph")
    return out


def _check_cb_outputs(results: dict, n: int, max_new_tokens: int) -> torch.Tensor:
    """int64 [n, max_new_tokens] from generate_batch's ordered results; raises BaselineError naming the
    missing, failed or short requests (generate_batch only logs them)."""
    if len(results) != n:
        raise BaselineError(f"generate_batch returned {len(results)} results for {n} requests")
    bad = [(rid, r.error, len(r.generated_tokens)) for rid, r in results.items()
           if r.error is not None or len(r.generated_tokens) != max_new_tokens]
    if bad:
        raise BaselineError(f"generate_batch: {len(bad)} of {n} requests failed or are not {max_new_tokens} tokens "
                            f"long, first: {bad[:3]}")
    return torch.tensor([list(r.generated_tokens) for r in results.values()], dtype=torch.int64)


def run_generate_batch(model, prompts: list[list[int]], max_new_tokens: int, num_blocks: int | None = None,
                       max_batch_tokens: int | None = None) -> GenerateRun:
    """Continuous batching: ``model.generate_batch`` over all ``prompts`` at once, greedy, EOS disabled
    (``eos_token_id=-1``), exactly ``max_new_tokens`` each. A warm-up call (``min(8, n)`` prompts, 16 new
    tokens) first; the timed call keeps its manager (``persistent_manager=True``) only to read the resolved
    config, which is then destroyed. Raises BaselineError for missing, failed or short results."""
    from transformers import GenerationConfig

    gen = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=-1, pad_token_id=0)
    warm_gen = GenerationConfig(do_sample=False, max_new_tokens=CB_WARMUP_NEW_TOKENS, eos_token_id=-1, pad_token_id=0)
    dev = model.device
    warm_n = min(CB_WARMUP_REQUESTS, len(prompts))
    _sync(dev)
    t0 = time.perf_counter()
    warm_res = model.generate_batch(inputs=prompts[:warm_n], generation_config=warm_gen,
                                    continuous_batching_config=cb_config(num_blocks, max_batch_tokens))
    _sync(dev)
    warm = time.perf_counter() - t0
    _check_cb_outputs(warm_res, warm_n, CB_WARMUP_NEW_TOKENS)
    t0 = time.perf_counter()
    try:
        res = model.generate_batch(inputs=prompts, generation_config=gen, persistent_manager=True,
                                   continuous_batching_config=cb_config(num_blocks, max_batch_tokens))
        _sync(dev)
        secs = time.perf_counter() - t0
        resolved = _resolved_cb_config(model)
    finally:
        model.destroy_cached_continuous_batching_manager()
    tokens = _check_cb_outputs(res, len(prompts), max_new_tokens)
    settings = {"num_blocks_arg": num_blocks, "max_batch_tokens_arg": max_batch_tokens,
                "warmup_requests": warm_n, "warmup_new_tokens": CB_WARMUP_NEW_TOKENS,
                "attn_implementation_loaded": getattr(model.config, "_attn_implementation", "")}
    return GenerateRun(tokens, secs, warm, settings, {"resolved_cb_config": resolved})


def cb_blocks_for(batch: int, input_len: int, output_len: int, page: int = 256) -> int:
    """KV pages for ``batch`` requests of ``input_len + output_len`` tokens at ``page`` tokens a page, plus
    spare pages (a quarter of that, at least one per request): all requests fit at once with >= 20% of the
    pages free, above the FIFO scheduler's safety margin (no new prefill below 15% free), and the KV-read
    budget of a batch (all pages' tokens) exceeds every request's KV together, so the size never holds
    requests back."""
    need = batch * math.ceil((input_len + output_len) / page)
    return need + max(batch, math.ceil(need / 4))


def _error(stage: str, exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "message": str(exc)[:4000], "stage": stage,
            "traceback": "".join(traceback.format_exception(exc))[-6000:]}


def run_baseline(args) -> dict:
    """Runs one baseline from parsed CLI args; returns the result dict (``ok`` true or a typed ``error``)."""
    from worker_svc.bench import copy_bandwidth

    import transformers

    dev, dtype = pick_device_dtype(args.device, args.dtype)
    result: dict = {"baseline": args.baseline, "ok": False, "transformers": transformers.__version__,
                    "torch": torch.__version__, "device": str(dev),
                    "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "",
                    "dtype": str(dtype).replace("torch.", ""), "batch": args.batch, "input_len": args.input_len,
                    "output_len": args.output_len, "seed": args.seed}
    stage = "load"
    try:
        t0 = time.perf_counter()
        result["copy_bandwidth_Bps"] = copy_bandwidth(dev, (1 << 30) if dev.type == "cuda" else (64 << 20))
        model = load_model(args.model_path, dev, dtype)
        result["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        result["load_seconds"] = round(time.perf_counter() - t0, 3)
        ids = random_prompts(args.batch, args.input_len, model.config.vocab_size, args.seed)
        stage = "run"
        if args.baseline == "generate_batch":
            num_blocks = args.cb_num_blocks if args.cb_num_blocks is not None else \
                cb_blocks_for(args.batch, args.input_len, args.output_len)
            run = run_generate_batch(model, ids.tolist(), args.output_len, num_blocks, args.cb_max_batch_tokens)
        else:
            run = run_generate(model, ids, args.output_len, args.baseline, compile=args.baseline == "static" and args.compile)
    except Exception as exc:  # reported as a typed error entry in the JSON, and a non-zero exit status
        result["error"] = _error(stage, exc)
        return result
    result.update(ok=True, seconds=round(run.seconds, 3), warmup_seconds=round(run.warmup_seconds, 3),
                  output_tokens=run.output_tokens, output_tok_s=round(run.output_tok_s, 1),
                  tokens_sha256=run.tokens_sha256, settings=run.settings, **run.extra)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", choices=BASELINES, required=True)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--batch", type=int, default=64, help="prompts in the static batch / requests for generate_batch")
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-compile", dest="compile", action="store_false",
                    help="static: static cache without torch.compile (the CPU test's path)")
    ap.add_argument("--cb-num-blocks", type=int, default=None,
                    help="generate_batch KV pages (default: cb_blocks_for: every request's pages + >= 20%% spare)")
    ap.add_argument("--cb-max-batch-tokens", type=int, default=8192,
                    help="generate_batch tokens per forward (transformers' own default when it infers the sizes)")
    ap.add_argument("--json-out")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = run_baseline(args)
    print(json.dumps({k: v for k, v in result.items() if k != "error"} | (
        {"error": {k: v for k, v in result["error"].items() if k != "traceback"}} if "error" in result else {})), flush=True)
    if "error" in result:
        print(result["error"]["traceback"], file=sys.stderr, flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    sys.exit(0 if main().get("ok") else 1)
