"""The checkpoint's tokenizer (tokenizer.json via the `tokenizers` library), used by the gateway for
counting, validation, echo, logprob token strings and /tokenize, /detokenize.

Decoding never applies "clean up tokenization spaces": code whitespace is preserved exactly (case K3).
"""

from __future__ import annotations

import asyncio
import pathlib
from dataclasses import dataclass

from tokenizers import Tokenizer, decoders

from gateway.literal_tokens import LiteralTokens

INLINE_CHARS = 512  # literal pieces up to this many characters in all are tokenized on the event loop (no thread hop)


@dataclass(frozen=True)
class TokenPieces:
    """Per-token text of a token sequence.

    pieces[i] is the text that token i adds to the decoded string (may be "" when the token ends
    inside a multi-byte UTF-8 character; the completing token then carries the whole character).
    offsets[i] is the character offset where pieces[i] starts, counted from ``base_offset``.
    ``"".join(pieces)`` equals the decoded text.
    """

    pieces: tuple[str, ...]
    offsets: tuple[int, ...]


class GatewayTokenizer:
    """Wraps a ``tokenizers.Tokenizer``; ids are Python ints (the model's vocabulary ids)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        # a text's own ids, whatever tokenizer.json was saved with: padding would put pad ids into the pieces of
        # one encode_batch (the FIM prefix and suffix, a text's head and tail), truncation would cut a prompt
        # silently (the context check then never sees its length)
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tok = tokenizer
        # A second instance that tokenizes special-token text ("<fim_prefix>") as ordinary text; a copy, as the
        # flag is per instance and encode_async runs in other threads.
        literal = Tokenizer.from_str(tokenizer.to_str())
        literal.encode_special_tokens = True
        self._literal_tokens = LiteralTokens(literal)  # encode_literal_many_async's tokenizer and caches
        self._special_ids = frozenset(
            token_id for token_id, added in tokenizer.get_added_tokens_decoder().items() if added.special
        )
        self.max_token_chars = _max_token_chars(tokenizer)
        self._added = {token_id: added.content for token_id, added in tokenizer.get_added_tokens_decoder().items()}
        self._byte_level = isinstance(tokenizer.decoder, decoders.ByteLevel)

    def min_tokens(self, text: str) -> int | None:
        """A lower bound on ``len(encode(text))`` computed without tokenizing: ceil(chars / L), L being
        ``max_token_chars``. None when the tokenizer has a normalizer (it may shrink the text, so no
        bound is known)."""
        if self.max_token_chars is None:
            return None
        return -(-len(text) // self.max_token_chars)

    @staticmethod
    def from_file(path: pathlib.Path) -> "GatewayTokenizer":
        """Loads a tokenizer.json file (or ``path/tokenizer.json`` when path is a directory).
        Raises FileNotFoundError when it does not exist."""
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        return GatewayTokenizer(Tokenizer.from_file(str(path)))

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows, added tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``. Special-token text such as ``<fim_prefix>`` becomes its single id.
        No BOS/EOS is added."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    async def encode_async(self, text: str) -> list[int]:
        """``encode`` run in a worker thread through ``encode_batch`` (which releases the GIL, unlike
        ``encode``), so a long prompt being tokenized does not block the event loop."""
        encodings = await asyncio.to_thread(self._tok.encode_batch, [text], add_special_tokens=False)
        return list(encodings[0].ids)

    async def encode_literal_async(self, text: str) -> list[int]:
        """Token ids of ``text`` in which special-token text (``<fim_prefix>``, ``<|endoftext|>``) is tokenized
        as ordinary text, never as the special id (user text that must not forge a marker). Run in a worker
        thread like ``encode_async``. No BOS/EOS is added."""
        return (await self.encode_literal_many_async([text]))[0]

    async def encode_literal_many_async(self, texts: list[str]) -> list[list[int]]:
        """``encode_literal_async`` of each of ``texts``, through ``gateway.literal_tokens.LiteralTokens``: a text
        seen lately comes from its cache (an editor sends the same suffix on every keystroke), and a text whose
        head (up to its last line break) was seen lately is tokenized from there on (the prefix, one character
        longer each keystroke). What is left is tokenized in one ``encode_batch``: in a worker thread, or here
        when it is at most ``INLINE_CHARS`` characters (a thread hop costs more than that)."""
        literal = self._literal_tokens
        planned, pieces = literal.plan(texts)
        if sum(map(len, pieces)) <= INLINE_CHARS:
            encoded = literal.tokenize(pieces)
        else:
            encoded = await asyncio.to_thread(literal.tokenize, pieces)
        return literal.finish(texts, planned, pieces, encoded)

    def special_token_id(self, content: str) -> int | None:
        """The id of the added special token whose text is ``content`` (e.g. ``"<fim_prefix>"``), else None."""
        token_id = self._tok.token_to_id(content)
        return token_id if token_id is not None and token_id in self._special_ids else None

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` without any clean-up of tokenization spaces."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """Text of one token on its own (a lone byte of a multi-byte character decodes to U+FFFD)."""
        return self._tok.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (OpenAI's ``bytes``): for a byte-level BPE vocabulary entry, its bytes
        (a piece of a multi-byte character is that piece, never U+FFFD's bytes), so the bytes of a text's tokens
        joined are its UTF-8 bytes; an added token's content as UTF-8. For another decoder: its text's UTF-8.
        Raises ValueError for an id outside the vocabulary."""
        if token_id in self._added:
            return self._added[token_id].encode()
        if not self._byte_level:
            return self.token_text(token_id).encode()
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})")
        return bytes(_UNICODE_TO_BYTE[ch] for ch in piece)

    def is_special(self, token_id: int) -> bool:
        """True for added special tokens (e.g. ``<|endoftext|>``, ``<fim_prefix>``)."""
        return token_id in self._special_ids

    def pieces(self, ids: list[int], skip_special_tokens: bool = False, base_offset: int = 0) -> TokenPieces:
        """Splits the decoded text of ``ids`` into per-token pieces (see TokenPieces); an incomplete
        character at the very end is attached to the last token as decode renders it (U+FFFD)."""
        tracker = PieceTracker(self, skip_special_tokens, base_offset)
        result = tracker.add(ids)
        tail = tracker.tail()
        if tail and result.pieces:
            result = TokenPieces(pieces=result.pieces[:-1] + (result.pieces[-1] + tail,), offsets=result.offsets)
        return result


class PieceTracker:
    """Incremental per-token text of a growing token sequence (e.g. a streamed completion).

    Each step decodes a short window that starts at a character boundary, so the cost is linear in
    the number of tokens. A token that ends inside a multi-byte character gets piece "" and the
    token that completes the character carries it.
    """

    def __init__(self, tokenizer: GatewayTokenizer, skip_special_tokens: bool, base_offset: int = 0) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_start = 0  # window start (a character boundary)
        self._read_start = 0  # tokens before this index have been emitted
        self.offset = base_offset  # offset where the next piece starts

    def add(self, ids: list[int]) -> TokenPieces:
        """Pieces and start offsets of ``ids``, appended to the tokens seen so far."""
        pieces: list[str] = []
        offsets: list[int] = []
        for token_id in ids:
            self._ids.append(token_id)
            offsets.append(self.offset)
            if self._skip and self._tok.is_special(token_id):
                pieces.append("")
                continue
            prefix_text = self._tok.decode(self._ids[self._prefix_start : self._read_start], self._skip)
            full_text = self._tok.decode(self._ids[self._prefix_start :], self._skip)
            if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
                piece = full_text[len(prefix_text) :]
                self._prefix_start, self._read_start = self._read_start, len(self._ids)
            else:
                piece = ""
            pieces.append(piece)
            self.offset += len(piece)
        return TokenPieces(pieces=tuple(pieces), offsets=tuple(offsets))

    def tail(self) -> str:
        """Text of the trailing tokens that do not yet form a whole character ("" when none)."""
        if self._read_start >= len(self._ids):
            return ""
        window = self._ids[self._prefix_start :]
        done = self._tok.decode(self._ids[self._prefix_start : self._read_start], self._skip)
        return self._tok.decode(window, self._skip)[len(done) :]


def _unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-unicode table (the characters byte-level BPE vocabularies spell bytes with):
    printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100 onwards, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    table = {chr(b): b for b in kept}
    shifted = (b for b in range(256) if b not in table.values())
    for n, b in enumerate(shifted):
        table[chr(256 + n)] = b
    return table


_UNICODE_TO_BYTE = _unicode_to_byte()


def _max_token_chars(tokenizer: Tokenizer) -> int | None:
    """L: the most characters one token can cover in the input text, or None when the tokenizer has a
    normalizer. Measured on each id's decoded text (added/special tokens included, as their content
    is matched literally in the input). For byte-level BPE a token that ends or starts inside a
    multi-byte character decodes to U+FFFD for each partial character, so its decoded length is still
    at least the number of characters it touches; hence a text of C characters has >= ceil(C / L)
    tokens."""
    if tokenizer.normalizer is not None:
        return None
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    texts = tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    return max(max(len(t) for t in texts), 1)
