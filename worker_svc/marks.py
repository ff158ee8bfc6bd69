"""A Forward's stamps on its way through the engine (the Forward timeline's ``marks`` column)."""

from __future__ import annotations

import time


class Marks:
    """When a Forward passed each stage of its way through the engine, on ``time.monotonic_ns()``'s clock, in the
    order passed: ``locked`` / ``tables`` (``_prepare_ahead`` took the lock / built the row tables), ``near_end``
    (``_launch_behind``: the device started the Forward ahead's step ``K - launch_lead_steps``; the mark also covers
    the metadata build and the validation before that wait), ``turn`` (its turn under the lock, the pending ones
    committed), ``launched`` (its steps enqueued; a one-step Forward's once it ran and committed), ``woke`` (its
    steps ran: ``_finish`` woke), ``committed``. The Forward timeline logs them (``forward_log.py``): where the host
    time between arrival and launch, and between the device's end and the reply, goes."""

    def __init__(self) -> None:
        self.stamps: list[tuple[str, int]] = []

    def __call__(self, name: str) -> None:
        self.stamps.append((name, time.monotonic_ns()))
