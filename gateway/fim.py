"""Fill-in-the-middle prompts: the ``suffix`` field of /v1/completions and /generate.

The marker ids are read from the checkpoint's tokenizer: the first family in FAMILIES whose three markers
are all special tokens of it (StarCoder spells them ``<fim_prefix>``, SantaCoder ``<fim-prefix>``). The prompt
is built from ids, never from text: the user's prefix and suffix are tokenized with special-token text taken
literally (``GatewayTokenizer.encode_literal_async``), so a ``<fim_suffix>`` typed inside the user's code is
ordinary text and cannot forge a marker; the markers go in as their ids.

Layouts (``fim_mode``), as StarCoder was trained (bigcode Megatron-LM):

- ``psm`` (default): ``<fim_prefix>`` prefix ``<fim_suffix>`` suffix ``<fim_middle>``
- ``spm``: ``<fim_prefix><fim_suffix>`` suffix ``<fim_middle>`` prefix

What the prefix cache can reuse (docs/api.md): in PSM everything up to the first token that changed in the
prefix (the same file prefix with another suffix reuses the whole prefix); in SPM everything up to the first
changed token of the suffix, then of the prefix (typing at the cursor, where the suffix stays and the prefix
grows, reuses the suffix and the old prefix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.errors import invalid
from gateway.prompts import PromptInput, check_ids
from gateway.settings import GatewaySettings
from gateway.tokenizer import GatewayTokenizer

FimMode = Literal["psm", "spm"]

# (family, prefix, suffix, middle) marker texts; the ids are the tokenizer's.
FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    ("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("santacoder", "<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
)
# Generation of a middle also stops at these special tokens, when the tokenizer has them (StarCoder 2's
# file separator: a model that writes one has left the middle).
STOP_MARKERS: tuple[str, ...] = ("<file_sep>",)


@dataclass(frozen=True)
class FimMarkers:
    """The FIM marker token ids of one tokenizer; ``stop_ids`` are extra stop tokens of a FIM request."""

    family: str
    prefix: int
    suffix: int
    middle: int
    stop_ids: tuple[int, ...]


def fim_markers(tokenizer: GatewayTokenizer) -> FimMarkers | None:
    """The tokenizer's FIM markers, or None when it has no complete family of them as special tokens."""
    stops = tuple(i for i in (tokenizer.special_token_id(t) for t in STOP_MARKERS) if i is not None)
    for family, prefix, suffix, middle in FAMILIES:
        ids = [tokenizer.special_token_id(t) for t in (prefix, suffix, middle)]
        if None not in ids:
            return FimMarkers(family, ids[0], ids[1], ids[2], stops)
    return None


def require_markers(tokenizer: GatewayTokenizer, param: str = "suffix") -> FimMarkers:
    """The tokenizer's FIM markers. Raises ApiError 400 naming ``param`` when the model has none."""
    markers = fim_markers(tokenizer)
    if markers is None:
        names = ", ".join(f"{p} {s} {m}" for _, p, s, m in FAMILIES)
        raise invalid(f"{param} (fill-in-the-middle) needs a model whose tokenizer has FIM special tokens "
                      f"({names}); this model's tokenizer has none", param)
    return markers


def layout(markers: FimMarkers, prefix_ids: list[int], suffix_ids: list[int], mode: FimMode) -> list[int]:
    """The FIM prompt ids of ``mode`` ("psm" or "spm", see the module docstring). Raises ValueError for
    another mode."""
    if mode == "psm":
        return [markers.prefix, *prefix_ids, markers.suffix, *suffix_ids, markers.middle]
    if mode == "spm":
        return [markers.prefix, markers.suffix, *suffix_ids, markers.middle, *prefix_ids]
    raise ValueError(f"unknown FIM mode {mode!r}")


async def fim_prompt(prefix: str, suffix: str, markers: FimMarkers, tokenizer: GatewayTokenizer,
                     settings: GatewaySettings, mode: FimMode, param: str) -> PromptInput:
    """The FIM prompt of one prefix (the request's prompt ``param``) and ``suffix``; either may be "".
    ``text`` is the prefix (what echo returns). Raises ApiError 400 naming ``param`` when the prompt reaches
    the context limit (checked before tokenizing when the characters alone prove it)."""
    limit = settings.model.n_positions
    at_least = tokenizer.min_tokens(prefix + suffix)
    if at_least is not None and at_least + 3 >= limit:
        raise invalid(f"{param} and suffix have {len(prefix) + len(suffix)} characters, so with the 3 FIM markers "
                      f"they are at least {at_least + 3} tokens, but the context limit (n_positions) is {limit} "
                      f"tokens; the prompt must be shorter than {limit} tokens", param)
    prefix_ids, suffix_ids = await tokenizer.encode_literal_many_async([prefix, suffix])  # "" -> []
    ids = layout(markers, prefix_ids, suffix_ids, mode)
    if len(ids) >= limit:
        raise invalid(f"the FIM prompt ({param} {len(prefix_ids)} tokens + suffix {len(suffix_ids)} tokens + 3 "
                      f"markers) has {len(ids)} tokens, but the context limit (n_positions) is {limit} tokens; "
                      f"the prompt must be shorter than {limit} tokens", param)
    return PromptInput(text=prefix, ids=check_ids(ids, settings, param))


async def fim_prompts(prompt: object, suffix: str, mode: FimMode, tokenizer: GatewayTokenizer,
                      settings: GatewaySettings, param: str = "prompt") -> list[PromptInput]:
    """FIM prompts for a text ``prompt`` (a string or a list of strings, each a prefix) and one ``suffix``.
    Raises ApiError 400 naming ``suffix`` when the model has no FIM tokens, ``param`` when the prompt is not
    text (token ids cannot be split into prefix and suffix), an empty list, or too many prompts."""
    markers = require_markers(tokenizer)
    if isinstance(prompt, str):
        return [await fim_prompt(prompt, suffix, markers, tokenizer, settings, mode, param)]
    if not isinstance(prompt, list) or not all(isinstance(p, str) for p in prompt):
        ids = isinstance(prompt, list) and prompt and all(isinstance(p, (int, list)) for p in prompt)
        got = "token ids (which cannot be split at the cursor)" if ids else f"{type(prompt).__name__} {prompt!r:.40}"
        raise invalid(f"with suffix, {param} must be a string or a list of strings (the text before the "
                      f"cursor), not {got}", param)
    if not prompt:
        raise invalid(f"{param} is an empty list", param)
    if len(prompt) > settings.max_prompts:
        raise invalid(f"{param} has {len(prompt)} prompts; the limit is {settings.max_prompts}", param)
    return [await fim_prompt(p, suffix, markers, tokenizer, settings, mode, f"{param}[{i}]")
            for i, p in enumerate(prompt)]


def fim_stop_ids(tokenizer: GatewayTokenizer, stop_token_ids: tuple[int, ...]) -> tuple[int, ...]:
    """``stop_token_ids`` plus the FIM stop markers the tokenizer has (EOS stops every request anyway)."""
    markers = require_markers(tokenizer)
    return stop_token_ids + tuple(i for i in markers.stop_ids if i not in stop_token_ids)
