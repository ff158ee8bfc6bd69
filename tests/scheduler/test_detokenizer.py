"""Incremental detokenization: UTF-8 split across tokens, code whitespace (case K3), special tokens."""

import pytest

from scheduler_svc.detokenizer import REPLACEMENT, IncrementalDetokenizer, load_tokenizer
from worker_svc.model.default import ensure_default_model

K3 = "x = a ., b ! c ?\nrun(\"python3 ./src/main.py $IN $OUT\" , 'it' )\n"


@pytest.fixture(scope="module")
def model_path():
    return ensure_default_model()


@pytest.fixture(scope="module")
def tok(model_path):
    return load_tokenizer(model_path)


def stream(tok, ids, skip=False, step=1):
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas = [detok.push(ids[i:i + step]) for i in range(0, len(ids), step)]
    deltas.append(detok.flush())
    return deltas


def test_multibyte_characters_split_across_tokens_are_never_emitted_half(tok):
    text = "s = 'héllo 世界 🎉 ñandú'\nprint(s)  # ✓\n"
    ids = tok.encode(text).ids
    # The test is only meaningful if some character really spans several tokens.
    assert any(REPLACEMENT in tok.decode([i]) for i in ids), "no token splits a UTF-8 character"
    deltas = stream(tok, ids)
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) == text == tok.decode(ids)


def test_k3_code_whitespace_survives_and_stream_equals_hf_decode(tok, model_path):
    from transformers import AutoTokenizer

    ids = tok.encode(K3).ids
    hf = AutoTokenizer.from_pretrained(str(model_path))
    expected = hf.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert expected == K3
    for step in (1, 2, 5):
        assert "".join(stream(tok, ids, skip=True, step=step)) == K3
    assert " ./src" in "".join(stream(tok, ids)) and "a ., b" in "".join(stream(tok, ids))


def test_skip_special_tokens_drops_fim_markers(tok):
    text = "<fim_prefix>def f():\n<fim_suffix>\n<fim_middle>    return 1<|endoftext|>"
    ids = tok.encode(text).ids
    assert ids.count(tok.token_to_id("<fim_middle>")) == 1
    skipped = "".join(stream(tok, ids, skip=True))
    assert "<fim_" not in skipped and "<|endoftext|>" not in skipped
    assert skipped == "def f():\n\n    return 1"
    assert "".join(stream(tok, ids, skip=False)) == text


def test_incomplete_character_at_the_end_is_flushed_as_replacement(tok):
    ids = tok.encode("🎉").ids
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tok, skip_special_tokens=False)
    assert detok.push(ids[:-1]) == ""
    assert detok.flush() == tok.decode(ids[:-1])
    assert REPLACEMENT in tok.decode(ids[:-1])


def test_any_token_sequence_streams_to_its_full_decode(tok):
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=300, deadline=None)
    @given(ids=st.lists(st.integers(min_value=0, max_value=tok.get_vocab_size() - 1), max_size=40),
           step=st.integers(min_value=1, max_value=4), skip=st.booleans())
    def check(ids, step, skip):
        deltas = stream(tok, ids, skip=skip, step=step)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)
        assert all(REPLACEMENT not in d or REPLACEMENT in tok.decode(ids, skip_special_tokens=skip) for d in deltas)

    check()
