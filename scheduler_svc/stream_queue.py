"""A Generate stream's queue: put from any thread (the scheduler's loop, mostly), read by the stream's handler on the
gRPC server's asyncio loop (``service.py``, ``common/aio_server.py``).

``put`` hands the item to the loop (``call_soon_threadsafe``: one wake-up of the loop's selector each). ``put_all``
hands a batch of (queue, item) pairs over with one call per loop, so the loop takes a whole decode's messages in one
wake-up: the outbox's release (``outbox.py``) goes through it. Each queue keeps its items in put order.
"""

from __future__ import annotations

import asyncio
from typing import Iterable


class LoopQueue:
    """Items for one coroutine on ``loop``; ``put`` from any thread, ``get`` on the loop (FIFO, unbounded)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:
        """Queues ``item`` (from any thread). Raises RuntimeError when the loop is closed (the server stopped)."""
        self.loop.call_soon_threadsafe(self._items.put_nowait, item)

    async def get(self):
        """The next item; waits on the loop until one is put."""
        return await self._items.get()

    def put_nowait_on_loop(self, item) -> None:
        """``put`` for a caller already on the loop's thread (``put_all``'s callback)."""
        self._items.put_nowait(item)


def _put_each(pairs: list) -> None:
    for queue, item in pairs:
        queue.put_nowait_on_loop(item)


def put_all(pairs: Iterable) -> None:
    """Puts each (queue, item) pair in order: a LoopQueue's items in one callback per loop, any other queue's with
    its own ``put``. Items of one queue keep their order."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for queue, item in pairs:
        if isinstance(queue, LoopQueue):
            by_loop.setdefault(queue.loop, []).append((queue, item))
        else:
            queue.put(item)
    for loop, batch in by_loop.items():
        loop.call_soon_threadsafe(_put_each, batch)
