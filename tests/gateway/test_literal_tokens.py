"""gateway.literal_tokens: a text tokenized as its head (up to its last line break after a printable character)
and its tail equals the text tokenized whole, for the tokenizers it splits (the embedded model's: Digits then
ByteLevel; the gateway tests': ByteLevel alone), on generated text and on a typist's keystrokes over HumanEval
files; a keystroke tokenizes only its tail; the caches are bounded; other tokenizers are tokenized whole."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st
from tokenizers import Tokenizer

from bench.humaneval_fim import cuts
from gateway import literal_tokens
from gateway.literal_tokens import LiteralTokens, split_point, splits_at_line_breaks
from tests.gateway.tokenizer_fixture import build_tokenizer
from worker_svc.model.default import build_tokenizer_json


def literal(tokenizer_json: str) -> Tokenizer:
    tok = Tokenizer.from_str(tokenizer_json)
    tok.encode_special_tokens = True
    return tok


@pytest.fixture(scope="module")
def embedded() -> Tokenizer:
    return literal(build_tokenizer_json())


@pytest.fixture(scope="module")
def plain_byte_level(tmp_path_factory) -> Tokenizer:
    path = build_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    return literal(path.read_text())


def whole(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode_batch([text], add_special_tokens=False)[0].ids)


# characters that move the pre-tokenizer's boundaries: letters, digits, spaces, tabs, line breaks (CR too),
# symbols, apostrophes (contractions), non-ASCII letters and emoji, and marker text
TEXT = st.lists(st.sampled_from(list("ab Z9 0\t\n\n\r:;()'\"._-=#s") + ["'s", "'ll", "é", "中", "😀", "<fim_suffix>",
                                                                       "    ", "\u00a0", "\u2028"]),
                max_size=40).map("".join)


@pytest.mark.parametrize("name", ["embedded", "plain_byte_level"])
@settings(max_examples=300, deadline=None)
@given(head=TEXT, tail=TEXT)
def test_head_and_tail_tokenize_to_the_whole(request, name, head, tail) -> None:
    tok = request.getfixturevalue(name)
    cache = LiteralTokens(tok)
    assert cache.splits
    text = head + tail
    cache.encode([head])  # warm the caches with a shorter text, as the previous keystroke would
    assert cache.encode([text]) == [whole(tok, text)]
    assert LiteralTokens(tok).encode([text]) == [whole(tok, text)]  # cold


def test_a_typists_keystrokes_tokenize_their_tail_only(embedded) -> None:
    """Every keystroke's prefix over 20 HumanEval cuts equals its whole encoding; after the first keystroke of a
    line, only the cursor's line is tokenized (the head comes from the cache)."""
    cache = LiteralTokens(embedded)
    tails = 0
    for cut in cuts(seed=0)[:20]:
        typed, head = cut.prefix, None
        for ch in cut.middle:
            typed += ch
            planned, pieces = cache.plan([typed, cut.suffix])
            if typed[:split_point(typed)] == head:  # the same head as the keystroke before: the tail alone
                assert pieces in ([], [typed[len(head):]]), pieces  # [] when this very text was typed before
                tails += bool(pieces)
            head = typed[:split_point(typed)]
            batch = embedded.encode_batch(pieces, add_special_tokens=False) if pieces else []
            got = cache.finish([typed, cut.suffix], planned, pieces, [e.ids for e in batch])
            assert got == [whole(embedded, typed), whole(embedded, cut.suffix)]
    assert tails > 200


def test_a_head_evicted_between_plan_and_finish_is_still_used(embedded, monkeypatch) -> None:
    monkeypatch.setattr(literal_tokens, "HEAD_ENTRIES", 1)
    cache = LiteralTokens(embedded)
    a, b = "def f(x):\n    return x", "def g(y):\n    return y"
    cache.encode([a + "\n"])  # head a, tail "\n"
    planned, pieces = cache.plan([a + "\n    pass"])
    assert pieces == ["\n    pass"]  # the head is known
    cache.encode([b + "\n"])  # another call's finish evicts it meanwhile
    encoded = [e.ids for e in embedded.encode_batch(pieces, add_special_tokens=False)]
    assert cache.finish([a + "\n    pass"], planned, pieces, encoded) == [whole(embedded, a + "\n    pass")]


def test_the_caches_keep_the_most_recent_entries_only(embedded, monkeypatch) -> None:
    monkeypatch.setattr(literal_tokens, "TEXT_ENTRIES", 3)
    monkeypatch.setattr(literal_tokens, "HEAD_ENTRIES", 2)
    cache = LiteralTokens(embedded)
    for t in ("a", "b", "c", "a", "d"):
        cache.encode([t])
    assert list(cache._texts) == ["c", "a", "d"]  # "b", the least recent, evicted
    for t in ("x1\ny", "x2\ny", "x3\ny"):
        cache.encode([t])
    assert list(cache._heads) == ["x2", "x3"]


def test_a_text_seen_lately_is_not_tokenized_again(embedded) -> None:
    cache = LiteralTokens(embedded)
    cache.encode(["def f():\n    pass\n", ""])
    planned, pieces = cache.plan(["", "def f():\n    pass\n"])
    assert pieces == [] and [p.ids for p in planned] == [(), tuple(whole(embedded, "def f():\n    pass\n"))]


@pytest.mark.parametrize("change", [
    lambda t: t.update(normalizer={"type": "NFC"}),
    lambda t: t["added_tokens"].append({**t["added_tokens"][0], "id": 10**6, "content": "x\n", "special": False}),
    lambda t: t["pre_tokenizer"]["pretokenizers"][-1].update(add_prefix_space=True),
    lambda t: t["pre_tokenizer"]["pretokenizers"][-1].update(use_regex=False),
    lambda t: t.update(pre_tokenizer={"type": "Whitespace"}),
    lambda t: t.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "\n"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}),
])
def test_other_tokenizers_are_tokenized_whole(change) -> None:
    tokenizer_json = json.loads(build_tokenizer_json())
    assert splits_at_line_breaks(tokenizer_json)
    change(tokenizer_json)
    assert not splits_at_line_breaks(tokenizer_json)


def test_split_point_is_the_last_line_break_after_a_printable_character() -> None:
    assert split_point("a = 1\nb = 2\n    c") == 11
    assert split_point("a:\n\n    ") == 2  # the second break follows a break
    assert split_point("a \nb") == 0  # follows a space: no split
    assert split_point("no break") == 0 and split_point("\nx") == 0
