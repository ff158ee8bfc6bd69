"""The device time of a Forward's model steps, reported to the scheduler as ``ForwardResponse.device_seconds``.

The scheduler's adaptive decode steps (``scheduler_svc/step_budget.py``) split a decode round's cost into a part
that grows with the steps a Forward runs (the model's steps on the device) and a fixed part (the worker's host work
around them, the RPC, the loop's own work). ``forward_seconds`` cannot split them: it holds the worker's fixed host
work too. ``StepClock`` times from just before the first step is launched to the end of the last one: on CUDA with
two events on the current stream (device time, the device's idle gaps between steps included, the host work before
the first launch and after the last one not), elsewhere with ``time.monotonic_ns`` at the same two points (on the
CPU the steps run synchronously, so that is their compute).
"""

from __future__ import annotations

import time

import torch


class StepClock:
    """``start()`` before the first step is launched, ``stop()`` after the last one is; ``seconds()`` (float,
    seconds) once both ran: it waits for the stop event on CUDA (a read-back has usually done so already).
    ``reset()`` to use it again (the engine makes one per Forward: a launched Forward's clock is read at its
    finish, after the next Forward may have started). Raises RuntimeError from ``seconds()`` when ``start`` or ``stop`` did not run since the reset."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._t0 = self._t1 = None
        if self._cuda:
            self._e0 = torch.cuda.Event(enable_timing=True)
            self._e1 = torch.cuda.Event(enable_timing=True)

    def reset(self) -> None:
        self._t0 = self._t1 = None

    def start(self) -> None:
        if self._cuda:
            self._e0.record()
        self._t0 = time.monotonic_ns()

    def stop(self) -> None:
        if self._cuda:
            self._e1.record()
        self._t1 = time.monotonic_ns()

    @property
    def ran(self) -> bool:
        """True once ``start`` and ``stop`` ran (False: no step ran, e.g. every item of the Forward was skipped)."""
        return self._t0 is not None and self._t1 is not None

    def seconds(self) -> float:
        if not self.ran:
            raise RuntimeError("StepClock.seconds() before start() and stop()")
        if self._cuda:
            self._e1.synchronize()
            return self._e0.elapsed_time(self._e1) / 1e3
        return (self._t1 - self._t0) / 1e9

    def span_ns(self, origin) -> tuple[int, int]:
        """(start, end) on the host's ``time.monotonic_ns()`` clock: on CUDA the two events' times through
        ``origin`` (a ``forward_log.DeviceOrigin`` of this device; waits for the stop event), elsewhere the host
        times of ``start`` and ``stop``. Raises RuntimeError as ``seconds()`` does."""
        if not self.ran:
            raise RuntimeError("StepClock.span_ns() before start() and stop()")
        if self._cuda:
            self._e1.synchronize()
            return origin.to_host_ns(self._e0), origin.to_host_ns(self._e1)
        return self._t0, self._t1
