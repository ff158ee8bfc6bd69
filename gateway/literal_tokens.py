"""Literal tokenization (special-token text as ordinary text) of the texts an editor sends again and again.

An editor sends a completion on every keystroke: the suffix is the same text each time, and the prefix is the
previous keystroke's prefix with one more character. Two caches make that cheap, both exact:

- texts: the ids of the last ``TEXT_ENTRIES`` texts, by exact text (the suffix);
- heads: for a tokenizer whose pre-tokenization cannot join across a line break (``splits_at_line_breaks``), a
  text is tokenized as its head (up to the last line break that follows a printable ASCII character) and its tail
  (that line break onwards) apart, and the heads' ids are kept (``HEAD_ENTRIES``): a keystroke's prefix shares its
  head with the previous one, so only the tail, the cursor's line so far, is tokenized.

Why a head and a tail tokenize apart to the ids of the whole: a ByteLevel pre-tokenizer with its regex (GPT-2's:
letters, numbers, other symbols, whitespace runs; optionally after splitting digits one by one, as StarCoder's
does) ends a piece at a printable non-space character followed by a line break, since no piece class holds both,
and starts the next piece at the line break whatever follows (the regex's only look-ahead, ``\\s+(?!\\S)``, is about
where a whitespace run ends, and the head ends in none). BPE merges within a piece. So with no normalizer and no
added token that text could match (every added token special, which a literal encoding treats as text), the pieces,
and so the ids, of head + tail are the pieces of the head then those of the tail. Any other tokenizer is tokenized
whole (``tests/gateway/test_literal_tokens.py`` checks the equality on generated code and on the embedded one).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from tokenizers import Tokenizer

TEXT_ENTRIES = 256   # whole texts kept (the suffix of every typist, the prompts seen lately)
HEAD_ENTRIES = 64    # heads kept (a typist's file up to the cursor's line)


def splits_at_line_breaks(tokenizer_json: dict) -> bool:
    """True when the tokenizer (its ``tokenizer.json`` as a dict) tokenizes text split before a line break that
    follows a printable ASCII character to the same ids as the whole (see the module docstring): no normalizer,
    a BPE model, a pre-tokenizer that is ByteLevel (no prefix space, its regex on) alone or after Digits, and
    no added token that is not special."""
    if tokenizer_json.get("normalizer") is not None or tokenizer_json.get("model", {}).get("type") != "BPE":
        return False
    if any(not t.get("special", False) for t in tokenizer_json.get("added_tokens", [])):
        return False
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel":
        return False
    last = steps[-1]
    if last.get("add_prefix_space", True) or not last.get("use_regex", True):
        return False
    return all(s.get("type") == "Digits" for s in steps[:-1])


def split_point(text: str) -> int:
    """The index of the last line break of ``text`` that follows a printable ASCII character (``!``..``~``), 0
    when there is none: ``text[:i]`` is the head, ``text[i:]`` the tail."""
    i = text.rfind("\n")
    while i > 0 and not "!" <= text[i - 1] <= "~":
        i = text.rfind("\n", 0, i)
    return max(i, 0)


class LiteralTokens:
    """The two caches over ``literal`` (a Tokenizer whose ``encode_special_tokens`` is on). ``plan`` says what to
    tokenize for a list of texts, ``finish`` puts the pieces' ids together; the caller runs the tokenizer in
    between (in a worker thread or not). One thread at a time (the gateway's event loop)."""

    def __init__(self, literal: Tokenizer) -> None:
        self._tok = literal
        self.splits = splits_at_line_breaks(json.loads(literal.to_str()))
        self._texts: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._heads: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    def plan(self, texts: Sequence[str]) -> tuple[list[Planned], list[str]]:
        """(per text what is known of it now, the distinct pieces to tokenize for the rest). What is known is
        taken now: another call's ``finish`` in between may evict it from the caches."""
        planned: list[Planned] = []
        pieces: dict[str, None] = {}
        for text in texts:
            ids = self._texts.get(text)
            if ids is not None:
                self._texts.move_to_end(text)
                planned.append(Planned(ids, "", ()))
                continue
            at = split_point(text) if self.splits else 0
            head, tail = text[:at], text[at:]
            head_ids = self._heads.get(head) if head else ()
            if head_ids is None:
                pieces[head] = None
            else:
                if head:
                    self._heads.move_to_end(head)
            pieces[tail] = None
            planned.append(Planned(None, head, head_ids, tail))
        return planned, list(pieces)

    def finish(self, texts: Sequence[str], planned: list["Planned"], pieces: list[str],
               encoded: list[Sequence[int]]) -> list[list[int]]:
        """Each text's ids: known ones as they are, the others put together from ``encoded`` (the ids of
        ``pieces``, in order, as ``plan`` returned them); the new texts and heads enter the caches."""
        fresh = dict(zip(pieces, (tuple(e) for e in encoded)))
        out = []
        for text, p in zip(texts, planned):
            ids = p.ids
            if ids is None:
                head_ids = p.head_ids
                if head_ids is None:
                    head_ids = fresh[p.head]
                    _put(self._heads, p.head, head_ids, HEAD_ENTRIES)
                ids = head_ids + fresh[p.tail]
                _put(self._texts, text, ids, TEXT_ENTRIES)
            out.append(list(ids))
        return out

    def tokenize(self, pieces: list[str]) -> list[list[int]]:
        """The ids of each of ``pieces`` (``plan``'s), in one ``encode_batch`` (it releases the GIL: any thread)."""
        return [e.ids for e in self._tok.encode_batch(pieces, add_special_tokens=False)] if pieces else []

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """``plan``, ``tokenize`` on this thread, ``finish``: the ids of each text."""
        planned, pieces = self.plan(texts)
        return self.finish(texts, planned, pieces, self.tokenize(pieces))


@dataclass(frozen=True)
class Planned:
    """What ``LiteralTokens.plan`` knew of one text: its whole ``ids`` (cached), or its ``head`` (possibly "")
    with the head's ids (``head_ids``; None: to tokenize) and its ``tail`` (always tokenized)."""

    ids: tuple[int, ...] | None
    head: str
    head_ids: tuple[int, ...] | None
    tail: str = ""


def _put(cache: OrderedDict, key: str, value: tuple[int, ...], limit: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    if len(cache) > limit:
        cache.popitem(last=False)
