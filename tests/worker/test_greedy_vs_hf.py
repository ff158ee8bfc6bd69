"""Greedy decoding through the engine equals HF ``generate(do_sample=False)`` (fp32 CPU), token for token."""

from __future__ import annotations


import pytest
import torch

from tests.worker.helpers import Driver, Req, hf_greedy, make_engine

MAX_NEW = 24


@pytest.fixture(scope="module")
def hf_refs(hf_model, prompts):
    return [hf_greedy(hf_model, p, MAX_NEW) for p in prompts]


def test_batch_of_one_matches_hf(model_dir, prompts, hf_refs):
    for i, (p, (ref_ids, ref_lps)) in enumerate(zip(prompts, hf_refs)):
        drv = Driver(make_engine(model_dir))
        (r,) = drv.run([Req(f"r{i}", p, MAX_NEW)])
        assert r.out == ref_ids, f"prompt {i}"
        assert max(abs(a - b) for a, b in zip(r.logprobs, ref_lps)) < 1e-4


def test_outputs_are_varied(hf_refs):
    # the default checkpoint must not collapse to one repeated token (the comparison would be weak)
    for ids, _ in hf_refs:
        assert len(set(ids)) >= MAX_NEW // 3


def test_mixed_length_batch_matches_hf(model_dir, prompts, hf_refs):
    drv = Driver(make_engine(model_dir))
    reqs = [Req(f"r{i}", p, MAX_NEW) for i, p in enumerate(prompts)]
    drv.run(reqs)
    for r, (ref_ids, ref_lps) in zip(reqs, hf_refs):
        assert r.out == ref_ids, r.rid
        assert max(abs(a - b) for a, b in zip(r.logprobs, ref_lps)) < 1e-4


def test_staggered_extend_and_decode_share_batches(model_dir, prompts, hf_refs):
    # request i joins at step i, so extend (chunked, 5 tokens) and decode items ride in the same batch
    drv = Driver(make_engine(model_dir), chunk=5)
    reqs = [Req(f"r{i}", p, MAX_NEW) for i, p in enumerate(prompts)]
    step, mixed = 0, 0
    while not all(r.done for r in reqs):
        active = [r for r in reqs[: step + 1] if not r.done]
        kinds = {len(r.tokens) < len(r.prompt) for r in active}
        mixed += kinds == {True, False}
        drv.step(active)
        step += 1
    assert mixed > 0
    for r, (ref_ids, _) in zip(reqs, hf_refs):
        assert r.out == ref_ids, r.rid


def test_prompt_logprobs_match_hf(model_dir, hf_model, prompts):
    from worker_svc.types import ForwardItem

    eng = make_engine(model_dir)
    p = prompts[2]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([p])).logits[0].float(), -1)
    want = [float(ref[i, p[i + 1]]) for i in range(len(p) - 1)]
    # two chunks: the second chunk's first logprob comes from the first chunk's last hidden row
    cut = 9
    got = []
    for start, end, prefix in ((0, cut, True), (cut, len(p), False)):
        it = ForwardItem(request_id="echo", input_ids=tuple(p[start:end]), position_start=start,
                         slot_ids=tuple(range(1 + start, 1 + end)), has_prefix=prefix, sample=end == len(p),
                         return_prompt_logprobs=True, top_logprobs_num=3)
        (o,) = eng.forward([it], eng.epoch).outputs
        assert len(o.prompt_logprobs) == (end - start - 1 if start == 0 else end - start)
        assert len(o.prompt_top_logprobs) == len(o.prompt_logprobs)
        got.extend(o.prompt_logprobs)
        for tops, lp in zip(o.prompt_top_logprobs, o.prompt_logprobs):
            assert tops[0][1] >= lp - 1e-6 and len(tops) == 3
    assert len(got) == len(want)
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4


@pytest.mark.parametrize("text", ["def main():", "def fibonacci(n):\n"])
def test_case_k1_prompts_32_tokens(model_dir, hf_model, tokenizer, text):
    # K1: a wrong K/V head count loads and produces fluent garbage; ids and logprobs must equal HF
    p = tokenizer(text)["input_ids"]
    ref_ids, ref_lps = hf_greedy(hf_model, p, 32)
    (r,) = Driver(make_engine(model_dir)).run([Req("k1", p, 32)])
    assert r.out == ref_ids
    assert max(abs(a - b) for a, b in zip(r.logprobs, ref_lps)) < 1e-4


def test_case_k2_fim_64_tokens(model_dir, hf_model, tokenizer):
    text = ("<fim_prefix>def quick_sort(arr):\n    if len(arr) <= 1:\n        return arr\n    <fim_suffix>\n"
            "    return quick_sort(left) + mid + quick_sort(right)\n<fim_middle>")
    p = tokenizer(text)["input_ids"]
    ref_ids, _ = hf_greedy(hf_model, p, 64)  # stops at <|endoftext|> (id 0) like the driver
    (r,) = Driver(make_engine(model_dir), chunk=16).run([Req("k2", p, 64)])
    assert r.out == ref_ids
    assert len(r.out) == 64 or r.out[-1] == 0
    out_text = tokenizer.decode(r.out, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert "<fim_" not in out_text and "<|endoftext|>" not in out_text


def test_unexpected_engine_fault_is_internal_with_reason(model_dir):
    import grpc

    from codeserve.v1 import worker_pb2, worker_pb2_grpc
    from common import grpc_server
    from worker_svc.service import SERVICE_NAME, add_to_server

    eng = make_engine(model_dir, epoch="e")

    def broken(*a, **k):
        raise RuntimeError("CUDA out of memory (simulated)")

    eng.model.logits = broken  # instance attribute on the shared model, removed in finally
    running = grpc_server.start(lambda s: add_to_server(eng, s), [SERVICE_NAME], "127.0.0.1:0")
    try:
        with grpc_server.channel(f"127.0.0.1:{running.port}") as ch:
            stub = worker_pb2_grpc.WorkerStub(ch)
            item = worker_pb2.ForwardItem(request_id="x", input_ids=[1, 2], position_start=0, slot_ids=[1, 2],
                                          has_prefix=True, sample=True)
            with pytest.raises(grpc.RpcError) as e:
                stub.Forward(worker_pb2.ForwardRequest(expected_epoch="e", items=[item]))
            assert e.value.code() == grpc.StatusCode.INTERNAL and "simulated" in e.value.details()
            assert "x" not in eng.requests  # nothing committed
            assert stub.Info(worker_pb2.InfoRequest()).epoch == "e"
    finally:
        del eng.model.logits
        running.server.stop(0)
