"""Issue 12 item 3: a stream message carries exactly the text of its tokens. Text held back (an incomplete
character, a possible stop string) keeps its tokens and logprobs with it until it is released; no message but
the last has empty text; the joined text is the whole answer. (Was: held-back text was released later beside
other tokens' ids and logprobs, and a token whose text was held went out in a message of empty text.)"""

from __future__ import annotations

import queue

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codeserve.v1 import common_pb2
from scheduler_svc.detokenizer import load_tokenizer
from scheduler_svc.output import OutputStream
from scheduler_svc.request import Finish, Params, Req, State, StreamEnd
from scheduler_svc.stop_strings import StopStringMatcher
from worker_svc.model.default import ensure_default_model

EOS = 0


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(ensure_default_model())


def _req(tok, max_new: int, stops: tuple[str, ...], ignore_eos: bool = True, keep: bool = False,
         skip: bool = False) -> Req:
    req = Req(rid="r", prompt_ids=[5, 6], params=Params(
        max_new_tokens=max_new, asked_max_new_tokens=max_new, sampling=common_pb2.SamplingParams(), stop=stops,
        ignore_eos=ignore_eos, return_logprob=True, no_stop_trim=keep, skip_special_tokens=skip))
    req.stream = OutputStream(req, tok, EOS)
    return req


def _messages(req: Req, tokens: list[int], chunks: list[int] | None = None) -> list:
    """Feeds ``tokens`` (one per Forward, or multi-step Forwards of ``chunks`` sizes) until the request finishes;
    the stream's messages."""
    pos, sizes = 0, chunks or [1] * len(tokens)
    for k in sizes:
        if req.state == State.FINISHED or pos >= len(tokens):
            break
        got = tokens[pos:pos + k]
        lps = [-0.5 - i for i in range(pos, pos + len(got))]
        if chunks is None:
            req.stream.on_token(got[0], lps[0], None)
        else:
            req.stream.on_tokens(got, lps)
        pos += len(got)
    if req.state != State.FINISHED:
        req.stream.finish_without_token(Finish.LENGTH)
    req.stream.close()
    msgs = []
    while True:
        try:
            m = req.out.get_nowait()
        except queue.Empty:
            return msgs
        if not isinstance(m, StreamEnd):
            msgs.append(m)


def _check(tok, req: Req, msgs: list) -> None:
    skip = req.params.skip_special_tokens
    *running, last = msgs
    for m in running:
        assert m.text, f"a message of empty text: tokens {list(m.token_ids)}"
        assert m.text == tok.decode(list(m.token_ids), skip_special_tokens=skip), (m.text, list(m.token_ids))
        assert len(m.logprobs) == len(m.token_ids)
    assert tok.decode(list(last.token_ids), skip_special_tokens=skip).startswith(last.text)
    assert [t for m in msgs for t in m.token_ids] == req.output_ids
    assert [lp for m in msgs for lp in m.logprobs] == pytest.approx(req.output_logprobs)


def _answer(tok, tokens: list[int], stops: tuple[str, ...], keep: bool = False, skip: bool = False) -> str:
    """The text of the whole answer: the decoded tokens up to the first stop string (kept with ``keep``)."""
    m = StopStringMatcher(stops, no_stop_trim=keep)
    result = m.push(tok.decode(tokens, skip_special_tokens=skip))
    return result.text + ("" if result.matched else m.flush())


def test_issue_case_held_newlines_travel_with_their_tokens(tok):
    """The issue's stream: 'import' / ' re' / '' with token '\\n' / '\\nimport' with token 'import'."""
    tokens = tok.encode("import re\nimport os", add_special_tokens=False).ids
    req = _req(tok, len(tokens), ("\n\n\n",))
    msgs = _messages(req, tokens)
    _check(tok, req, msgs)
    assert "".join(m.text for m in msgs) == "import re\nimport os"
    newline = [m for m in msgs if m.text.startswith("\n")]
    assert newline and all(tok.decode(list(m.token_ids)).startswith("\n") for m in newline)


def test_a_token_that_starts_a_stop_string_goes_out_with_its_text_when_released(tok):
    tokens = tok.encode("a = 1\n\nb = 2\n\n\nc", add_special_tokens=False).ids
    req = _req(tok, 64, ("\n\n\n",))
    msgs = _messages(req, tokens)
    _check(tok, req, msgs)
    assert "".join(m.text for m in msgs) == "a = 1\n\nb = 2"
    assert req.matched_stop == "\n\n\n"


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(0, 1023), min_size=1, max_size=40),
       chunks=st.one_of(st.none(), st.lists(st.integers(1, 8), min_size=40, max_size=40)),
       stop_pick=st.lists(st.tuples(st.integers(0, 39), st.integers(1, 4)), max_size=2), keep=st.booleans(),
       skip=st.booleans())
def test_every_message_carries_exactly_its_tokens_text(tok, tokens, chunks, stop_pick, keep, skip):
    """Token 0 (EOS, ignore_eos here) is a special token: with ``skip`` it has no text and goes with the next
    token that has some."""
    full = tok.decode(tokens, skip_special_tokens=skip)
    stops = tuple(s for a, n in stop_pick if (s := full[a:a + n]) and "\ufffd" not in s)
    req = _req(tok, len(tokens), stops, keep=keep, skip=skip)
    msgs = _messages(req, tokens, chunks)
    _check(tok, req, msgs)
    assert "".join(m.text for m in msgs) == _answer(tok, req.output_ids, stops, keep, skip)


def test_top_logprobs_travel_with_their_tokens(tok):
    tokens = tok.encode("x = 1\n\ny = 2\n\nz", add_special_tokens=False).ids
    req = Req(rid="r", prompt_ids=[5, 6], params=Params(
        max_new_tokens=len(tokens), asked_max_new_tokens=len(tokens), sampling=common_pb2.SamplingParams(),
        stop=("\n\n\n",), ignore_eos=True, return_logprob=True, top_logprobs_num=1))
    req.stream = OutputStream(req, tok, EOS)
    for i, t in enumerate(tokens):
        top = common_pb2.TopLogprobs(entries=[common_pb2.TokenLogprob(token_id=t, logprob=-0.1 * i)])
        req.stream.on_token(t, -0.1 * i, top)
    req.stream.close()
    msgs = []
    while not req.out.empty():
        m = req.out.get_nowait()
        if not isinstance(m, StreamEnd):
            msgs.append(m)
    _check(tok, req, msgs)
    for m in msgs:
        assert [e.entries[0].token_id for e in m.top_logprobs] == list(m.token_ids)
    assert "".join(m.text for m in msgs) == "x = 1\n\ny = 2\n\nz"
