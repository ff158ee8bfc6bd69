"""Page-locked buffers for flashinfer's decode plans, in a ring, so the host plans ahead of the device.

flashinfer's ``plan`` writes the split-KV schedule into a page-locked host buffer and copies it to the
wrapper's device buffer asynchronously (a ``cudaMemcpyAsync`` on the current stream). With the wrapper's own
single buffer the next plan must wait until that copy ran, so the host could not enqueue step j + 1 of a
multi-step Forward before the device started step j, and a Forward enqueued behind the one ahead
(``Engine._launch_behind``) would hold the engine's lock for as long as its steps run. The decode graphs plan into
the ring's buffers in turn instead (``FlashInferAttention.plan_decode(page_locked=...)``): a buffer is taken again
only once the copy out of it, a whole ring ago, has run on the device (an event each); when it has not, the ring
grows by one buffer (up to ``max_depth``, then it waits), so the host is never held back by a Forward of more steps
than the ring had buffers (the engine's lock is held while a Forward is enqueued). The device buffer the copies land
in is read by the graph replayed after each plan, in stream order, so plans queued ahead never overwrite what a step
still reads.

CUDA only (events, pinned memory); built by ``cuda_graph.DecodeGraphs`` when a bucket takes flashinfer.
"""

from __future__ import annotations

import torch


class PlanRing:
    """``depth`` page-locked uint8 buffers of ``nbytes`` each to start with (flashinfer sizes its page-locked buffer as
    the device int workspace, 8 MiB, and plans against that size: pass the wrapper's), at most ``max_depth``.
    ``take()`` returns a buffer whose last plan's copy has run; ``planned()`` marks the plan just made from it (records
    the event, moves on). ``grown``: buffers added because the next one was still in flight; ``waits``: takes that
    waited for a copy (at ``max_depth``). Raises ValueError unless 1 <= ``depth`` <= ``max_depth``."""

    def __init__(self, depth: int, nbytes: int, max_depth: int = 33):
        if not 1 <= depth <= max_depth:
            raise ValueError(f"a plan ring needs 1 <= depth <= max_depth buffers (depth {depth}, max {max_depth})")
        self.nbytes, self.max_depth = nbytes, max_depth
        self.buffers = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(depth)]
        self.events: list[torch.cuda.Event | None] = [None] * depth
        self.next = 0
        self.grown = 0
        self.waits = 0

    def take(self) -> torch.Tensor:
        """The next buffer once the device ran the copy out of it; a new buffer in its place, ahead of it in the ring,
        while that copy is still to run and the ring is under ``max_depth``; else blocks until the copy ran."""
        event = self.events[self.next]
        if event is not None and not event.query():
            if len(self.buffers) < self.max_depth:
                self.buffers.insert(self.next, torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=True))
                self.events.insert(self.next, None)
                self.grown += 1
            else:
                self.waits += 1
                event.synchronize()
        return self.buffers[self.next]

    def planned(self) -> None:
        """The plan from the buffer ``take`` returned is enqueued: an event behind its copy, then the next buffer."""
        event = torch.cuda.Event()
        event.record()
        self.events[self.next] = event
        self.next = (self.next + 1) % len(self.buffers)
