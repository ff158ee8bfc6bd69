"""Incremental detokenization that never emits a partial UTF-8 character.

Semantics equal ``tokenizer.decode(ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)``
of the whole output: the concatenation of every ``push`` and the final ``flush`` is that text (case K3).
The `tokenizers` library never cleans up tokenization spaces (that is a `transformers` post-step), so
spaces before punctuation in code survive.
"""

from __future__ import annotations

import pathlib

from tokenizers import Tokenizer

REPLACEMENT = "\ufffd"


def load_tokenizer(model_path: str | pathlib.Path) -> Tokenizer:
    """Loads ``<model_path>/tokenizer.json``, with any padding or truncation it was saved with turned off (a text
    prompt's own ids: truncation would cut it silently, before the context check sees its length). Raises
    FileNotFoundError naming the path when it is missing."""
    path = pathlib.Path(model_path) / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(f"tokenizer.json not found at {path}")
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text deltas.

    Keeps two offsets into the ids: ``prefix`` (start of the decode window) and ``read`` (end of what
    was emitted). Both always sit on character boundaries, so decoding the window is exact for
    byte-level tokenizers. A delta is emitted only when the window's text does not end in an
    incomplete character (U+FFFD); ``flush`` emits whatever is left at the end of the request.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        # skip_special_tokens passed by position: a keyword costs the Rust binding more than the decode of a
        # few ids (called twice per push, once per request per Forward)
        return self._tok.decode(ids, self._skip) if ids else ""

    def push(self, token_ids: list[int]) -> str:
        """Adds token ids (ints) and returns the new complete text (possibly "")."""
        ids = self._ids
        ids.extend(token_ids)
        prefix_text = self._decode(ids[self._prefix:self._read])
        full_text = self._decode(ids[self._prefix:])
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT):
            return ""
        delta = full_text[len(prefix_text):]
        self._prefix, self._read = self._read, len(ids)
        return delta

    @property
    def holding(self) -> bool:
        """True when pushed ids are not emitted yet (their text ends in an incomplete character)."""
        return self._read < len(self._ids)

    def mark(self) -> tuple[int, int, int]:
        """A point to ``rewind`` to (pushes after it are undone)."""
        return len(self._ids), self._prefix, self._read

    def rewind(self, mark: tuple[int, int, int]) -> None:
        """Undoes the pushes made since ``mark``."""
        n, self._prefix, self._read = mark
        del self._ids[n:]

    def flush(self) -> str:
        """Returns the text still held back (an incomplete character at the end decodes as U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        full_text = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return full_text[len(prefix_text):]
