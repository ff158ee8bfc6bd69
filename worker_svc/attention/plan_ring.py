"""Page-locked buffers for flashinfer's decode plans, in a ring, so the host plans ahead of the device.

flashinfer's ``plan`` writes the split-KV schedule into a page-locked host buffer and copies it to the
wrapper's device buffer asynchronously (a ``cudaMemcpyAsync`` on the current stream). With the wrapper's own
single buffer the next plan must wait until that copy ran, so the host could not enqueue step j + 1 of a
multi-step Forward before the device started step j, and a Forward enqueued behind the one ahead
(``Engine._launch_behind``) would hold the engine's lock for as long as its steps run. The decode graphs plan into
the ring's buffers in turn instead (``FlashInferAttention.plan_decode(page_locked=...)``): a buffer is taken again
only once the copy out of it, ``depth`` plans ago, has run on the device (an event each). The device buffer the
copies land in is read by the graph replayed after each plan, in stream order, so plans queued ahead never overwrite
what a step still reads.

CUDA only (events, pinned memory); built lazily by ``cuda_graph.DecodeGraphs`` when a bucket takes flashinfer.
"""

from __future__ import annotations

import torch


class PlanRing:
    """``depth`` page-locked uint8 buffers of ``nbytes`` each (flashinfer sizes its page-locked buffer as the device
    int workspace, 8 MiB, and plans against that size: pass the wrapper's). ``take()`` returns the next buffer once
    the copy of its last plan ran; ``planned()`` marks the plan just made from it (records the event, moves on).
    Raises ValueError for ``depth`` < 1."""

    def __init__(self, depth: int, nbytes: int):
        if depth < 1:
            raise ValueError(f"a plan ring needs at least one buffer (depth {depth})")
        self.buffers = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(depth)]
        self.events: list[torch.cuda.Event | None] = [None] * depth
        self.next = 0
        self.waits = 0  # takes that found their buffer's copy not yet run (the host was ``depth`` plans ahead)

    def take(self) -> torch.Tensor:
        """The next buffer, after the device ran the copy out of it of ``depth`` plans ago (blocks until then)."""
        event = self.events[self.next]
        if event is not None and not event.query():
            self.waits += 1
            event.synchronize()
        return self.buffers[self.next]

    def planned(self) -> None:
        """The plan from the buffer ``take`` returned is enqueued: an event behind its copy, then the next buffer."""
        event = torch.cuda.Event()
        event.record()
        self.events[self.next] = event
        self.next = (self.next + 1) % len(self.buffers)
