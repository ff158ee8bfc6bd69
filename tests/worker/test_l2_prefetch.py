"""The next projection's weights read into L2 in captured decode graphs (worker_svc/model/l2_prefetch.py).

On the CPU: the model tells the prefetcher of every projection in step order, and once at the end, only when it is
active. On the GPU: a served model with the prefetch decodes exactly as without it (the read changes no arithmetic:
the same kernels on the same inputs), and a capture that skipped a projection read ahead raises."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.worker.helpers import Driver, Req
from worker_svc.build import make_backend, make_graphs
from worker_svc.engine import Engine
from worker_svc.kv_pool import KVPool, geometry
from worker_svc.model.l2_prefetch import WeightPrefetch
from worker_svc.model.loader import load_model

GPU = torch.cuda.is_available() and importlib.util.find_spec("triton") and importlib.util.find_spec("flashinfer")
needs_gpu = pytest.mark.skipif(not GPU, reason="needs CUDA, Triton and flashinfer (run on the accelerator machine)")


class Recorder:
    """Stands in for WeightPrefetch: records the calls the model makes."""

    def __init__(self, on: bool):
        self.on, self.calls = on, []

    def active(self, rows: int) -> bool:
        return self.on

    def at(self, j: int, rows: int) -> None:
        self.calls.append(("at", j, rows))

    def end(self, rows: int) -> None:
        self.calls.append(("end", rows))


@pytest.mark.parametrize("on", [True, False])
def test_the_model_tells_each_projection_in_step_order(model_dir, on):
    cfg, model = load_model(model_dir, dtype=torch.float32, device=torch.device("cpu"))
    pool = KVPool(cfg, geometry(cfg, torch.float32, kv_tokens=64), torch.float32, torch.device("cpu"))
    backend = make_backend("torch", cfg, torch.float32, torch.device("cpu"))
    rec = Recorder(on)
    model.prefetch = rec
    eng = Engine(cfg, model, pool, backend, epoch="cpu", model_path=str(model_dir))
    Driver(eng, chunk=8).run([Req("r0", [1, 2, 3], 2)])
    if not on:
        assert rec.calls == []
        return
    forwards = [i for i, c in enumerate(rec.calls) if c[0] == "end"]
    assert len(forwards) >= 2  # the extend and at least one decode step
    start = 0
    for stop in forwards:  # each Forward: at(0 .. 4 n_layer - 1) in order, then end, all with the batch's rows
        one = rec.calls[start:stop + 1]
        rows = one[-1][1]
        assert one == [("at", j, rows) for j in range(4 * cfg.n_layer)] + [("end", rows)]
        start = stop + 1


@needs_gpu
def test_a_capture_that_skips_a_projection_read_ahead_raises():
    w = [torch.zeros(256, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    pf = WeightPrefetch(w, max_rows=8)
    pf.warm()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"projections \[1\]"):
        with torch.cuda.graph(g):
            pf.at(0, 4)  # forks the read of projection 1, which never runs
            pf.end(4)


def _engine(model_dir, prefetch_rows: int):
    dev, dtype = torch.device("cuda:0"), torch.bfloat16
    cfg, model = load_model(model_dir, dtype=dtype, device=dev)
    model.use_fused_kernels(pdl=True)
    model.use_weight_prefetch(prefetch_rows)
    assert (model.prefetch is not None) == (prefetch_rows > 0)
    backend = make_backend("flashinfer", cfg, dtype, dev, 8)
    pool = KVPool(cfg, geometry(cfg, dtype, kv_tokens=16384), dtype, dev)
    eng = Engine(cfg, model, pool, backend, epoch="gpu", model_path=str(model_dir))
    eng.warmup()
    eng.graphs = make_graphs(8, cfg, model, pool, backend)
    return eng


@needs_gpu
def test_served_model_with_the_prefetch_decodes_exactly_as_without(model_dir, prompts):
    outs = {}
    for rows in (0, 4):  # buckets 1, 2, 4 read ahead; 8 does not
        reqs = [Req(f"r{i}", p, 16) for i, p in enumerate(prompts)]
        Driver(_engine(model_dir, rows), chunk=8).run(reqs)
        outs[rows] = [(r.out, r.logprobs) for r in reqs]
    assert outs[4] == outs[0]
