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
import json
import os
import time


class PauseLog:
    """Writes one JSON line (``{"service", "event": "gc_pause", "level": "warning", "generation", "ms", "collected"}``)
    to file descriptor ``fd`` for each collection of at least ``threshold_s`` seconds; ``pauses`` counts them.
    ``install`` hooks it into ``gc.callbacks``; ``remove`` unhooks it.

    A collection runs its callbacks in whichever thread allocated, possibly inside a logger's write while it holds
    its stream's lock, so the line goes out with one ``os.write`` (no Python-level lock, no logger): a structlog call
    there could wait forever on a lock its own thread holds."""

    def __init__(self, service: str, fd: int = 2, threshold_s: float = 0.01) -> None:
        self.service, self.fd, self.threshold_s = service, fd, threshold_s
        self.pauses = 0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        took = time.perf_counter() - self._t0
        if took >= self.threshold_s:
            self.pauses += 1
            line = json.dumps({"service": self.service, "event": "gc_pause", "level": "warning",
                               "generation": info.get("generation"), "ms": round(took * 1e3, 2),
                               "collected": info.get("collected")})
            os.write(self.fd, (line + "\n").encode())

    def install(self) -> "PauseLog":
        gc.callbacks.append(self)
        return self

    def remove(self) -> None:
        gc.callbacks.remove(self)
