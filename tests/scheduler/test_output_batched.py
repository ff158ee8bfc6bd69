"""``OutputStream.on_tokens`` (a multi-step result applied in one go: one detokenizer call, one stop-string
check) gives exactly what ``on_token`` per token gives: the same accepted tokens, text, finish reason,
matched stop and logprobs, whatever the chunking into Forwards (text that ends a Forward inside a character
may be released with the next one)."""

from __future__ import annotations

import queue

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codeserve.v1 import common_pb2
from scheduler_svc.detokenizer import load_tokenizer
from scheduler_svc.output import OutputStream
from scheduler_svc.request import Finish, Params, Req, State, StreamEnd
from worker_svc.model.default import ensure_default_model

EOS = 0


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(ensure_default_model())


def _req(tok, max_new: int, stops: tuple[str, ...], stop_ids: frozenset[int], ignore_eos: bool) -> Req:
    req = Req(rid="r", prompt_ids=[5, 6], params=Params(
        max_new_tokens=max_new, asked_max_new_tokens=max_new, sampling=common_pb2.SamplingParams(), stop=stops,
        stop_token_ids=stop_ids, ignore_eos=ignore_eos, return_logprob=True))
    req.stream = OutputStream(req, tok, EOS)
    return req


def _drive(req: Req, tokens: list[int], chunks: list[int], batched: bool) -> dict:
    """Feeds ``tokens`` in Forwards of ``chunks`` sizes until the request finishes; collects the stream."""
    pos = 0
    for k in chunks:
        if req.state == State.FINISHED or pos >= len(tokens):
            break
        got = tokens[pos:pos + k]
        lps = [-0.5 - i for i in range(pos, pos + len(got))]
        if batched:
            req.stream.on_tokens(got, lps)
        else:
            for t, lp in zip(got, lps):
                req.stream.on_token(t, lp, None, defer=True)
                if req.state == State.FINISHED:
                    break
            req.stream.flush()
        pos += len(got)
    finish = req.finish
    if req.state != State.FINISHED:  # text still held back (a character or stop string cut at a Forward's
        req.stream.finish_without_token(Finish.LENGTH)  # end may be released a Forward later) comes now
    req.stream.close()
    msgs = []
    while True:
        try:
            m = req.out.get_nowait()
        except queue.Empty:
            break
        if not isinstance(m, StreamEnd):
            msgs.append(m)
    return dict(ids=list(req.output_ids), lps=list(req.output_logprobs), finish=finish, stop=req.matched_stop,
                text="".join(m.text for m in msgs), msg_ids=[t for m in msgs for t in m.token_ids],
                messages=len(msgs))


@settings(max_examples=150, deadline=None)
@given(tokens=st.lists(st.integers(0, 1023), min_size=1, max_size=40),
       chunks=st.lists(st.integers(1, 8), min_size=40, max_size=40),
       max_new=st.integers(1, 40), stop_pick=st.lists(st.tuples(st.integers(0, 39), st.integers(1, 4)), max_size=2),
       stop_id_pick=st.lists(st.integers(0, 39), max_size=1), ignore_eos=st.booleans())
def test_on_tokens_equals_on_token_per_token(tok, tokens, chunks, max_new, stop_pick, stop_id_pick, ignore_eos):
    full = tok.decode(tokens, skip_special_tokens=False)
    stops = tuple(s for a, n in stop_pick if (s := full[a:a + n]) and "\ufffd" not in s)
    stop_ids = frozenset(tokens[i] for i in stop_id_pick if i < len(tokens))
    one = _drive(_req(tok, max_new, stops, stop_ids, ignore_eos), tokens, chunks, batched=False)
    many = _drive(_req(tok, max_new, stops, stop_ids, ignore_eos), tokens, chunks, batched=True)
    assert many == one


def test_a_stop_string_in_the_middle_of_a_forward_ends_at_the_token_that_completed_it(tok):
    ids = tok.encode("def add(a, b):\n    return a + b\n").ids
    text = tok.decode(ids)
    stop = "return"
    req = _req(tok, 100, (stop,), frozenset(), True)
    accepted = req.stream.on_tokens(ids, [0.0] * len(ids))
    assert req.finish.value == "stop" and req.matched_stop == stop
    assert stop in tok.decode(ids[:accepted]) and stop not in tok.decode(ids[:accepted - 1])
    req.stream.close()
    msg = req.out.get_nowait()
    assert msg.text == text[: text.find(stop)] and list(msg.token_ids) == ids[:accepted]
