"""gRPC servicer of ``codeserve.v1.Worker``: protobuf <-> engine types, WorkerError -> status code."""

from __future__ import annotations

import time

import grpc

from codeserve.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from common import hop_trace
from common.proto_ints import as_tuple
from worker_svc.engine import Engine
from worker_svc.forward_log import ForwardLog
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


_SAMPLING: dict[bytes, SamplingParams] = {}  # serialized SamplingParams message -> engine params
_SAMPLING_MAX = 4096


def sampling_of(p: common_pb2.SamplingParams) -> SamplingParams:
    """``sampling_from_proto`` memoized on the message's bytes (requests of a batch mostly share their
    parameters; equal bytes are equal fields). Thread-safe: a lost race computes the same value twice."""
    key = p.SerializeToString()
    params = _SAMPLING.get(key)
    if params is None:
        if len(_SAMPLING) >= _SAMPLING_MAX:
            _SAMPLING.clear()
        params = _SAMPLING[key] = sampling_from_proto(p)
    return params


def item_from_proto(m: worker_pb2.ForwardItem) -> ForwardItem:
    """A ForwardItem message as the engine's frozen ForwardItem (repeated fields as tuples of ints)."""
    steps = m.decode_steps
    return ForwardItem.make(
        request_id=m.request_id, input_ids=as_tuple(m.input_ids), position_start=m.position_start,
        slot_ids=as_tuple(m.slot_ids), has_prefix=m.has_prefix, prefix_slot_ids=as_tuple(m.prefix_slot_ids),
        prefix_token_ids=as_tuple(m.prefix_token_ids), sampling=sampling_of(m.sampling), sample=m.sample,
        return_logprob=m.return_logprob, top_logprobs_num=m.top_logprobs_num,
        return_prompt_logprobs=m.return_prompt_logprobs, prompt_len=m.prompt_len,
        decode_steps=max(steps, 1) if steps >= 0 else steps, stop_token_ids=as_tuple(m.stop_token_ids),
        input_from_last_sample=m.input_from_last_sample)


def _top(pairs) -> common_pb2.TopLogprobs:
    return common_pb2.TopLogprobs(entries=[common_pb2.TokenLogprob(token_id=t, logprob=lp) for t, lp in pairs])


def _fill_result(r: worker_pb2.ForwardResult, o: ForwardOutput) -> worker_pb2.ForwardResult:
    """Sets ``r`` (a fresh ForwardResult) from ``o``; empty repeated and message fields are left unset (they
    read the same)."""
    if o.next_token_ids:
        r.next_token_ids.extend(o.next_token_ids)
    if o.logprobs:
        r.logprobs.extend(o.logprobs)
    if o.top_logprobs:
        r.top_logprobs.CopyFrom(_top(o.top_logprobs))
    if o.prompt_logprobs:
        r.prompt_logprobs.extend(o.prompt_logprobs)
    if o.prompt_top_logprobs:
        r.prompt_top_logprobs.extend(_top(p) for p in o.prompt_top_logprobs)
    return r


def result_to_proto(o: ForwardOutput) -> worker_pb2.ForwardResult:
    """An engine ForwardOutput as a ForwardResult message."""
    return _fill_result(worker_pb2.ForwardResult(request_id=o.request_id, sampled=o.sampled, next_token_id=o.next_token_id,
                                                 logprob=o.logprob, skipped=o.skipped), o)


def response_to_proto(outputs, forward_seconds: float, device_seconds: float = 0.0) -> worker_pb2.ForwardResponse:
    """The ForwardResponse of a Forward's outputs (each result built in place: a list handed to the
    constructor would be copied message by message); seconds as ``types.ForwardResult`` has them."""
    reply = worker_pb2.ForwardResponse(forward_seconds=forward_seconds, device_seconds=device_seconds)
    add = reply.results.add
    for o in outputs:
        _fill_result(add(request_id=o.request_id, sampled=o.sampled, next_token_id=o.next_token_id, logprob=o.logprob,
                         skipped=o.skipped), o)
    return reply


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    """Thin servicer over an Engine."""

    def __init__(self, engine: Engine, log=None, forward_log: ForwardLog | None = None):
        """``forward_log``: the Forward timeline (``forward_log.py``) each Forward appends to; the engine's
        ``origin`` must then be set so results carry their device spans."""
        self.engine = engine
        self.log = log
        self.forward_log = forward_log

    def Info(self, request, context):
        return worker_pb2.WorkerInfo(**self.engine.info().__dict__)

    def Forward(self, request, context):
        in_ns = time.monotonic_ns()
        firsts = [m.request_id for m in request.items if m.has_prefix] if hop_trace.enabled() else ()
        for rid in firsts:  # an admission's first chunk (hop tracing: common/hop_trace.py)
            hop_trace.mark(rid, "forward_in")
        items = [item_from_proto(m) for m in request.items]
        items_ns = time.monotonic_ns()
        try:
            res = self.engine.forward(items, request.expected_epoch,
                                      seq=request.seq, after_seq=request.after_seq,
                                      cancelled=lambda: not context.is_active(), before_seq=request.before_seq,
                                      release_ids=list(request.release_request_ids),
                                      on_run=(lambda: [hop_trace.mark(r, "forward_run") for r in firsts]) if firsts else None)
        except WorkerError as e:
            if self.log is not None:
                self.log.warning("forward_rejected", code=e.code, reason=e.message)
            if self.forward_log is not None:
                self.forward_log.record(request.seq, request.after_seq, items, in_ns, time.monotonic_ns(), None,
                                        rejected=True)
            context.abort(grpc.StatusCode[e.code], e.message)
        except Exception as e:  # a fault of ours (e.g. device out of memory): reported as INTERNAL, never hidden
            if self.log is not None:
                self.log.exception("forward_failed", error=repr(e))
            context.abort(grpc.StatusCode.INTERNAL, f"forward failed: {type(e).__name__}: {e}")
        for rid in firsts:
            hop_trace.mark(rid, "forward_out")
        reply = response_to_proto(res.outputs, res.forward_seconds, res.device_seconds)
        if self.forward_log is not None:
            self.forward_log.record(request.seq, request.after_seq, items, in_ns, time.monotonic_ns(), res.device_span_ns,
                                    prepared_ns=res.prepared_ns, launch=res.launch,
                                    marks=(("items", items_ns),) + res.marks)
        return reply

    def Release(self, request, context):
        try:
            return worker_pb2.ReleaseResponse(released=self.engine.release(list(request.request_ids)))
        except WorkerError as e:  # (a commit it waited for never came: Engine.release)
            context.abort(grpc.StatusCode[e.code], e.message)


def add_to_server(engine: Engine, server: grpc.Server, log=None, forward_log: ForwardLog | None = None) -> WorkerServicer:
    """Registers a WorkerServicer for ``engine`` on ``server`` (``forward_log``: see ``WorkerServicer``)."""
    servicer = WorkerServicer(engine, log, forward_log)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    return servicer
