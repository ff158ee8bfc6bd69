"""GatewayTokenizer: per-token pieces and offsets (used for logprob text_offset) agree with decode."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tokenizer import PieceTracker

TEXTS = ["caf\u00e9 \U0001f600 \u4e2d\u6587", "def f():\n\treturn 1\n", "x = a ., b ! c ?\n", "<fim_prefix>a<fim_suffix>"]


def test_pieces_join_to_the_text(tokenizer):
    for text in TEXTS:
        ids = tokenizer.encode(text)
        pieces = tokenizer.pieces(ids)
        assert "".join(pieces.pieces) == text
        assert pieces.offsets == tuple(sum(len(p) for p in pieces.pieces[:i]) for i in range(len(ids)))


def test_multibyte_character_is_carried_by_the_completing_token(tokenizer):
    ids = tokenizer.encode("\U0001f600")
    assert len(ids) > 1  # the test tokenizer splits the emoji into byte tokens
    pieces = tokenizer.pieces(ids).pieces
    assert pieces[-1] == "\U0001f600" and all(p == "" for p in pieces[:-1])


def test_skip_special_tokens(tokenizer):
    ids = tokenizer.encode("<fim_prefix>ab<fim_suffix>")
    pieces = tokenizer.pieces(ids, skip_special_tokens=True).pieces
    assert pieces[0] == "" and pieces[-1] == "" and "".join(pieces) == "ab"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=399), max_size=40), st.integers(min_value=1, max_value=7),
       st.booleans())
def test_incremental_pieces_equal_decode_for_any_ids(tokenizer, ids, split, skip):
    # In chunks of `split` tokens (as streamed), the pieces plus the tail equal the whole decode.
    tracker = PieceTracker(tokenizer, skip, base_offset=5)
    pieces: list[str] = []
    offsets: list[int] = []
    for start in range(0, len(ids), split):
        result = tracker.add(ids[start:start + split])
        pieces.extend(result.pieces)
        offsets.extend(result.offsets)
    assert "".join(pieces) + tracker.tail() == tokenizer.decode(ids, skip_special_tokens=skip)
    assert offsets == [5 + sum(len(p) for p in pieces[:i]) for i in range(len(ids))]
    assert not any(p.endswith("\ufffd") and not tokenizer.decode(ids, skip).count("\ufffd") for p in pieces)
