"""Turning request fields into validated prompts and sampling requests.

Context limit (documented in docs/api.md): a prompt of n_positions tokens or more is rejected with
400 naming both numbers; otherwise generation is capped at ``n_positions - prompt_tokens`` new tokens,
and a request that hits the cap finishes with finish_reason "length".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.errors import invalid
from gateway.settings import GatewaySettings
from gateway.tokenizer import GatewayTokenizer


@dataclass(frozen=True)
class PromptInput:
    """One prompt. ``text`` is the original string when the prompt came as text (echoed byte for
    byte), None when it came as token ids. ``ids`` are what the scheduler receives."""

    text: str | None
    ids: tuple[int, ...]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_ids(ids: list[int], settings: GatewaySettings, param: str) -> tuple[int, ...]:
    """Validates a token-id prompt: not empty, every id in [0, vocab_size), shorter than n_positions.
    Raises ApiError 400 naming the problem."""
    if not ids:
        raise invalid(f"{param} is empty: give at least one token", param)
    vocab = settings.model.vocab_size
    # one pass in C for the common case (every id a plain int in range); the loop only to name the bad one
    fine = set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) < vocab
    for position, token_id in enumerate(() if fine else ids):
        if not _is_int(token_id) or token_id < 0 or token_id >= vocab:
            raise invalid(
                f"{param} has token id {token_id!r} at position {position}; ids must be integers in [0, {vocab})",
                param,
            )
    limit = settings.model.n_positions
    if len(ids) >= limit:
        raise invalid(
            f"{param} has {len(ids)} tokens, but the context limit (n_positions) is {limit} tokens; "
            f"the prompt must be shorter than {limit} tokens",
            param,
        )
    return tuple(ids)


async def text_prompt(text: str, tokenizer: GatewayTokenizer, settings: GatewaySettings, param: str) -> PromptInput:
    """Tokenizes (in a worker thread) and validates one text prompt. Raises ApiError 400 for "" or a
    prompt that is too long; a text so long that even ceil(chars / L) tokens (L: the longest token's
    characters) reach the context limit is rejected before tokenizing."""
    if text == "":
        raise invalid(f"{param} is empty: give at least one character", param)
    limit = settings.model.n_positions
    at_least = tokenizer.min_tokens(text)
    if at_least is not None and at_least >= limit:
        raise invalid(
            f"{param} has {len(text)} characters, so it is at least {at_least} tokens (no token is longer than "
            f"{tokenizer.max_token_chars} characters), but the context limit (n_positions) is {limit} tokens; "
            f"the prompt must be shorter than {limit} tokens",
            param,
        )
    return PromptInput(text=text, ids=check_ids(await tokenizer.encode_async(text), settings, param))


async def parse_completion_prompt(
    prompt: Any, tokenizer: GatewayTokenizer, settings: GatewaySettings, param: str = "prompt"
) -> list[PromptInput]:
    """Accepts a string, a list of strings, a list of token ids, or a list of token-id lists.
    Raises ApiError 400 for anything else, an empty prompt or list, or too many prompts."""
    if isinstance(prompt, str):
        return [await text_prompt(prompt, tokenizer, settings, param)]
    if not isinstance(prompt, list):
        raise invalid(f"{param} must be a string, a list of strings, a list of token ids or a list of "
                      f"token-id lists, not {type(prompt).__name__}", param)
    if not prompt:
        raise invalid(f"{param} is an empty list", param)
    if all(_is_int(item) for item in prompt):
        return [PromptInput(text=None, ids=check_ids(prompt, settings, param))]
    if len(prompt) > settings.max_prompts:
        raise invalid(f"{param} has {len(prompt)} prompts; the limit is {settings.max_prompts}", param)
    if all(isinstance(item, str) for item in prompt):
        return [await text_prompt(item, tokenizer, settings, f"{param}[{i}]") for i, item in enumerate(prompt)]
    if all(isinstance(item, list) for item in prompt):
        return [PromptInput(text=None, ids=check_ids(item, settings, f"{param}[{i}]")) for i, item in enumerate(prompt)]
    raise invalid(f"{param} mixes types: give strings only, token ids only, or token-id lists only", param)


def cap_new_tokens(max_tokens: int, prompt: PromptInput, settings: GatewaySettings) -> int:
    """``max_tokens`` capped so that prompt + generated tokens stay within n_positions."""
    return min(max_tokens, settings.model.n_positions - len(prompt.ids))


def parse_stop(stop: str | list[str] | None, settings: GatewaySettings, param: str = "stop") -> tuple[str, ...]:
    """Stop strings as a tuple. Raises ApiError 400 for an empty string, too many, or too long ones."""
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > settings.max_stop_strings:
        raise invalid(f"{param} has {len(stops)} strings; the limit is {settings.max_stop_strings}", param)
    for s in stops:
        if s == "":
            raise invalid(f"{param} contains an empty string", param)
        if len(s) > settings.max_stop_chars:
            raise invalid(f"{param} has a string of {len(s)} characters; the limit is {settings.max_stop_chars}",
                          param)
    return tuple(stops)


def parse_stop_token_ids(ids: list[int] | None, settings: GatewaySettings,
                         param: str = "stop_token_ids") -> tuple[int, ...]:
    """Stop token ids as a tuple. Raises ApiError 400 for ids outside the vocabulary."""
    if not ids:
        return ()
    for token_id in ids:
        if token_id < 0 or token_id >= settings.model.vocab_size:
            raise invalid(f"{param} has {token_id}; ids must be in [0, {settings.model.vocab_size})", param)
    return tuple(ids)


def check_n(n: int, prompts: int, settings: GatewaySettings) -> None:
    """Raises ApiError 400 when n or prompts * n is above the limit."""
    if n > settings.max_n:
        raise invalid(f"n is {n}; the limit is {settings.max_n}", "n")
    if prompts * n > settings.max_prompts:
        raise invalid(f"{prompts} prompts x n={n} = {prompts * n} generations; the limit is {settings.max_prompts}",
                      "n")


def check_logprobs(count: int | None, settings: GatewaySettings, param: str = "logprobs") -> None:
    """Raises ApiError 400 when more than max_logprobs alternatives are asked."""
    if count is not None and count > settings.max_logprobs:
        raise invalid(f"{param} is {count}; the limit is {settings.max_logprobs}", param)
