"""attention/plan_ring.PlanRing: page-locked plan buffers taken in turn, each once the copy of ``depth`` plans ago ran."""

from __future__ import annotations

import pytest
import torch

from worker_svc.attention.plan_ring import PlanRing


def test_a_ring_without_buffers_is_refused():
    with pytest.raises(ValueError, match="at least one buffer"):
        PlanRing(0, 1024)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events and page-locked memory: needs a CUDA device")
def test_a_buffer_is_taken_again_only_after_the_device_passed_its_last_plan():
    ring = PlanRing(2, 4096)
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
    assert ring.waits == 1 and ring.events[0].query()
