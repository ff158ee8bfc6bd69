"""attention/plan_ring.PlanRing: page-locked plan buffers taken in turn, each once the copy of its last plan ran; the ring
grows while the host is ahead of the device (up to max_depth, then it waits)."""

from __future__ import annotations

import pytest
import torch

from worker_svc.attention.plan_ring import PlanRing

CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="CUDA events and page-locked memory: needs a CUDA device (the accelerator machine runs it: "
                                 "bench/results/h200-run28/targets.sh)")


@pytest.mark.parametrize("depth,max_depth", [(0, 4), (5, 4)])
def test_a_ring_outside_one_to_max_depth_buffers_is_refused(depth, max_depth):
    with pytest.raises(ValueError, match="depth"):
        PlanRing(depth, 1024, max_depth=max_depth)


@CUDA
def test_at_max_depth_a_buffer_is_taken_again_only_after_the_device_passed_its_last_plan():
    ring = PlanRing(2, 4096, max_depth=2)
    a = ring.take()
    ring.planned()
    b = ring.take()
    ring.planned()
    assert a.data_ptr() != b.data_ptr() and a.is_pinned() and b.is_pinned()
    torch.cuda.synchronize()
    assert ring.take().data_ptr() == a.data_ptr() and ring.waits == 0  # both events long done: no wait
    torch.cuda._sleep(200_000_000)  # ~0.1 s of device time ahead of the next plan's event
    ring.planned()  # a's plan, behind the sleep
    assert ring.take().data_ptr() == b.data_ptr() and ring.waits == 0  # b's event was recorded before the sleep
    ring.planned()
    assert ring.take().data_ptr() == a.data_ptr()  # a's copy is behind the sleep: the host waited for it
    assert ring.waits == 1 and ring.grown == 0 and ring.events[0].query()


@CUDA
def test_below_max_depth_the_ring_grows_instead_of_waiting_and_never_hands_out_a_buffer_in_flight():
    ring = PlanRing(2, 4096, max_depth=6)
    torch.cuda._sleep(200_000_000)  # every event below is behind it
    taken = []
    for _ in range(6):
        buf = ring.take()
        assert all(buf.data_ptr() != t.data_ptr() for t in taken)  # none of the six is reused while in flight
        taken.append(buf)
        ring.planned()
    assert len(ring.buffers) == 6 and ring.grown == 4 and ring.waits == 0
    ring.take()  # the seventh: the ring is at max_depth, so it waits for the oldest copy
    assert ring.waits == 1
    torch.cuda.synchronize()
