"""The literal tokenization of FIM segments is cached by exact text (an editor sends the same suffix on every
keystroke): the cached ids equal a fresh encoding, a repeated text is not encoded again, and the cache is bounded."""

from __future__ import annotations

import asyncio

import pytest

from gateway import tokenizer as tokenizer_module


def test_a_repeated_text_comes_from_the_cache_and_equals_its_encoding(tokenizer) -> None:
    texts = ["def f(x):\n    return x\n", "", "<fim_prefix> is text here"]
    fresh = [list(e.ids) for e in tokenizer._literal.encode_batch(texts, add_special_tokens=False)]
    first = asyncio.run(tokenizer.encode_literal_many_async(texts))
    assert first == fresh and first[1] == []
    first[0].append(-1)  # a caller's list is its own
    real = tokenizer._literal

    class Refuses:
        def encode_batch(self, *args, **kwargs):
            raise AssertionError("encoded again")

    tokenizer._literal = Refuses()
    try:
        assert asyncio.run(tokenizer.encode_literal_many_async(texts[::-1])) == fresh[::-1]
        assert asyncio.run(tokenizer.encode_literal_async(texts[0])) == fresh[0]
    finally:
        tokenizer._literal = real


def test_the_cache_keeps_the_most_recent_texts_only(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenizer_module, "LITERAL_CACHE_ENTRIES", 3)
    tokenizer._literal_cache.clear()
    for t in ("a", "b", "c"):
        asyncio.run(tokenizer.encode_literal_async(t))
    asyncio.run(tokenizer.encode_literal_async("a"))  # most recent again
    asyncio.run(tokenizer.encode_literal_async("d"))  # evicts "b", the least recent
    assert list(tokenizer._literal_cache) == ["c", "a", "d"]
