"""Python's cyclic garbage collector in a serving process: each long collection logged.

A full (generation 2) collection walks every tracked object of the process: a worker's heap after start-up (~314k
objects: the model's modules, torch's and gRPC's objects) takes ~150 ms to walk on the H100 host (session 29,
``gc.collect()`` once serving). ``PauseLog`` logs each collection that stopped the process for at least
``threshold_s``, so a stall on the device's timeline can be told from one (session 29: a 256-row commit took 145 ms
once at c256; in four later c64 + c256 runs no collection of >= 10 ms happened while serving, and freezing the
start-up heap, ``gc.freeze``, changed no figure: not kept).
"""

from __future__ import annotations

import gc
import time


class PauseLog:
    """Logs (``log.warning("gc_pause", ...)``, a structlog logger) each collection of at least ``threshold_s``
    seconds: its generation, duration (ms) and the objects it collected; ``pauses`` counts them. ``install`` hooks
    it into ``gc.callbacks``; ``remove`` unhooks it."""

    def __init__(self, log, threshold_s: float = 0.01) -> None:
        self.log, self.threshold_s = log, threshold_s
        self.pauses = 0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        took = time.perf_counter() - self._t0
        if took >= self.threshold_s:
            self.pauses += 1
            self.log.warning("gc_pause", generation=info.get("generation"), ms=round(took * 1e3, 2),
                             collected=info.get("collected"))

    def install(self) -> "PauseLog":
        gc.callbacks.append(self)
        return self

    def remove(self) -> None:
        gc.callbacks.remove(self)
