"""A Forward's stamps on its way through the engine (the Forward timeline's ``marks`` column)."""

from __future__ import annotations

import time


class Marks:
    """When a Forward passed each stage of its way through the engine, on ``time.monotonic_ns()``'s clock, in the
    order passed: ``locked`` / ``tables`` (``_prepare_ahead`` took the lock / built the row tables), ``near_end``
    (``_launch_behind``: the Forward ahead is on its last step), ``turn`` (its turn under the lock, the pending ones
    committed), ``launched`` (its steps enqueued), ``woke`` (its steps ran: ``_finish`` woke), ``committed``. The
    Forward timeline logs them (``forward_log.py``): where the host time between arrival and launch, and between
    the device's end and the reply, goes."""

    def __init__(self) -> None:
        self.stamps: list[tuple[str, int]] = []

    def __call__(self, name: str) -> None:
        self.stamps.append((name, time.monotonic_ns()))
