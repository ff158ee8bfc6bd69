"""A request's output side: appends sampled tokens, checks finish conditions, builds the stream messages."""

from __future__ import annotations

from tokenizers import Tokenizer

from codeserve.v1 import common_pb2, scheduler_pb2
from common import hop_trace
from scheduler_svc.detokenizer import IncrementalDetokenizer
from scheduler_svc.held_tokens import HeldTokens
from scheduler_svc.outbox import Outbox
from scheduler_svc.request import Finish, Req, State, StreamEnd, stop_ids
from scheduler_svc.stop_strings import StopStringMatcher


class OutputStream:
    """Output of one request. ``eos_token_id`` ends the request (finish "stop") unless ignore_eos; stop
    token ids likewise; stop strings are matched on the detokenized text with hold-back; max_new_tokens
    (already capped by the context limit) ends it with "length". The token that ended it by EOS or a
    stop token id is counted and returned as a token id but not turned into text."""

    def __init__(self, req: Req, tokenizer: Tokenizer, eos_token_id: int, outbox: Outbox | None = None) -> None:
        """``outbox``: where the messages go (``Outbox.put`` to ``req.out``; the loop may hold them a while), or
        None: straight to ``req.out``."""
        self.req = req
        self._outbox = outbox
        self.eos = eos_token_id
        self.detok = IncrementalDetokenizer(tokenizer, req.params.skip_special_tokens)
        self.stops = StopStringMatcher(req.params.stop, req.params.no_stop_trim)
        self._stop_ids = frozenset(stop_ids(req.params, eos_token_id))  # token ids that end the request
        self._final: scheduler_pb2.GenerateResponse | None = None
        self._pending: scheduler_pb2.GenerateResponse | None = None  # deferred messages, merged (``flush``)
        self.held = HeldTokens()  # tokens whose text is held back: they go out with it (scheduler_svc/held_tokens.py)

    def _put(self, item) -> None:
        """``item`` on the request's queue, through the outbox when there is one."""
        if self._outbox is None:
            self.req.out.put(item)
        else:
            self._outbox.put(self.req.out, item)

    def _message(self) -> scheduler_pb2.GenerateResponse:
        req = self.req
        msg = scheduler_pb2.GenerateResponse(request_id=req.rid)
        if not req.first_sent:
            req.first_sent = True
            msg.prompt_tokens = len(req.prompt_ids)
            msg.cached_tokens = max(req.cached_tokens, 0)
            req.extend_ids(msg.prompt_token_ids, 0, len(req.prompt_ids))
            msg.prompt_logprobs.extend(req.prompt_logprobs)
            msg.prompt_top_logprobs.extend(req.prompt_top_logprobs)
        return msg

    def on_token(self, token_id: int, logprob: float, top: common_pb2.TopLogprobs | None, defer: bool = False) -> None:
        """Appends one sampled token and streams a message; when a finish condition holds, the request is
        FINISHED (it has a finish reason) and its last message waits for ``close``. ``defer``: the message is merged with the
        following ones until ``flush`` (multi-step decode: one message per request per Forward)."""
        req, p = self.req, self.req.params
        if not req.output_ids:
            hop_trace.mark(req.rid, "first_token")
        req.output_ids.append(token_id)
        if p.return_logprob:
            req.output_logprobs.append(logprob)
        if p.top_logprobs_num > 0:
            req.output_top_logprobs.append(top if top is not None else common_pb2.TopLogprobs())
        delta = released = ""
        if token_id in self._stop_ids:
            req.finish, req.matched_stop = Finish.STOP, str(token_id)
        elif not self.stops.active:  # nothing to match: the matcher would pass the text through
            delta = released = self.detok.push([token_id])
        else:
            delta = self.detok.push([token_id])
            result = self.stops.push(delta)
            released = result.text
            if result.matched is not None:
                req.finish, req.matched_stop = Finish.STOP, result.matched
        self.held.add(token_id, logprob, req.output_top_logprobs[-1] if p.top_logprobs_num > 0 else None, delta,
                      complete=not self.detok.holding)
        self.held.release(len(released))
        if req.finish is None and req.remaining_new_tokens <= 0:
            req.finish = Finish.LENGTH
        if req.finish is not None:
            self._drain()
        msg = self._held_message()
        if msg is None:  # its text is held back: the token goes out with it
            return
        if self._pending is not None:
            msg = self._merge(self._pending, msg)
            self._pending = None
        if req.finish is None:
            if defer:
                self._pending = msg
            else:
                self._put(msg)
            return
        self._finish_fields(msg)
        self._final = msg

    def on_tokens(self, token_ids, logprobs) -> int:
        """A multi-step result in one go: appends the tokens up to the one that finishes the request (a stop
        token id, max_new_tokens, or a stop string), streams them as one message (or keeps it as the last
        message when finished) and returns how many were accepted. One detokenizer call and one stop-string
        check for all of them; when a stop string matches among them, the tokens are replayed one by one to
        find the token that completed it (same result as ``on_token`` per token). ``logprobs``: one per
        token (used with return_logprob; may be empty otherwise)."""
        req, p = self.req, self.req.params
        cut = min(len(token_ids), req.remaining_new_tokens)
        if self._pending is not None or p.top_logprobs_num > 0 or cut <= 0 or self.held:
            return self._one_by_one(token_ids, logprobs)
        accepted = list(token_ids[:cut])
        stop_tok = None
        if self._stop_ids and not self._stop_ids.isdisjoint(accepted):
            stop_tok = next(i for i, t in enumerate(accepted) if t in self._stop_ids)
            cut = stop_tok + 1
            del accepted[cut:]
        text_ids = accepted if stop_tok is None else accepted[:stop_tok]
        marks = self.detok.mark(), self.stops.mark()
        if self.stops.active:
            result = self.stops.push(self.detok.push(text_ids))
            text = result.text
            held_back = result.matched is not None or self.stops.holding
        else:  # nothing to match: the matcher would pass the text through
            text = self.detok.push(text_ids)
            held_back = False
        if held_back or self.detok.holding or (not text and stop_tok is None):
            # which token completed the stop string, or which tokens go with text held back: replay one by one
            self.detok.rewind(marks[0])
            self.stops.rewind(marks[1])
            return self._one_by_one(token_ids, logprobs)
        req.output_ids.extend(accepted)
        lps = [logprobs[i] if i < len(logprobs) else 0.0 for i in range(cut)]
        if p.return_logprob:
            req.output_logprobs.extend(lps)
        for i, token_id in enumerate(accepted):  # one message: all of its text comes with the last token
            self.held.add(token_id, lps[i], None, text if i == len(accepted) - 1 else "", complete=True)
        self.held.release(len(text))
        if stop_tok is not None:
            req.finish, req.matched_stop = Finish.STOP, str(accepted[-1])
        elif req.remaining_new_tokens <= 0:
            req.finish = Finish.LENGTH
        if req.finish is not None:
            self._drain()
        msg = self._held_message()
        if req.finish is None:
            self._put(msg)
            return cut
        self._finish_fields(msg)
        self._final = msg
        return cut

    def _one_by_one(self, token_ids, logprobs) -> int:
        """``on_token`` per token until the request finishes, as one message; returns tokens accepted."""
        accepted = 0
        for i, t in enumerate(token_ids):
            self.on_token(t, logprobs[i] if i < len(logprobs) else 0.0, None, defer=True)
            accepted += 1
            if self.req.state == State.FINISHED:
                break
        self.flush()  # one stream message per request per Forward
        return accepted

    @staticmethod
    def _merge(first: scheduler_pb2.GenerateResponse, later: scheduler_pb2.GenerateResponse) -> scheduler_pb2.GenerateResponse:
        """One message with ``first``'s tokens, text and logprobs followed by ``later``'s (prompt facts of
        ``first`` kept)."""
        first.token_ids.extend(later.token_ids)
        first.text += later.text
        first.logprobs.extend(later.logprobs)
        first.top_logprobs.extend(later.top_logprobs)
        return first

    def flush(self) -> None:
        """Sends the deferred message, if any (a finished request sends it as part of its last message)."""
        if self._pending is not None:
            self._put(self._pending)
            self._pending = None

    def _drain(self) -> None:
        """Lets through the text still held back by the detokenizer and the stop matcher (a stop may still
        match in it), into ``held``."""
        if self.stops.matched is not None:
            return
        flushed = self.detok.flush()
        self.held.add_text(flushed)
        result = self.stops.push(flushed)
        if result.matched is not None:
            self.req.finish, self.req.matched_stop = Finish.STOP, result.matched
            self.held.release(len(result.text))
            return
        self.held.release(len(result.text) + len(self.stops.flush()))

    def _held_message(self) -> scheduler_pb2.GenerateResponse | None:
        """A message of the held tokens that may go out with their text: all of them when the request has
        finished (its last message), else ``held.take()`` (None: nothing may go out yet)."""
        part = self.held.take_all() if self.req.finish is not None else self.held.take()
        if part is None:
            return None
        msg = self._message()
        msg.token_ids.extend(part.token_ids)
        msg.text = part.text
        if self.req.params.return_logprob:
            msg.logprobs.extend(part.logprobs)
        msg.top_logprobs.extend(part.top_logprobs)
        self.req.sent_tokens += len(part.token_ids)
        return msg

    def _finish_fields(self, msg: scheduler_pb2.GenerateResponse) -> None:
        hop_trace.mark(self.req.rid, "final_message")
        msg.finish_reason = self.req.finish.value
        msg.matched_stop = self.req.matched_stop
        msg.completion_tokens = len(self.req.output_ids)

    def finish_without_token(self, reason: Finish) -> None:
        """Finishes with no new token (max_new_tokens 0, abort); ``close`` sends the last message."""
        req = self.req
        req.finish = reason
        if reason != Finish.ABORT:
            self._drain()
        msg = self._held_message()  # with the tokens still held (an abort: the text let through so far)
        self._finish_fields(msg)
        self._final = msg

    @property
    def has_final(self) -> bool:
        """True when the request finished and its last message was not sent yet."""
        return self._final is not None

    def close(self) -> None:
        """Sends the last message of a finished request and ends the stream. The loop calls it after the
        request's slots were cached or released, so a client that saw the end sees the pool settled."""
        if self._final is None:
            raise RuntimeError(f"close() of request {self.req.rid} that has not finished")
        self._put(self._final)
        self._put(StreamEnd())
        self._final = None

    def fail(self, code: object, message: str) -> None:
        """Ends the stream with an error status (a grpc.StatusCode) and its message; every message the outbox held
        goes out first (a failure is never held behind a round that may not come: a stalled worker, an outage)."""
        self.req.finish = Finish.ABORT
        if self._outbox is not None:
            self._outbox.release()
        self._put(StreamEnd(code, message))
