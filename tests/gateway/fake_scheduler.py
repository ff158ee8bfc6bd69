"""A scripted stand-in for the scheduler's gRPC service, served by a real gRPC server on a free port.

Used only by the gateway's unit tests (the gateway's job is translation between HTTP and this API;
the real scheduler is tested in its own suite and end to end). Behaviour:
- generated tokens are ``continuation`` (tokenized), then EOS (id 0, finish "stop") unless
  ignore_eos; max_new_tokens reached -> finish "length"; stop strings are held back and trimmed; a token
  whose text is held back waits for a message with text (no message but the last has empty text);
- logprob of generated token i is ``-0.1 * (i + 1)``; top alternatives are (id, lp), (id + 1, lp - 1), ...;
  prompt logprob of prompt token i (i >= 1) is ``-0.5 - 0.01 * i``;
- ``error_after_first_if(request)`` -> (code, details) | None fails a call after its first message;
- ``error`` = (code, details) makes Generate fail at once (with the scheduler's "counted" trailer when
  ``error_counted``); ``hang`` makes it wait until cancelled;
- GetLoad with request_metrics returns ``request_metrics`` (the text of a real RequestMetrics: one call
  finished "length" after 2 tokens in 2 messages, one failed RESOURCE_EXHAUSTED);
- ``cancelled`` collects the request ids whose calls ended before the fake finished them, ``aborted`` the
  (request id, sibling_failed) of each Abort RPC.
"""

from __future__ import annotations

import threading

import grpc

from codeserve.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from common.counted import COUNTED_MARK
from common.grpc_server import RunningServer, start
from gateway.tokenizer import GatewayTokenizer
from scheduler_svc.request_metrics import RequestMetrics

EOS_ID = 0


class FakeScheduler(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, tokenizer: GatewayTokenizer, n_positions: int) -> None:
        self.tokenizer = tokenizer
        self.n_positions = n_positions
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.continuation = " return a + b\n\ndef sub(a, b):\n    return a - b\n"
            self.requests: list[scheduler_pb2.GenerateRequest] = []
            self.cancelled: list[str] = []
            self.completed: list[str] = []
            self.aborted: list[tuple[str, bool]] = []  # (request_id, sibling_failed) of each Abort RPC
            self.error: tuple[grpc.StatusCode, str] | None = None
            self.error_counted = False
            self.error_if = None  # callable(GenerateRequest) -> (code, details) | None
            self.error_after_first_if = None  # the same, the call failing after its first message
            self.hang = False
            self.hold_after_last: threading.Event | None = None  # set: each call stays open after its last message
            self.token_delay_s = 0.0
            self.cached_tokens = 0
            self.flushes = 0
            self.load = scheduler_pb2.GetLoadResponse(
                running=3, waiting=2, waiting_tokens=40,
                pools=[scheduler_pb2.PoolCounters(pool_id="default", capacity=1000, available=600, evictable=150,
                                                  protected=50, owned=200)],
                seconds_since_last_batch=0.01, batches_completed=17, prefix_query_tokens=500,
                prefix_hit_tokens=120, prompt_tokens_total=500, generation_tokens_total=321,
            )
            self.started = threading.Event()
            metrics = RequestMetrics()
            call = metrics.call()
            call.on_message(scheduler_pb2.GenerateResponse(token_ids=[5]))
            call.on_message(scheduler_pb2.GenerateResponse(token_ids=[6], finish_reason="length"))
            metrics.call().failed(grpc.StatusCode.RESOURCE_EXHAUSTED.name)
            self.request_metrics = metrics.render()

    # --- Generate ---------------------------------------------------------------------------
    def Generate(self, request, context):
        with self.lock:
            self.requests.append(request)
        rid = request.request_id
        finished = threading.Event()
        ended = threading.Event()  # set when the RPC terminates (finished or cancelled)
        if not context.add_callback(lambda: None if finished.is_set() else self._record_cancel(rid)):
            self._record_cancel(rid)  # the call ended before the callback could be registered
            return
        context.add_callback(ended.set)
        self.started.set()
        error = self.error or (self.error_if(request) if self.error_if is not None else None)
        if error is not None:
            finished.set()
            if self.error_counted:
                context.set_trailing_metadata((COUNTED_MARK,))
            context.abort(error[0], error[1])
        if self.hang:
            ended.wait(60)
            return
        ids = list(request.input_ids.ids) if request.HasField("input_ids") else self.tokenizer.encode(request.text)
        if not ids:
            finished.set()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty prompt")
        if len(ids) >= self.n_positions:
            finished.set()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"prompt has {len(ids)} tokens; n_positions is {self.n_positions}")
        for i, msg in enumerate(self._generate(request, ids, context, ended)):
            yield msg
            late = self.error_after_first_if(request) if i == 0 and self.error_after_first_if is not None else None
            if late is not None:
                finished.set()
                context.abort(late[0], late[1])
        if self.hold_after_last is not None:  # the status comes only once the test sets it
            self.hold_after_last.wait(30)
        if context.is_active():  # _generate returns early when the call was cancelled
            finished.set()
            with self.lock:
                self.completed.append(rid)

    def _record_cancel(self, rid: str) -> None:
        with self.lock:
            self.cancelled.append(rid)

    def _generate(self, request, ids, context, ended: threading.Event):
        first = scheduler_pb2.GenerateResponse(
            request_id=request.request_id, prompt_tokens=len(ids), cached_tokens=min(self.cached_tokens, len(ids) - 1),
            prompt_token_ids=ids,
        )
        if request.return_prompt_logprobs:
            for i in range(1, len(ids)):
                lp = -0.5 - 0.01 * i
                first.prompt_logprobs.append(lp)
                first.prompt_top_logprobs.append(self._top(ids[i], lp, request.top_logprobs_num))
        script = self.tokenizer.encode(self.continuation)
        skip = request.skip_special_tokens
        out: list[int] = []
        sent_chars = 0
        finish, matched, stop_hit = "", "", False
        msg = first
        text = ""
        while True:
            if len(out) >= request.max_new_tokens:
                finish = "length"
                break
            if len(out) < len(script):
                token = script[len(out)]
            elif request.ignore_eos:
                token = script[len(out) % len(script)]
            else:
                token = EOS_ID
            out.append(token)
            lp = -0.1 * len(out)
            msg.token_ids.append(token)
            if request.return_logprob:
                msg.logprobs.append(lp)
                msg.top_logprobs.append(self._top(token, lp, request.top_logprobs_num))
            if token == EOS_ID and not request.ignore_eos:
                finish, matched = "stop", "<|endoftext|>"
            if token in request.stop_token_ids:
                finish, matched = "stop", str(token)
            text = self.tokenizer.decode(out, skip_special_tokens=skip)
            safe = len(text) - 1 if text.endswith("\ufffd") else len(text)
            for stop in request.stop:
                at = text.find(stop)
                if at >= 0:
                    finish, matched, stop_hit = "stop", stop, True
                    safe = at + len(stop) if request.no_stop_trim else at
                    break
                for k in range(min(len(stop) - 1, len(text)), 0, -1):  # hold back a partial stop string
                    if text.endswith(stop[:k]):
                        safe = min(safe, len(text) - k)
                        break
            if finish:
                if not stop_hit:
                    safe = len(text)
                msg.text = text[sent_chars:safe] if safe > sent_chars else ""
                sent_chars = max(sent_chars, safe)
                break
            msg.text = text[sent_chars:safe] if safe > sent_chars else ""
            sent_chars = max(sent_chars, safe)
            if not msg.text:  # like the scheduler: tokens whose text is held back go out with it
                continue
            yield msg
            msg = scheduler_pb2.GenerateResponse(request_id=request.request_id)
            if self.token_delay_s:
                ended.wait(self.token_delay_s)
            if not context.is_active():
                return
        if finish == "length":
            msg.text += text[sent_chars:]
        msg.finish_reason = finish
        msg.matched_stop = matched
        msg.completion_tokens = len(out)
        yield msg

    def _top(self, token: int, lp: float, count: int) -> common_pb2.TopLogprobs:
        return common_pb2.TopLogprobs(entries=[
            common_pb2.TokenLogprob(token_id=(token + k) % len(self.tokenizer_vocab()), logprob=lp - k)
            for k in range(count)
        ])

    def tokenizer_vocab(self) -> range:
        return range(self.tokenizer.vocab_size)

    # --- unary ------------------------------------------------------------------------------
    def Abort(self, request, context):
        with self.lock:
            self.aborted.append((request.request_id, request.sibling_failed))
        return scheduler_pb2.AbortResponse(found=False)

    def GetLoad(self, request, context):
        if self.error is not None:
            context.abort(self.error[0], self.error[1])
        load = scheduler_pb2.GetLoadResponse()
        load.CopyFrom(self.load)
        if request.request_metrics:
            load.request_metrics = self.request_metrics
        return load

    def FlushCache(self, request, context):
        with self.lock:
            self.flushes += 1
        return scheduler_pb2.FlushCacheResponse(freed_tokens=150)

    def ServerInfo(self, request, context):
        return scheduler_pb2.ServerInfoResponse(
            model_name="fake", model_path="/fake", n_positions=self.n_positions, vocab_size=self.tokenizer.vocab_size,
            eos_token_id=EOS_ID, max_running_requests=8, chunk_size=32, page_size=1, max_queued_requests=64,
            pools=self.load.pools, attention_backend="torch", device="cpu", dtype="float32",
        )


def serve(fake: FakeScheduler) -> RunningServer:
    """Starts a real gRPC server for ``fake`` on 127.0.0.1:0."""
    return start(lambda server: scheduler_pb2_grpc.add_SchedulerServicer_to_server(fake, server),
                 ["codeserve.v1.Scheduler"], "127.0.0.1:0")
