"""Every shape of the family starts on the GPU with CUDA graphs up to the largest batch (issue 14).

For each shape of ``worker_svc.model.default.SHAPES`` (random weights, bf16): the flashinfer backend with
its workspace sized for CUDA-graph decode up to batch 256 (``make_backend`` + ``make_graphs``, as the worker
builds them), one extend of four prompts, multi-step decode on the graphs, and a full decode batch of 256
rows; its greedy tokens are as good, judged by the fp32 model on the same weights, as those of the torch
attention backend run eagerly one step at a time (why not token for token: REGRET_SLACK's comment).
fp32 on the GPU: the 7B shape equals transformers' GPTBigCodeForCausalLM token for token (near-ties aside).
Runs on the accelerator machine only (CUDA + flashinfer); skipped on the CPU CI.
"""

from __future__ import annotations

import gc
import importlib.util

import pytest
import torch

from tests.worker.test_multistep import _run
from worker_svc.attention.torch_ref import TorchAttention
from worker_svc.bench import random_model
from worker_svc.build import make_backend, make_graphs
from worker_svc.engine import Engine
from worker_svc.kv_pool import KVPool, geometry
from worker_svc.model.default import model_config
from worker_svc.types import ForwardItem

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and importlib.util.find_spec("flashinfer")),
                       reason="needs CUDA and flashinfer (run on the accelerator machine)"),
]

FAMILY = ["tiny_starcoder_py", "gpt_bigcode-santacoder", "starcoderbase-1b", "starcoderbase-3b",
          "starcoderbase-7b", "starcoder"]
GRAPH_MAX = 256
MAX_NEW = 24
# Greedy tokens of two bf16 runs cannot be compared token for token on random weights: a deep random model
# turns the last-bit differences of two attention kernels into different first tokens (measured on the H200,
# 2026-12-01: flashinfer and torch attention, both bf16, parted at the first token on 5 of 6 shapes with
# logprob gaps of 0.6-1.3; fp32 ours vs transformers' logprobs differ by 8e-3 on 7B). So each bf16 run is
# scored against the fp32 model on the same weights, teacher-forced: the regret of a chosen token is fp32's
# best logprob minus fp32's logprob of that token (0 when it is fp32's greedy choice; small at a near-tie).
# flashinfer with CUDA graphs must be as good as the torch backend, eager, one step at a time, within the
# noise of 96 tokens: measured on the H200 (2026-12-01) the mean regrets were 1.48 / 1.27 (tiny_starcoder_py,
# flashinfer / torch), 2.45 / 2.95, 2.37 / 2.94, 3.42 / 3.55, 4.44 / 4.89, 5.34 / 5.47 (starcoder).
# A shape that breaks the flashinfer path (workspace, graph capture, a wrong kernel) fails before or here.
REGRET_RATIO, REGRET_SLACK = 1.25, 0.05


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in (300, 77, 1000, 5)]


def _free():
    gc.collect()
    torch.cuda.empty_cache()


def _engine(cfg, model, backend, dtype=torch.bfloat16, kv_tokens=65536) -> Engine:
    pool = KVPool(cfg, geometry(cfg, dtype, kv_tokens=kv_tokens), dtype, "cuda:0")
    return Engine(cfg, model, pool, backend, epoch="epoch-1")


def _torch_backend(cfg) -> TorchAttention:
    return TorchAttention(cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.head_dim ** -0.5 if cfg.scale_attn_weights else 1.0)


def _regrets(eng: Engine, prompts, outs) -> list[float]:
    """Teacher-forced: for each generated token, eng's best logprob minus eng's logprob of that token."""
    free = iter(range(1, eng.kv_pool.pool_slots))
    items = [ForwardItem(request_id=f"t{i}", input_ids=tuple(p + o), position_start=0,
                         slot_ids=tuple(next(free) for _ in p + o), has_prefix=True, return_prompt_logprobs=True,
                         top_logprobs_num=1) for i, (p, o) in enumerate(zip(prompts, outs))]
    res = eng.forward(items, eng.epoch).outputs
    eng.release([it.request_id for it in items])
    regrets = []
    for p, o, r in zip(prompts, outs, res):
        for j in range(len(o)):
            k = len(p) + j - 1  # prompt_logprobs[k] is the logprob of input_ids[k + 1]
            regrets.append(r.prompt_top_logprobs[k][0][1] - r.prompt_logprobs[k])
    return regrets


@pytest.mark.parametrize("shape", FAMILY)
def test_shape_starts_with_graphs_and_decodes_as_well_as_the_torch_backend(shape):
    _free()
    dev, dtype = torch.device("cuda:0"), torch.bfloat16
    cfg, model = random_model(shape, dtype, dev)
    model.use_fused_kernels()  # as the worker serves it (build_engine)
    assert model.fuse_norms
    backend = make_backend("flashinfer", cfg, dtype, dev, GRAPH_MAX)
    eng = _engine(cfg, model, backend)
    eng.warmup()
    eng.graphs = make_graphs(GRAPH_MAX, cfg, model, eng.kv_pool, backend)
    assert eng.graphs.sizes[-1] == GRAPH_MAX
    prompts = _prompts(cfg.vocab_size)
    fi_out, _ = _run(eng, prompts, lambda i, n: 8, max_new=MAX_NEW)

    # a full decode batch at the largest graph: 256 requests of 16 tokens, two 8-step Forwards
    eng.requests.clear()
    free = iter(range(1, eng.kv_pool.pool_slots))
    rows = [torch.randint(1, cfg.vocab_size, (16,), generator=torch.Generator().manual_seed(i)).tolist()
            for i in range(GRAPH_MAX)]
    out = eng.forward([ForwardItem(request_id=f"b{i}", input_ids=tuple(p), position_start=0,
                                   slot_ids=tuple(next(free) for _ in p), has_prefix=True)
                       for i, p in enumerate(rows)], "epoch-1").outputs
    last = [o.next_token_id for o in out]
    for step in range(2):
        items = [ForwardItem(request_id=f"b{i}", input_ids=(last[i],), position_start=16 + 8 * step,
                             slot_ids=tuple(next(free) for _ in range(8)), decode_steps=8) for i in range(GRAPH_MAX)]
        res = eng.forward(items, "epoch-1").outputs
        assert all(len(o.next_token_ids) == 8 and all(0 <= t < cfg.vocab_size for t in o.next_token_ids) for o in res)
        last = [o.next_token_ids[-1] for o in res]
    del eng, backend
    _free()

    model.use_fused_kernels(norms=False, gelu=False)  # the reference: unfused, torch attention, eager
    ref_out, _ = _run(_engine(cfg, model, _torch_backend(cfg), kv_tokens=4096), prompts, lambda i, n: 1,
                      max_new=MAX_NEW)
    _free()
    model.float()  # the same weights, upcast: the fp32 judge, unfused (the torch definition)
    model.use_fused_kernels(norms=False, gelu=False)
    judge = _engine(cfg, model, _torch_backend(cfg), dtype=torch.float32, kv_tokens=4096)
    fi_regret, ref_regret = _regrets(judge, prompts, fi_out), _regrets(judge, prompts, ref_out)
    fi_mean, ref_mean = sum(fi_regret) / len(fi_regret), sum(ref_regret) / len(ref_regret)
    agree = sum(a == b for fa, ra in zip(fi_out, ref_out) for a, b in zip(fa, ra))
    print(f"{shape}: mean regret under fp32, flashinfer + graphs {fi_mean:.4f}, torch backend {ref_mean:.4f}; "
          f"fp32 greedy choices {sum(r < 1e-6 for r in fi_regret)} vs {sum(r < 1e-6 for r in ref_regret)} "
          f"of {len(fi_regret)}; same token {agree}")
    assert all(r >= -1e-4 for r in fi_regret + ref_regret)
    assert fi_mean <= REGRET_RATIO * ref_mean + REGRET_SLACK, (fi_mean, ref_mean)
    del judge, model
    _free()


def _hf_copy(shape: str, model, dev):
    """transformers' GPTBigCodeForCausalLM of ``shape`` holding ``model``'s weights (fp32, on ``dev``)."""
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

    conf = dict(model_config(shape, dtype="float32"))
    conf.pop("architectures", None)
    with torch.device(dev):
        hf = GPTBigCodeForCausalLM(GPTBigCodeConfig(**conf)).to(torch.float32)
    ours = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name != "lm_head.weight":  # tied to transformer.wte.weight
                p.copy_(ours[name])
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()
    return hf.eval()


def test_7b_fp32_on_gpu_equals_transformers():
    _free()
    dev = torch.device("cuda:0")
    cfg, model = random_model("starcoderbase-7b", torch.float32, dev)
    model.use_fused_kernels()  # as build_engine does, fp32 included
    hf = _hf_copy("starcoderbase-7b", model, dev)
    scale = cfg.head_dim ** -0.5 if cfg.scale_attn_weights else 1.0
    pool = KVPool(cfg, geometry(cfg, torch.float32, kv_tokens=4096), torch.float32, dev)
    eng = Engine(cfg, model, pool, TorchAttention(cfg.n_head, cfg.kv_heads, cfg.head_dim, scale), epoch="epoch-1")
    prompts = _prompts(cfg.vocab_size)[:3]
    out, lps = _run(eng, prompts, lambda i, n: 4, max_new=16)
    for p, o, lp in zip(prompts, out, lps):
        with torch.no_grad():
            gen = hf.generate(torch.tensor([p], device=dev), max_new_tokens=16, do_sample=False,
                              return_dict_in_generate=True, output_logits=True, pad_token_id=0)
        ref = gen.sequences[0, len(p):].tolist()
        logs = [torch.log_softmax(lg[0].float(), -1) for lg in gen.logits]
        n = next((i for i, (x, y) in enumerate(zip(o, ref)) if x != y), len(ref))
        # the logprobs of a deep random model in fp32 differ by up to 0.034 between two attention
        # implementations (measured on the H200: 8e-3, 34e-3 on two prompts, with all 16 tokens equal);
        # tokens must agree except at an fp32 near-tie: a first difference where transformers' own logprobs of
        # its token and ours are closer than that measured noise (seen on the H200 with the fused kernels: 15/16
        # on one prompt, parting at token 10 where the two candidates were 0.0107 apart)
        noise = 5e-2
        assert max(abs(a - float(lg[t])) for a, lg, t in zip(lp[:n], logs, ref)) < noise
        if n < len(ref):
            gap = float(logs[n][ref[n]] - logs[n][o[n]])
            assert gap < noise, (n, gap)
        print(f"7b fp32: {n}/{len(ref)} tokens equal to transformers")
    del hf, eng, model
    _free()
