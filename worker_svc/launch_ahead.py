"""Forwards launched ahead of the commit of the Forward they follow (issue 15, technique 3: no host gap).

A multi-step decode Forward N runs in two parts under the engine's lock: its launch (validate, build the steps'
metadata, enqueue every step and the asynchronous read-back of its tokens) and, once the device ran them, its
finish (commit, outputs). Between the two the lock is free. Forward N+1 that continues N (``continues``: every
item an ``input_from_last_sample`` decode item, ``after_seq = N``) may launch in that gap: its rows read their
K/V through N's new slots too and take their step-0 inputs from N's tokens on the device
(``multistep.launch_multistep(..., ahead=N)``), so its steps queue on the stream right behind N's and the device
does not idle through N's read-back, commit and reply, nor N+1's validation and metadata build (measured on the
H200, bench/results/h200-run10/call1: (step - graph replay) x 8 = ~1.3 ms a Forward at tiny B = 1, ~2.4 ms at
the 1B's B = 64, ~5 ms at B = 256).

N+1 launches once the device reached N's last step (``LaunchedSteps.wait_near``), not as soon as N's steps are
enqueued: until then an extend of a request that arrived while N runs can still be inserted ahead of N+1
(``before_seq``, worker_svc/ordering.py) and run right after N. Launched at once, N+1 took that place for all of
N and the arrivals' first tokens waited a whole Forward more (H200, bench/results/h200-run10/call4: c64 15.8k ->
12.6-13.5k tok/s, TTFT p50 227 -> 270 ms, while the worker alone gained 8-13%). Launching that late still lost
(call 5: c64 14.2k against 15.3-16.1k off; the worker alone -9% to -13% a step): the launch held the request
table's lock while it enqueued its K steps, which takes about K - 1 steps of device time (each plan waits for the
step before it to start), so N committed and replied ~a Forward late. Now the launch gives the table lock back
before it enqueues its steps (a device lock orders launches; ``multistep.launch_multistep(..., unlock=)``). That
form is not measured on the H200 yet (bench/results/h200-run10/call6.sh is its A/B), so the worker runs with
launch ahead off unless asked (``--launch-ahead``; the launcher's ``launch_ahead: true``). On the CPU the steps run
inside the launch, so there is nothing to overlap: the worker turns it on for CUDA only (``build.build_engine``).

The rules that keep the request table right:
- at most the one Forward a Forward follows is launched and not committed when it launches ahead; every other
  Forward (extends, one-step decode, a Forward that follows nothing) launches only when nothing is pending
  (``Pending.wait_turn``);
- N+1 is validated against each request as it will be after N commits (``projected``): N's new slots appended,
  a last token present, not stopped; whether N in fact stopped the request, or committed fewer steps, is known
  only at N+1's finish, which then answers that row ``skipped`` and commits nothing for it
  (``LaunchedSteps.finish``);
- N+1's finish commits only after N's outcome is recorded; when N failed, N+1 fails ABORTED and commits nothing;
  N+1 does not launch ahead (it waits for N's outcome, then its turn as any Forward) when N left the pending set
  before N+1 took its turn, or when launched ahead it would not give an ordered run's outputs (``overtakes``:
  N+1's ``release_ids`` name a request of N, or N creates anew a request N+1 continues; ``Engine._take_turn``).
"""

from __future__ import annotations

import threading
import time
from typing import Mapping, Sequence

from worker_svc.types import ForwardItem, WorkerError


def continues(items: Sequence[ForwardItem]) -> bool:
    """True for a multi-step decode batch of ``input_from_last_sample`` items only: one that may launch ahead
    of the commit of the Forward it follows."""
    return bool(items) and any(it.decode_steps > 1 for it in items) and all(
        it.input_from_last_sample and not it.has_prefix for it in items)


def overtakes(ahead, items: Sequence[ForwardItem], release_ids: Sequence[str]) -> bool:
    """True when Forward ``items`` (releasing ``release_ids``) launched ahead of the commit of ``ahead`` (its
    ``LaunchedSteps``) could not give what an ordered run gives: it releases a request of ``ahead`` (the release
    would overtake that commit), or ``ahead`` creates anew (``has_prefix``) a request it continues (``projected``
    knows the old state only). It then waits for that commit."""
    fresh = {it.request_id for it in ahead.items if it.has_prefix}
    return not ahead.rows.keys().isdisjoint(release_ids) or any(it.request_id in fresh for it in items)


class Projected:
    """A request as validation sees it once the pending Forward ahead has committed every step it launched:
    ``slots`` its length (a range), a last token present, not stopped."""

    __slots__ = ("slots", "last_token", "stopped")

    def __init__(self, held: int):
        self.slots = range(held)
        self.last_token = 0  # a placeholder: the real one is on the device (the ahead Forward's tokens)
        self.stopped = False


def projected(requests: Mapping[str, object], ahead_rows: Mapping[str, tuple]) -> dict:
    """``requests`` with each request of the Forward ahead (``LaunchedSteps.rows``: id -> (row, steps, new
    slots)) replaced by its ``Projected`` state. A request the Forward ahead does not know stays as it is."""
    view = dict(requests)
    for rid, (_, _, slots) in ahead_rows.items():
        state = requests.get(rid)
        if state is not None:
            view[rid] = Projected(len(state.slots) + len(slots))
    return view


class Pending:
    """The launched, not yet committed Forwards of one engine (at most two: one, and the one launched ahead of
    its commit). Every method runs with the engine's lock held (``lock``, which the waits release)."""

    def __init__(self, lock: threading.Lock, timeout_s: float = 60.0):
        self._cond = threading.Condition(lock)
        self._launched: list[tuple[int, object]] = []  # (seq, LaunchedSteps) in launch order
        self.timeout_s = timeout_s

    def wait_turn(self, seq: int, ahead_of: int) -> object | None:
        """Blocks until Forward ``seq`` may launch: ``ahead_of`` > 0 (it continues that Forward): when nothing
        but that Forward is pending, which is returned (None when it has committed already); ``ahead_of`` 0:
        when nothing is pending (returns None). Raises WorkerError ABORTED after ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.ready(ahead_of):
                return self.get(ahead_of) if ahead_of > 0 else None
            others = [s for s, _ in self._launched if not (ahead_of > 0 and s == ahead_of)]
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError("ABORTED", f"Forward seq {seq} waited {self.timeout_s:g} s for the commit of "
                                             f"Forward seq {others[0]}, launched before it")
            self._cond.wait(left)

    def ready(self, ahead_of: int) -> bool:
        """True when nothing is pending but (with ``ahead_of`` > 0) that Forward: a Forward may launch now."""
        return all(ahead_of > 0 and s == ahead_of for s, _ in self._launched)

    def get(self, seq: int) -> object | None:
        """The pending Forward ``seq`` (None when it is not pending)."""
        return next((run for s, run in self._launched if s == seq), None)

    def add(self, seq: int, run: object) -> None:
        self._launched.append((seq, run))

    def remove(self, run: object) -> None:
        """Drops ``run`` (committed or failed) and wakes the Forwards waiting for their turn."""
        self._launched = [(s, r) for s, r in self._launched if r is not run]
        self._cond.notify_all()
