"""A timeline of the worker's Forwards (opt-in, off by default): where the device is busy and where it waits.

With ``CODESERVE_FORWARD_LOG=PATH`` in the worker's environment, every Forward appends one tab-separated line to
PATH (``FIELDS``, in that order):

- ``seq``, ``after_seq``: the scheduler's numbering (0: none);
- ``kind``: ``decode`` (every item one new token per step from the request's own history: no ``has_prefix``, one
  input token or ``input_from_last_sample``) or ``extend`` (anything else: prefill chunks, mixed batches);
- ``rows``, ``tokens`` (new tokens written, ``len(slot_ids)`` summed), ``steps`` (the largest ``decode_steps``);
- ``in_ns``, ``out_ns``: ``time.monotonic_ns()`` when the servicer took the call and when its reply was built;
- ``dev_start_ns``, ``dev_end_ns``: the device's first step launch and last step end on the same clock
  (``step_clock.StepClock.span_ns`` against one ``DeviceOrigin``), or ``-1`` when nothing ran (every item skipped,
  or a rejected Forward, which is logged with kind ``rejected``);
- ``prepared_ns``: when its preparation at arrival ended (a multi-step decode's step metadata,
  ``Engine._prepare_ahead``; an eager extend, ``extend_ahead``), ``-1`` when it was not prepared ahead; ``launch``:
  ``behind`` when it was launched behind the Forward ahead on the device, else ``turn``. A decode that arrived
  early but was not launched behind shows here whether its preparation ended before the Forward ahead did;
- ``marks``: when it passed each stage on its way (``items``: the servicer converted its items, then
  ``worker_svc.marks.Marks``' stages; each stage's p50 in ``bench/forward_timeline.py`` is named by its later mark,
  so a stage's interval depends on the path the Forward took), as ``name:us`` after ``in_ns``, comma-separated
  ("" for a rejected Forward). A file written before this column existed gets no new header: start a new file.

The device span starts where the engine's ``StepClock`` starts (after the extend's plan, before the decode graphs'
metadata copy), so the host work before it shows as a gap between two Forwards' spans. ``bench/forward_timeline.py``
turns the file into the device's busy share, the time per kind and the gaps between Forwards. CLOCK_MONOTONIC is
one clock for every process of a machine, so the lines also compare with ``common/hop_trace.py``'s marks.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Sequence, TextIO

import torch

from worker_svc.types import ForwardItem

ENV = "CODESERVE_FORWARD_LOG"
FIELDS = ("seq", "after_seq", "kind", "rows", "tokens", "steps", "in_ns", "out_ns", "dev_start_ns", "dev_end_ns",
          "prepared_ns", "launch", "marks")


class DeviceOrigin:
    """A CUDA event and the ``time.monotonic_ns()`` at which the host saw it complete: a device event's time on
    the host's clock is ``host_ns + origin.elapsed_time(event)`` (error: the ~10 us between the event completing and
    the host waking up to read the clock). On the CPU there is nothing to relate: ``event`` is None."""

    def __init__(self, device: torch.device) -> None:
        self.event = None
        if device.type == "cuda":
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()
            self.event.synchronize()
        self.host_ns = time.monotonic_ns()

    def to_host_ns(self, event) -> int:
        """The host clock's ns at which CUDA event ``event`` (recorded with timing, complete) completed."""
        return self.host_ns + int(self.event.elapsed_time(event) * 1e6)


def kind_of(items: Sequence[ForwardItem]) -> str:
    """``decode`` or ``extend`` (see the module docstring)."""
    decode = all(not it.has_prefix and (it.input_from_last_sample or len(it.input_ids) == 1) for it in items)
    return "decode" if decode and items else "extend"


class ForwardLog:
    """The open timeline file; ``record`` appends a Forward's line (thread-safe: Forwards end on several threads).
    Raises OSError when ``path`` cannot be opened for appending."""

    def __init__(self, path: str) -> None:
        self.path = path
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        self._out: TextIO = open(path, "a", buffering=1, encoding="utf-8")  # a line per write
        self._lock = threading.Lock()
        if new:
            self._out.write("\t".join(FIELDS) + "\n")

    def record(self, seq: int, after_seq: int, items: Sequence[ForwardItem], in_ns: int, out_ns: int,
               span_ns: tuple[int, int] | None, rejected: bool = False, prepared_ns: int = -1,
               launch: str = "turn", marks: Sequence[tuple[str, int]] = ()) -> None:
        """One Forward: its items, when the servicer took and answered it (monotonic ns), its device span (None:
        nothing ran), when its preparation at arrival ended (-1: none), how it was launched (``behind`` /
        ``turn``) and its ``marks`` ((name, monotonic ns) of each stage passed)."""
        kind = "rejected" if rejected else kind_of(items)
        tokens = sum(len(it.slot_ids) for it in items)
        steps = max((it.decode_steps for it in items), default=0)
        start, end = span_ns if span_ns is not None else (-1, -1)
        line = "\t".join(str(v) for v in (seq, after_seq, kind, len(items), tokens, steps, in_ns, out_ns, start, end,
                                          prepared_ns, launch,
                                          ",".join(f"{name}:{(ns - in_ns) // 1000}" for name, ns in marks)))
        with self._lock:
            self._out.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._out.close()

