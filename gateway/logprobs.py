"""Logprobs in the OpenAI formats.

Legacy completions format: ``{"tokens": [str], "token_logprobs": [float | None],
"top_logprobs": [dict[str, float] | None], "text_offset": [int]}``; ``tokens[i]`` is the text of
token i on its own, ``top_logprobs[i]`` holds the requested alternatives plus the chosen token,
``text_offset[i]`` is the character offset of token i in the returned text (echoed prompt included).
For an echoed prompt the first entry of token_logprobs and top_logprobs is null (nothing predicts
the first token).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.generation import TopEntries
from gateway.tokenizer import GatewayTokenizer, PieceTracker


@dataclass
class LegacyLogprobs:
    """The four parallel lists of the legacy format, built up chunk by chunk."""

    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        """The JSON object of the legacy format."""
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }


def _top_dict(tokenizer: GatewayTokenizer, chosen: int, chosen_logprob: float, top: TopEntries,
              count: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for token_id, logprob in top[:count]:
        out.setdefault(tokenizer.token_text(token_id), logprob)
    out.setdefault(tokenizer.token_text(chosen), chosen_logprob)
    return out


def legacy_logprobs(
    tokenizer: GatewayTokenizer,
    tracker: PieceTracker,
    token_ids: tuple[int, ...] | list[int],
    logprobs: tuple[float | None, ...] | list[float | None],
    top: tuple[TopEntries | None, ...] | list[TopEntries | None],
    count: int,
) -> LegacyLogprobs:
    """Legacy logprobs of ``token_ids`` (offsets continue from ``tracker``, which advances).

    ``logprobs[i]`` None (the first prompt token) gives null entries. ``top`` may be shorter than
    ``token_ids`` only when ``count`` is 0. Raises ValueError when the lists disagree in length.
    """
    if len(logprobs) != len(token_ids):
        raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} logprobs from the scheduler")
    if count > 0 and len(top) != len(token_ids):
        raise ValueError(f"{len(token_ids)} tokens but {len(top)} top-logprob lists from the scheduler")
    pieces = tracker.add(list(token_ids))
    out = LegacyLogprobs()
    for i, token_id in enumerate(token_ids):
        out.tokens.append(tokenizer.token_text(token_id))
        out.text_offset.append(pieces.offsets[i])
        logprob = logprobs[i]
        out.token_logprobs.append(logprob)
        if logprob is None:
            out.top_logprobs.append(None)
        else:
            entries = top[i] if i < len(top) and top[i] is not None else ()
            out.top_logprobs.append(_top_dict(tokenizer, token_id, logprob, entries, count))
    return out


def merge(first: LegacyLogprobs, second: LegacyLogprobs) -> LegacyLogprobs:
    """``first`` followed by ``second``."""
    return LegacyLogprobs(
        tokens=first.tokens + second.tokens,
        token_logprobs=first.token_logprobs + second.token_logprobs,
        top_logprobs=first.top_logprobs + second.top_logprobs,
        text_offset=first.text_offset + second.text_offset,
    )


def prompt_logprob_lists(
    prompt_ids: tuple[int, ...], prompt_logprobs: tuple[float, ...], prompt_top: tuple[TopEntries, ...]
) -> tuple[list[float | None], list[TopEntries | None]]:
    """Aligns the scheduler's prompt logprobs (one per prompt token after the first) with the
    prompt tokens: a leading None. Raises ValueError when the scheduler sent the wrong count."""
    if len(prompt_logprobs) != max(len(prompt_ids) - 1, 0):
        raise ValueError(
            f"scheduler sent {len(prompt_logprobs)} prompt logprobs for {len(prompt_ids)} prompt tokens "
            f"(expected {len(prompt_ids) - 1})"
        )
    tops: list[TopEntries | None] = [None, *prompt_top]
    return [None, *prompt_logprobs], tops
