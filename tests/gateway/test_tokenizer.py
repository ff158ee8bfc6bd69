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


def test_token_bytes_rebuild_the_text_a_multibyte_character_included(tokenizer):
    """OpenAI's chat ``bytes``: a token's real bytes. Was: the bytes of its text on its own, so each piece of a
    split character was U+FFFD's three bytes and the bytes of the tokens did not rebuild the text."""
    for text in TEXTS + ["\U0001f600", "na\u00efve \u2603"]:
        ids = tokenizer.encode(text)
        assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode(), text
    emoji = tokenizer.encode("\U0001f600")
    assert len(emoji) > 1 and tokenizer.token_text(emoji[0]) == "\ufffd"
    assert tokenizer.token_bytes(emoji[0]) != "\ufffd".encode()
    assert tokenizer.token_bytes(tokenizer.encode("<fim_suffix>")[0]) == b"<fim_suffix>"
    ascii_ids = tokenizer.encode("def f():\n\treturn 1\n")
    assert all(tokenizer.token_bytes(i) == tokenizer.token_text(i).encode() for i in ascii_ids)


def test_token_bytes_of_the_checkpoint_tokenizer():
    """The same on the default checkpoint's tokenizer.json (StarCoder's byte-level BPE structure)."""
    from gateway.tokenizer import GatewayTokenizer
    from worker_svc.model.default import ensure_default_model

    tok = GatewayTokenizer.from_file(ensure_default_model())
    for text in ["caf\u00e9 \U0001f600 \u4e2d\u6587", "def f():\n\treturn 1\n", "<fim_prefix>x<fim_suffix>"]:
        assert b"".join(tok.token_bytes(i) for i in tok.encode(text)) == text.encode(), text
