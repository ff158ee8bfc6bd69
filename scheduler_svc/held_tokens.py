"""Output tokens held back with their text, so that a stream message carries exactly the text of its tokens.

Text is held back for two reasons: the detokenizer holds the bytes of an incomplete UTF-8 character, and the
stop-string matcher holds text that may still become a stop string. A token goes out only with all of its
text: when the matcher lets through part of a token's text, the token and that part wait until the rest
is let through too. So, for every message but a request's last one: the text is non-empty and is the decoded
text of exactly the message's tokens, and their logprobs describe that text. The last message takes every
token still held; its text ends where the answer ends (a stop string is trimmed, EOS and stop token ids have no
text), so it may be shorter than its tokens' text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codeserve.v1 import common_pb2


@dataclass
class Released:
    """Tokens (ids, logprobs, top logprobs; aligned) and the text they carry in one message."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[common_pb2.TopLogprobs] = field(default_factory=list)
    text: str = ""


class HeldTokens:
    """Tokens not sent yet and their text, fed in order (``add``, ``add_text``), let through by the stop matcher
    (``release``), and taken for a message (``take`` while running, ``take_all`` for the last message)."""

    def __init__(self) -> None:
        self._held = Released()
        self._ends: list[int] = []  # per held token: where its text ends in the held text (-1: not complete yet)
        self._released = 0  # characters of the held text the stop matcher let through

    def __bool__(self) -> bool:
        return bool(self._held.token_ids) or bool(self._held.text)

    def add(self, token_id: int, logprob: float, top: common_pb2.TopLogprobs | None, text: str,
            complete: bool) -> None:
        """Holds one token and the text its detokenization added (``text``: "" while its character is incomplete,
        ``complete`` False: then it goes out with the token that completes it; a stop token id: "", True)."""
        held = self._held
        held.token_ids.append(token_id)
        held.logprobs.append(logprob)
        if top is not None:
            held.top_logprobs.append(top)
        held.text += text
        self._ends.append(len(held.text) if complete else -1)

    def add_text(self, text: str) -> None:
        """Appends text of the held tokens that came later (the detokenizer's flush at the end)."""
        self._held.text += text

    def release(self, chars: int) -> None:
        """The stop matcher let the next ``chars`` characters of the held text through."""
        self._released += chars
        if self._released > len(self._held.text):
            raise ValueError(f"released {self._released} characters of {len(self._held.text)} held")

    def take(self) -> Released | None:
        """The longest run of held tokens whose whole text is let through and not empty (None when there is
        none): removed from what is held."""
        k = next((i for i in range(len(self._ends) - 1, -1, -1) if 0 < self._ends[i] <= self._released), None)
        if k is None:
            return None
        end, held = self._ends[k], self._held
        out = Released(held.token_ids[:k + 1], held.logprobs[:k + 1], held.top_logprobs[:k + 1], held.text[:end])
        self._held = Released(held.token_ids[k + 1:], held.logprobs[k + 1:], held.top_logprobs[k + 1:],
                              held.text[end:])
        self._ends = [e - end if e >= 0 else -1 for e in self._ends[k + 1:]]
        self._released -= end
        return out

    def take_all(self) -> Released:
        """Every held token, with the text let through (the request's last message); nothing is held after."""
        out = self._held
        out.text = out.text[:self._released]
        self._held, self._ends, self._released = Released(), [], 0
        return out
