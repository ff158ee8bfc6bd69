"""The worker's record of one request: the slot table and token history of every token whose K/V it wrote (or was
told is cached), what ``Engine.commit`` grows and a multi-step launch validates against."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


class SlotTable:
    """A request's slot table: a growable int32 array (``view()`` is the live prefix, no copy)."""

    def __init__(self, slots=()):
        self._buf = np.asarray(slots, dtype=np.int32).copy()
        self._n = len(self._buf)

    def __len__(self) -> int:
        return self._n

    def __iter__(self):
        return iter(self.view().tolist())

    def view(self) -> np.ndarray:
        return self._buf[: self._n]

    def extend(self, slots) -> None:
        """Appends ``slots`` (a sequence of ints or an int array)."""
        need = self._n + len(slots)
        if need > len(self._buf):
            grown = np.empty(max(need, 2 * len(self._buf), 16), dtype=np.int32)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n:need] = slots
        self._n = need


@dataclass
class RequestState:
    """Worker-side state of one request: ``slots[i]`` holds the K/V of ``tokens[i]`` (position i).
    ``last_token``: the token its last Forward sampled (None when it sampled none); ``stopped``: that token
    is one of the item's stop_token_ids (the request is finished)."""

    slots: SlotTable
    tokens: list[int]
    prompt_len: int
    last_hidden: torch.Tensor | None = field(default=None, repr=False)  # [n_embd], for prompt logprobs
    last_token: int | None = None
    stopped: bool = False
    created_seq: int = 0  # seq of the Forward whose has_prefix item created this state (0: none given)
    commits: int = 0  # commits into this state (``Engine.commit``): what a step metadata built ahead checks
