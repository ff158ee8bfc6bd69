"""A checkpoint whose tokenizer.json was saved with padding (or truncation) enabled: the gateway still sends each
text's own ids. Its literal tokenizations (the FIM prefix and suffix, and a text's head and tail) go through one
``encode_batch``, which pads every piece to the longest: the FIM prompt then carried pad ids in the middle of the
user's code."""

from __future__ import annotations

import asyncio

from tokenizers import Tokenizer

from gateway.tokenizer import GatewayTokenizer
from worker_svc.model.default import build_tokenizer_json

LONG = "def f(x):\n    return x * 2 + 1\n"
SHORT = "y"


def plain() -> Tokenizer:
    tok = Tokenizer.from_str(build_tokenizer_json())
    tok.encode_special_tokens = True
    return tok


def expected(text: str) -> list[int]:
    return list(plain().encode(text, add_special_tokens=False).ids)


def test_padding_in_tokenizer_json_adds_no_pad_ids() -> None:
    tok = Tokenizer.from_str(build_tokenizer_json())
    tok.enable_padding(pad_id=0, pad_token="<|endoftext|>")
    gateway = GatewayTokenizer(tok)
    got = asyncio.run(gateway.encode_literal_many_async([LONG, SHORT]))
    assert got == [expected(LONG), expected(SHORT)]
    assert gateway.encode(SHORT) == expected(SHORT)


def test_truncation_in_tokenizer_json_cuts_no_text() -> None:
    tok = Tokenizer.from_str(build_tokenizer_json())
    tok.enable_truncation(max_length=4)
    gateway = GatewayTokenizer(tok)
    assert len(expected(LONG)) > 4
    assert asyncio.run(gateway.encode_literal_many_async([LONG])) == [expected(LONG)]
    assert gateway.encode(LONG) == expected(LONG)
    assert asyncio.run(gateway.encode_async(LONG)) == expected(LONG)
