"""Python's cyclic garbage collector in a serving process: the start-up heap frozen, long collections logged.

A full (generation 2) collection walks every tracked object of the process. A worker holds the model's modules,
torch's and gRPC's objects and the request table, so one full collection can stop every thread for tens of ms
(session 29, H100, c256: one 256-row decode Forward's commit took 145 ms where the others took 2-8, stalling the
device for 144 ms). ``freeze_startup_heap`` moves what start-up built into the permanent generation
(``gc.freeze``, as vLLM does after capturing its CUDA graphs), so later collections walk only what serving
allocates; ``PauseLog`` logs each collection that stopped the process for at least ``threshold_s``.
"""

from __future__ import annotations

import gc
import time


def freeze_startup_heap() -> int:
    """Collects once, then freezes every object left (``gc.freeze``): later collections skip them. Returns how many
    objects were frozen. Call it once start-up (model, graphs, servers) is done."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


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
