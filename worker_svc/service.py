"""gRPC servicer of ``codeserve.v1.Worker``: protobuf <-> engine types, WorkerError -> status code."""

from __future__ import annotations

import grpc

from codeserve.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from worker_svc.engine import Engine
from worker_svc.sampler import SamplingParams
from worker_svc.types import ForwardItem, ForwardOutput, WorkerError

SERVICE_NAME = "codeserve.v1.Worker"


def sampling_from_proto(p: common_pb2.SamplingParams) -> SamplingParams:
    """Maps the proto's "off" encodings (top_p 0, top_k -1, repetition_penalty 0) to the engine's."""
    return SamplingParams(
        temperature=p.temperature,
        top_p=1.0 if p.top_p == 0.0 else p.top_p,
        top_k=0 if p.top_k == -1 else p.top_k,
        min_p=p.min_p,
        repetition_penalty=1.0 if p.repetition_penalty == 0.0 else p.repetition_penalty,
        frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty,
        seed=int(p.seed) if p.has_seed else None,
    )


def item_from_proto(m: worker_pb2.ForwardItem) -> ForwardItem:
    """A ForwardItem message as the engine's frozen ForwardItem."""
    return ForwardItem(
        request_id=m.request_id, input_ids=tuple(m.input_ids), position_start=m.position_start,
        slot_ids=tuple(m.slot_ids), has_prefix=m.has_prefix, prefix_slot_ids=tuple(m.prefix_slot_ids),
        prefix_token_ids=tuple(m.prefix_token_ids), sampling=sampling_from_proto(m.sampling), sample=m.sample,
        return_logprob=m.return_logprob, top_logprobs_num=m.top_logprobs_num,
        return_prompt_logprobs=m.return_prompt_logprobs, prompt_len=m.prompt_len,
        decode_steps=max(m.decode_steps, 1) if m.decode_steps >= 0 else m.decode_steps,
        stop_token_ids=tuple(m.stop_token_ids), input_from_last_sample=m.input_from_last_sample,
    )


def _top(pairs) -> common_pb2.TopLogprobs:
    return common_pb2.TopLogprobs(entries=[common_pb2.TokenLogprob(token_id=t, logprob=lp) for t, lp in pairs])


def result_to_proto(o: ForwardOutput) -> worker_pb2.ForwardResult:
    """An engine ForwardOutput as a ForwardResult message."""
    return worker_pb2.ForwardResult(
        request_id=o.request_id, sampled=o.sampled, next_token_id=o.next_token_id, logprob=o.logprob,
        top_logprobs=_top(o.top_logprobs), prompt_logprobs=list(o.prompt_logprobs),
        prompt_top_logprobs=[_top(p) for p in o.prompt_top_logprobs],
        next_token_ids=list(o.next_token_ids), logprobs=list(o.logprobs), skipped=o.skipped,
    )


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    """Thin servicer over an Engine."""

    def __init__(self, engine: Engine, log=None):
        self.engine = engine
        self.log = log

    def Info(self, request, context):
        return worker_pb2.WorkerInfo(**self.engine.info().__dict__)

    def Forward(self, request, context):
        try:
            res = self.engine.forward([item_from_proto(m) for m in request.items], request.expected_epoch,
                                      seq=request.seq, after_seq=request.after_seq,
                                      cancelled=lambda: not context.is_active())
        except WorkerError as e:
            if self.log is not None:
                self.log.warning("forward_rejected", code=e.code, reason=e.message)
            context.abort(grpc.StatusCode[e.code], e.message)
        except Exception as e:  # a fault of ours (e.g. device out of memory): reported as INTERNAL, never hidden
            if self.log is not None:
                self.log.exception("forward_failed", error=repr(e))
            context.abort(grpc.StatusCode.INTERNAL, f"forward failed: {type(e).__name__}: {e}")
        return worker_pb2.ForwardResponse(results=[result_to_proto(o) for o in res.outputs],
                                          forward_seconds=res.forward_seconds)

    def Release(self, request, context):
        return worker_pb2.ReleaseResponse(released=self.engine.release(list(request.request_ids)))


def add_to_server(engine: Engine, server: grpc.Server, log=None) -> WorkerServicer:
    """Registers a WorkerServicer for ``engine`` on ``server``."""
    servicer = WorkerServicer(engine, log)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    return servicer
