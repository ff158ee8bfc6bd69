"""Prefix stored/removed events of one pool, with sequence numbers, retained in a bounded window."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class PrefixEvent:
    """kind: "stored", "removed" or "flushed"; token_ids: the full prefix from the root; num_tokens: the
    node's own length. Sequence numbers start at 1 and increase by 1 per pool."""

    sequence: int
    pool_id: str
    kind: str
    namespace: str
    token_ids: tuple[int, ...]
    num_tokens: int


class EventLog:
    """Append-only, bounded: the last ``retain`` events holding at most ``retain_tokens`` prefix tokens in all
    (oldest dropped; the newest always kept). Thread safe; readers can wait for new events."""

    def __init__(self, pool_id: str, retain: int = 10_000, retain_tokens: int = 2_000_000) -> None:
        self.pool_id = pool_id
        self._events: deque[PrefixEvent] = deque()
        self._retain, self._retain_tokens, self._tokens = retain, retain_tokens, 0
        self._seq = 0
        self._cond = threading.Condition()

    def append(self, kind: str, namespace: str, token_ids: Sequence[int], num_tokens: int) -> None:
        """Records an event (``token_ids``: kept as a tuple; a tuple is kept as it is, not copied)."""
        with self._cond:
            self._seq += 1
            self._events.append(PrefixEvent(self._seq, self.pool_id, kind, namespace, tuple(token_ids), num_tokens))
            self._tokens += len(token_ids)
            while len(self._events) > 1 and (len(self._events) > self._retain or self._tokens > self._retain_tokens):
                self._tokens -= len(self._events.popleft().token_ids)
            self._cond.notify_all()

    @property
    def last_sequence(self) -> int:
        return self._seq

    def since(self, sequence: int, timeout: float = 0.0) -> list[PrefixEvent]:
        """Retained events with sequence > ``sequence``; waits up to ``timeout`` seconds when there are none."""
        with self._cond:
            if self._seq <= sequence and timeout > 0:
                self._cond.wait(timeout)
            return [e for e in self._events if e.sequence > sequence]
