"""The calls of one HTTP request with several generations are queued or refused together.

A prompt list or n > 1 reaches the scheduler as one Generate call a generation, sharing
``GenerateRequest.group_id`` and carrying ``group_size``. The queue limits (--max-queued-requests,
--max-queued-tokens) are checked on the first call of a group to arrive; once that one is queued, the group's other
calls are queued over the limits. So a request whose generations alone pass a limit runs when nothing else waits
("a request alone in the queue is always taken", docs/operations.md), where checking each call on its own refused
one part-way through its own siblings with a 429 that no retry could ever get past (200 prompts of 4,095 tokens
against 524,288 queued tokens: the 129th call was refused, with the queue holding only its siblings). A group over
the limits while others wait is refused at its first call, before any sibling is queued. A group's calls may queue
past the limits by at most the gateway's --max-prompts calls, each within the context limit.

A group whose other calls never come (its HTTP request failed or left part-way, or its calls went to other replicas)
is forgotten ``ttl_s`` seconds after its first call.
"""

from __future__ import annotations

import time
from typing import Callable


class GroupAdmission:
    """Groups whose first call was queued and whose other calls are still to come. Used from the gRPC server's event
    loop only (every Generate handler's set-up runs there): not thread-safe."""

    def __init__(self, ttl_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self._open: dict[str, tuple[int, float]] = {}  # group id -> (calls still to come, forgotten at)

    def joins(self, group_id: str, size: int) -> bool:
        """True when this call belongs to a group whose first call was queued (then one fewer is expected): it is
        queued over the limits. False for a call alone, a group's first call, or a group forgotten."""
        if size <= 1 or not group_id:
            return False
        entry = self._open.get(group_id)
        if entry is None:
            return False
        left, forget_at = entry
        expired = self.clock() >= forget_at
        if left <= 1 or expired:
            del self._open[group_id]
        else:
            self._open[group_id] = (left - 1, forget_at)
        return not expired

    def queued_first(self, group_id: str, size: int) -> None:
        """Records that the first call of a group of ``size`` calls was queued: the next ``size - 1`` calls with
        ``group_id`` join it. Groups past their time are dropped here."""
        if size <= 1 or not group_id:
            return
        now = self.clock()
        for gid in [g for g, (_, forget_at) in self._open.items() if forget_at <= now]:
            del self._open[gid]
        self._open[group_id] = (size - 1, now + self.ttl_s)

    def __len__(self) -> int:
        return len(self._open)
