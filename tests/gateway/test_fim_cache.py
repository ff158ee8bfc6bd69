"""The literal tokenization of FIM segments is cached by exact text (an editor sends the same suffix on every
keystroke): the cached ids equal a fresh encoding and a repeated text is not encoded again, through the gateway's
tokenizer (the caches themselves: tests/gateway/test_literal_tokens.py)."""

from __future__ import annotations

import asyncio



def test_a_repeated_text_comes_from_the_cache_and_equals_its_encoding(tokenizer) -> None:
    texts = ["def f(x):\n    return x\n", "", "<fim_prefix> is text here"]
    fresh = [list(e.ids) for e in tokenizer._literal_tokens._tok.encode_batch(texts, add_special_tokens=False)]
    first = asyncio.run(tokenizer.encode_literal_many_async(texts))
    assert first == fresh and first[1] == []
    first[0].append(-1)  # a caller's list is its own
    real = tokenizer._literal_tokens._tok

    class Refuses:
        def encode_batch(self, *args, **kwargs):
            raise AssertionError("encoded again")

    tokenizer._literal_tokens._tok = Refuses()
    try:
        assert asyncio.run(tokenizer.encode_literal_many_async(texts[::-1])) == fresh[::-1]
        assert asyncio.run(tokenizer.encode_literal_async(texts[0])) == fresh[0]
    finally:
        tokenizer._literal_tokens._tok = real
