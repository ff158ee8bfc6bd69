"""``scheduler_svc/stream_queue.py``: a stream's queue put from the loop's thread and read on an event loop;
``put_all`` hands a batch to each loop in one callback, each queue's items in put order; ``Outbox.batched`` holds
what a block puts and lets it go at the block's end (``Scheduler._apply``)."""

from __future__ import annotations

import asyncio
import queue
import threading

import pytest

from scheduler_svc.outbox import Outbox
from scheduler_svc.stream_queue import LoopQueue, put_all


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def _make(loop, n: int) -> list[LoopQueue]:
    async def make():
        return [LoopQueue(loop) for _ in range(n)]
    return asyncio.run_coroutine_threadsafe(make(), loop).result(5)


def _drain(loop, q: LoopQueue, n: int) -> list:
    async def take():
        return [await asyncio.wait_for(q.get(), 5) for _ in range(n)]
    return asyncio.run_coroutine_threadsafe(take(), loop).result(10)


def test_put_from_another_thread_reaches_the_reader_on_the_loop_in_order(loop):
    (q,) = _make(loop, 1)
    for i in range(5):
        q.put(i)
    assert _drain(loop, q, 5) == [0, 1, 2, 3, 4]


def test_put_all_takes_one_loop_callback_per_loop_and_keeps_each_queues_order(loop):
    a, b = _make(loop, 2)
    plain = queue.SimpleQueue()
    calls = []
    real = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *args: (calls.append(args[0]), real(*args))[1]
    try:
        put_all([(a, 1), (b, "x"), (plain, 7), (a, 2), (b, "y"), (a, 3)])
    finally:
        del loop.call_soon_threadsafe
    assert len(calls) == 1  # was: one per item (6 wake-ups of the loop)
    assert plain.get_nowait() == 7
    assert _drain(loop, a, 3) == [1, 2, 3] and _drain(loop, b, 2) == ["x", "y"]


def test_a_put_after_the_loop_closed_raises():
    loop = asyncio.new_event_loop()

    async def make():
        return LoopQueue(loop)
    q = loop.run_until_complete(make())
    loop.close()
    with pytest.raises(RuntimeError):
        q.put(1)


def test_batched_holds_what_the_block_puts_until_its_end():
    box, a = Outbox(), queue.SimpleQueue()
    with box.batched():
        box.put(a, 1)
        box.put(a, 2)
        assert a.empty() and box.holding
    assert not box.holding and [a.get_nowait(), a.get_nowait()] == [1, 2]


def test_batched_inside_a_hold_leaves_the_release_to_the_holds_owner():
    box, a = Outbox(), queue.SimpleQueue()
    box.hold()
    with box.batched():
        box.put(a, 1)
    assert a.empty() and box.holding  # the owner (the chain: after the next Forward is sent) releases
    assert box.release() == 1 and a.get_nowait() == 1


def test_a_block_that_raises_leaves_its_items_to_released_on_error():
    box, a = Outbox(), queue.SimpleQueue()
    with pytest.raises(ValueError):
        with box.released_on_error():
            with box.batched():
                box.put(a, 1)
                raise ValueError("apply failed")
    assert a.get_nowait() == 1 and not box.holding
