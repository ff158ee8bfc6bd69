"""Releases at the worker, carried by the next Forward instead of a Release round trip per round.

A request that ends (finished, aborted) while the worker holds its state (slot table, token history) is
``add``-ed here by the request table. The next ForwardRequest the loop builds ``take``-s every pending id into
its ``release_request_ids``; the worker drops them when that Forward starts running, after the Forwards it
follows (``protos/codeserve/v1/worker.proto``), so a release never overtakes a Forward queued before it.
Ids carried by a Forward count as released only once that Forward answered OK (``answered``): a Forward that
failed may not have started, so until then they stay ``outstanding`` and the resync releases them with the
Release RPC (a repeat is a no-op at the worker). With no Forward to send the loop has the table release the pending
ids with one Release RPC (``RequestTable.flush_releases``, then ``flushed``), so an idle worker holds no ended
request's state.
Loop thread only.
"""

from __future__ import annotations


class WorkerReleases:
    """Request ids to release at the worker: ``pending`` (on no Forward yet) and carried (by the Forward of each
    seq, not yet answered OK)."""

    def __init__(self) -> None:
        self.pending: list[str] = []
        self._carried: dict[int, list[str]] = {}  # Forward seq -> the ids it carries

    def add(self, request_ids: list[str]) -> None:
        """Queues ``request_ids`` (requests that ended; the worker may hold their state) for the next Forward."""
        self.pending += request_ids

    def take(self, seq: int) -> list[str]:
        """The pending ids, now carried by Forward ``seq`` (its ``release_request_ids``)."""
        ids, self.pending = self.pending, []
        if ids:
            self._carried[seq] = ids
        return ids

    def answered(self, seq: int) -> None:
        """Forward ``seq`` answered OK: the worker has dropped what it carried."""
        self._carried.pop(seq, None)

    def outstanding(self) -> list[str]:
        """Every id not known to be released: pending and carried by Forwards not answered OK (for the resync)."""
        return self.pending + [rid for ids in self._carried.values() for rid in ids]

    def clear(self) -> None:
        """The resync released ``outstanding()`` with the Release RPC (or the worker's new epoch holds none)."""
        self.pending = []
        self._carried = {}

    def flushed(self, request_ids: list[str]) -> None:
        """``request_ids`` (the pending ids, or the first of them) were released with the Release RPC."""
        self.pending = self.pending[len(request_ids):]
