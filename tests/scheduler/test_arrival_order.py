"""Overlapped decode and new arrivals: the order of the Forwards the worker receives.

The scheduler runs in this process against the real cache service (in-process gRPC server) and a recording
worker (a unit test of the loop's sending order; the real worker's output is covered by test_overlap.py).
A decode Forward's reply is held back until the test lets it go, so "while a decode Forward runs" is a
state, not a timing: no test here measures time.

- A request that arrives while a decode Forward N runs has its extend sent to run right after N
  (``after_seq = N.seq``); the next decode Forward (N+1, without the new request) follows the extend. Before
  the fix N+1 was already queued behind N, so the new request's prefill waited for a whole K-step Forward.
- Two requests arriving one after the other while N runs: both extends run after N, before N+1.
- With nothing arriving, N+1 follows N (``after_seq = N.seq``), and every request's output is complete.
- ``--overlap-mode queued``: N+1 is sent at once, after N; an arrival's extend is sent after N (not after
  N+1) with ``before_seq = N+1``, so the worker runs it before N+1 when N+1 has not started.
- While such an extend runs (N applied, N+1 queued behind it), a later arrival is admitted at once and its extend
  sent after that extend and before N+1. Before, the loop waited for the extend's reply before it took arrivals.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout

import pytest
import structlog

from codeserve.v1 import scheduler_pb2, worker_pb2
from scheduler_svc.output import OutputStream
from scheduler_svc.request import StreamEnd
from scheduler_svc.scheduler import Scheduler, SchedulerConfig
from scheduler_svc.validate import build_request
from tests.scheduler.cache_service import cache_service
from tests.scheduler.fake_worker import LaterReply, forward_response

TOKEN = 77  # every token the recording worker samples (never EOS: the requests ignore it anyway)
WAIT_S = 30.0  # upper bound for a condition that holds at once in a correct scheduler (not a measured time)


class HeldReply(LaterReply):
    """A PendingForward whose reply is released by ``release()`` (at once when ``hold`` was False)."""

    def __init__(self, reply: worker_pb2.ForwardResponse, hold: bool) -> None:
        super().__init__()
        self.reply = reply
        if not hold:
            self.release()

    def release(self) -> None:
        self.answer(self.reply)

    def result(self) -> worker_pb2.ForwardResponse:
        try:
            return self.future.result(WAIT_S)
        except FutureTimeout:
            raise AssertionError("a held Forward reply was never released by the test") from None


class RecordingWorker:
    """Stands in for WorkerClient: records each Forward (seq, after_seq, items) and answers TOKEN for every
    sampled position. ``hold_decode`` / ``hold_extend``: async decode / extend replies wait for
    ``HeldReply.release``."""

    def __init__(self) -> None:
        self.epoch = ""
        self.sent: list[tuple[int, int, list[worker_pb2.ForwardItem]]] = []
        self.pending: dict[int, HeldReply] = {}
        self.released: list[str] = []
        self.hold_decode = False
        self.hold_extend = False
        self.before: dict[int, int] = {}  # seq -> before_seq, of the Forwards sent with one
        self.carried: dict[int, list[str]] = {}  # seq -> release_request_ids, of the Forwards that carry some
        self.changed = threading.Condition()

    def info(self) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(worker_id="w0", epoch="e1", model_name="rec", n_positions=2048, vocab_size=1000,
                                     eos_token_id=0, capacity_tokens=4096, page_size=1, pool_slots=4097)

    def _record(self, seq: int, after_seq: int, items) -> None:
        with self.changed:
            self.sent.append((seq, after_seq, list(items)))
            self.changed.notify_all()

    def prepare(self, items, seq: int, after_seq: int = 0, before_seq: int = 0) -> worker_pb2.ForwardRequest:
        return worker_pb2.ForwardRequest(expected_epoch=self.epoch, items=items, seq=seq, after_seq=after_seq,
                                         before_seq=before_seq)

    def send(self, request: worker_pb2.ForwardRequest) -> HeldReply:
        seq, after_seq, items = request.seq, request.after_seq, list(request.items)
        if request.before_seq:
            self.before[seq] = request.before_seq
        self._record(seq, after_seq, items)
        self.released.extend(request.release_request_ids)  # released when it runs (its replies are in order)
        if request.release_request_ids:
            self.carried[seq] = list(request.release_request_ids)
        hold = self.hold_decode if kind(items) == "decode" else self.hold_extend
        held = HeldReply(forward_response(items, TOKEN), hold=hold)
        self.pending[seq] = held
        return held

    def release(self, request_ids) -> int:
        self.released.extend(request_ids)
        return len(request_ids)

    def wait_sent(self, n: int) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.sent) >= n, WAIT_S):
                raise AssertionError(f"the scheduler sent {len(self.sent)} Forwards, expected at least {n}")


def submitter(sched, tokenizer):
    """``submit(rid, prompt, max_new)``: queues a greedy request (ignore_eos) on ``sched``; returns its Req."""
    def submit(rid: str, prompt: list[int], max_new: int):
        req = build_request(scheduler_pb2.GenerateRequest(request_id=rid, input_ids=scheduler_pb2.TokenIds(ids=prompt),
                                                          max_new_tokens=max_new, ignore_eos=True),
                            tokenizer, sched.info, sched.capacity)
        req.stream = OutputStream(req, tokenizer, sched.info.eos_token_id)
        sched.submit(req)
        return req

    return submit


@pytest.fixture(params=["just-in-time"])
def loop(tokenizer, request):
    with cache_service() as (_, cache):
        worker = RecordingWorker()
        sched = Scheduler(cache, worker, SchedulerConfig(decode_steps=8, overlap=True, overlap_mode=request.param),
                          structlog.get_logger())
        sched.connect()
        yield sched, worker, submitter(sched, tokenizer)


def kind(items) -> str:
    """"extend" when an item is new to the worker or brings several tokens; "decode" otherwise."""
    return "extend" if any(it.has_prefix or len(it.input_ids) > 1 for it in items) else "decode"


def tokens(req) -> list[int]:
    """Every token id the request streamed, once it ended (raises when its stream failed)."""
    out = []
    while True:
        item = req.out.get(timeout=WAIT_S)
        if isinstance(item, StreamEnd):
            assert item.code is None, item.message
            return out
        out.extend(item.token_ids)


def run_until_idle(sched: Scheduler) -> None:
    for _ in range(200):
        if not sched.step() and not sched.running and not sched.waiting:
            return
    raise AssertionError("the loop did not become idle within 200 rounds")


def let_go(sched: Scheduler, worker: RecordingWorker) -> None:
    """Releases every held reply, stops holding decode replies, and runs the loop until idle."""
    for p in list(worker.pending.values()):
        p.release()
    worker.hold_decode = worker.hold_extend = False
    run_until_idle(sched)


def test_a_request_arriving_during_a_decode_forward_has_its_extend_sent_next(loop):
    sched, worker, submit = loop
    a = submit("a", list(range(10, 30)), 40)
    assert sched.step()  # extend of a (synchronous)
    worker.hold_decode = True
    assert sched.step()  # decode N of a, sent without waiting (overlap); its reply is held
    assert [kind(items) for _, _, items in worker.sent] == ["extend", "decode"]
    n_seq = worker.sent[-1][0]
    held = worker.pending[n_seq]

    round_n = threading.Thread(target=sched.step)  # the round that waits for N
    round_n.start()
    b = submit("b", list(range(40, 52)), 5)  # arrives while N runs
    worker.wait_sent(3)
    held.release()
    round_n.join(WAIT_S)
    assert not round_n.is_alive()

    seq, after, items = worker.sent[2]
    assert (kind(items), [it.request_id for it in items], after) == ("extend", ["b"], n_seq), \
        "the Forward after the in-flight decode must be the new request's extend"
    worker.wait_sent(4)
    nxt_seq, nxt_after, nxt_items = worker.sent[3]
    assert (kind(nxt_items), [it.request_id for it in nxt_items], nxt_after) == ("decode", ["a"], seq)
    let_go(sched, worker)
    assert tokens(a) == [TOKEN] * 40 and tokens(b) == [TOKEN] * 5
    assert sorted(worker.released) == ["a", "b"]
    assert sched.stats["extends_ahead"] == 1


def test_every_request_arriving_during_a_decode_forward_runs_before_the_next_decode(loop):
    sched, worker, submit = loop
    a = submit("a", list(range(10, 30)), 40)
    assert sched.step()
    worker.hold_decode = True
    assert sched.step()  # decode N of a, reply held
    n_seq = worker.sent[-1][0]
    round_n = threading.Thread(target=sched.step)
    round_n.start()
    b = submit("b", list(range(40, 52)), 5)
    worker.wait_sent(3)  # b's extend
    c = submit("c", list(range(60, 75)), 6)
    worker.wait_sent(4)  # c's extend, still before N's reply
    worker.pending[n_seq].release()
    round_n.join(WAIT_S)
    assert not round_n.is_alive()
    worker.wait_sent(5)
    got = [(kind(items), [it.request_id for it in items], after) for _, after, items in worker.sent[2:5]]
    seqs = [seq for seq, _, _ in worker.sent[2:5]]
    assert got == [("extend", ["b"], n_seq), ("extend", ["c"], seqs[0]), ("decode", ["a"], seqs[1])]
    let_go(sched, worker)
    assert (tokens(a), tokens(b), tokens(c)) == ([TOKEN] * 40, [TOKEN] * 5, [TOKEN] * 6)
    assert sorted(worker.released) == ["a", "b", "c"] and sched.stats["extends_ahead"] == 2


@pytest.mark.parametrize("loop", ["queued"], indirect=True)
def test_queued_mode_sends_the_next_decode_at_once_and_an_arrivals_extend_after_n_and_before_it(loop):
    sched, worker, submit = loop
    a = submit("a", list(range(10, 30)), 40)
    assert sched.step()  # extend of a
    worker.hold_decode = True
    assert sched.step()  # decode N of a, reply held
    n_seq = worker.sent[-1][0]
    round_n = threading.Thread(target=sched.step)
    round_n.start()
    worker.wait_sent(3)  # N+1, before N's reply and before any arrival
    nxt_seq, nxt_after, nxt_items = worker.sent[2]
    assert (kind(nxt_items), [it.request_id for it in nxt_items], nxt_after) == ("decode", ["a"], n_seq)
    assert nxt_seq not in worker.before
    b = submit("b", list(range(40, 52)), 5)  # arrives while N runs, N+1 already queued
    worker.wait_sent(4)
    e_seq, e_after, e_items = worker.sent[3]
    assert (kind(e_items), [it.request_id for it in e_items], e_after) == ("extend", ["b"], n_seq)
    assert worker.before[e_seq] == nxt_seq  # the worker runs it ahead of N+1 if N+1 has not started
    # and its reply is processed before N+1's (the order the worker runs them in)
    wait = time.monotonic() + WAIT_S
    while len(sched.pipeline.inflight) < 3 and time.monotonic() < wait:
        time.sleep(0.001)
    assert [f.seq for f in sched.pipeline.inflight] == [n_seq, e_seq, nxt_seq]
    worker.pending[n_seq].release()
    round_n.join(WAIT_S)
    assert not round_n.is_alive()
    let_go(sched, worker)
    assert tokens(a) == [TOKEN] * 40 and tokens(b) == [TOKEN] * 5
    assert sorted(worker.released) == ["a", "b"] and sched.stats["extends_ahead"] == 1


@pytest.mark.parametrize("loop", ["just-in-time", "queued"], indirect=True)
def test_without_arrivals_each_decode_forward_follows_the_previous_one(loop):
    sched, worker, submit = loop
    reqs = [submit(f"r{i}", list(range(10 + i, 30 + i)), n) for i, n in enumerate((3, 17, 30))]
    run_until_idle(sched)
    for r, n in zip(reqs, (3, 17, 30)):
        assert tokens(r) == [TOKEN] * n
    decodes = [(seq, after) for seq, after, items in worker.sent if kind(items) == "decode"]
    assert len(decodes) >= 3 and sched.stats["decode_chained"] >= 2
    for (prev, _), (seq, after) in zip(decodes, decodes[1:]):
        assert after in (0, prev)  # chained ones run after the one before; none overtakes
    assert sched.stats["extends_ahead"] == 0
    assert sorted(worker.released) == ["r0", "r1", "r2"]
    assert worker.before == {}  # nothing arrived: nothing inserted ahead


def finish_reason(req) -> str:
    """The finish reason of the request's last message, once its stream ended successfully."""
    last = None
    while not isinstance(item := req.out.get(timeout=WAIT_S), StreamEnd):
        last = item
    assert item.code is None, item.message
    return last.finish_reason


@pytest.mark.parametrize("loop", ["queued", "just-in-time"], indirect=True)
def test_an_abort_while_the_forward_that_stops_the_request_runs_only_aborts_it(loop):
    """Request a samples a stop token in decode Forward N while its client cancels; N+1 was already sent with a
    in it, so the worker answers a ``skipped`` there. Only a is aborted: the loop goes on and b's output is
    complete. Was (fresh-user review): "worker skipped a ... but the scheduler has not seen it finish" raised
    in the loop, every running and waiting request failed and the scheduler exited."""
    sched, worker, submit = loop
    a = submit("a", list(range(10, 30)), 40)
    b = submit("b", list(range(40, 60)), 40)
    assert sched.step()  # extend of a and b
    worker.hold_decode = True
    assert sched.step()  # decode N, reply held
    n_seq = worker.sent[-1][0]
    round_n = threading.Thread(target=sched.step)
    round_n.start()
    if sched.cfg.overlap_mode == "queued":
        worker.wait_sent(3)  # N+1 sent at once
    assert sched.abort("a")  # the client leaves while N (in which a stops at a stop token) runs
    worker.pending[n_seq].release()  # just-in-time: N+1 is sent now
    worker.wait_sent(3)
    nxt_seq, _, nxt_items = worker.sent[2]
    assert sorted(it.request_id for it in nxt_items) == ["a", "b"]
    skipped = worker.pending[nxt_seq].reply
    for res in skipped.results:
        if res.request_id == "a":  # a stopped in N: the worker skips its continuation
            res.Clear()
            res.request_id, res.skipped = "a", True
    round_n.join(WAIT_S)
    assert not round_n.is_alive()
    let_go(sched, worker)
    assert finish_reason(a) == "abort"
    assert tokens(b) == [TOKEN] * 40
    assert sorted(worker.released) == ["a", "b"] and not sched.running and not sched.waiting


@pytest.mark.parametrize("loop", ["queued"], indirect=True)
def test_a_reused_ids_extend_sent_ahead_is_numbered_after_the_forward_carrying_its_release(loop):
    """x ends in decode N; its worker release rides on N+2 (the next Forward built), queued behind N+1. A new
    request reusing the id x arrives while N+1 runs: its extend is sent to run ahead of N+2, so at the worker it
    may run before the release. It is numbered after N+2, which is what lets the worker keep the new x's state
    (a release drops no state that a Forward with a larger seq created: tests/worker/test_forward_release.py)."""
    sched, worker, submit = loop
    a = submit("a", list(range(10, 30)), 40)
    x = submit("x", list(range(40, 52)), 9)  # 1 token from its extend, 8 from decode N
    assert sched.step()  # extend of a and x
    worker.hold_decode = True
    assert sched.step()  # decode N of a and x, reply held
    n_seq = worker.sent[-1][0]
    round_n = threading.Thread(target=sched.step)  # N+1 (a only: x ends in N) sent at once; N applied
    round_n.start()
    worker.wait_sent(3)
    n1_seq, _, n1_items = worker.sent[2]
    assert [it.request_id for it in n1_items] == ["a"]
    worker.pending[n_seq].release()
    round_n.join(WAIT_S)
    assert tokens(x) == [TOKEN] * 9 and worker.carried == {}  # x ended; its release waits for the next Forward
    round_n1 = threading.Thread(target=sched.step)  # N+2 sent at once behind N+1, carrying x's release
    round_n1.start()
    worker.wait_sent(4)
    n2_seq, n2_after, n2_items = worker.sent[3]
    assert ([it.request_id for it in n2_items], n2_after, worker.carried) == (["a"], n1_seq, {n2_seq: ["x"]})
    x2 = submit("x", list(range(60, 70)), 3)  # the id reused while N+1 runs
    worker.wait_sent(5)
    e_seq, e_after, e_items = worker.sent[4]
    assert ([it.request_id for it in e_items], e_items[0].has_prefix, e_after) == (["x"], True, n1_seq)
    assert worker.before[e_seq] == n2_seq and e_seq > n2_seq
    worker.pending[n1_seq].release()
    round_n1.join(WAIT_S)
    assert not round_n1.is_alive()
    let_go(sched, worker)
    assert tokens(a) == [TOKEN] * 40 and tokens(x2) == [TOKEN] * 3
    assert sorted(worker.released) == ["a", "x", "x"]


@pytest.mark.parametrize("loop", ["queued", "just-in-time"], indirect=True)
def test_an_arrival_while_an_extend_ahead_of_the_next_decode_runs_is_sent_at_once(loop):
    sched, worker, submit = loop
    a = submit("a", list(range(10, 30)), 40)
    assert sched.step()  # extend of a
    worker.hold_decode = True
    assert sched.step()  # decode N of a, reply held
    n_seq = worker.sent[-1][0]
    worker.hold_extend = True
    round_n = threading.Thread(target=sched.step)
    round_n.start()
    b = submit("b", list(range(40, 52)), 5)  # arrives while N runs: its extend runs after N, before N+1
    worker.wait_sent(3)
    worker.pending[n_seq].release()
    round_n.join(WAIT_S)
    assert not round_n.is_alive()
    worker.wait_sent(4)  # N+1 (queued: sent before b's extend; just-in-time: after it)
    (eb_seq,) = [seq for seq, _, items in worker.sent if [it.request_id for it in items] == ["b"]]
    (nxt_seq,) = [seq for seq, _, items in worker.sent[2:] if kind(items) == "decode"]
    assert [f.seq for f in sched.pipeline.inflight] == [eb_seq, nxt_seq]  # b's extend held, N+1 behind it

    round_e = threading.Thread(target=sched.step)  # the round that applies b's extend
    round_e.start()
    c = submit("c", list(range(60, 75)), 3)  # arrives while b's extend runs
    worker.wait_sent(5)  # before: c waited for b's reply (the loop blocked in the drain), nothing was sent
    ec_seq, ec_after, ec_items = worker.sent[4]
    assert (kind(ec_items), [it.request_id for it in ec_items], ec_after) == ("extend", ["c"], eb_seq)
    assert worker.before[ec_seq] == nxt_seq
    assert [f.seq for f in sched.pipeline.inflight] == [eb_seq, ec_seq, nxt_seq]
    worker.hold_decode = worker.hold_extend = False
    for held in list(worker.pending.values()):  # b's, c's, N+1 (the round goes on to chain behind N+1)
        held.release()
    round_e.join(WAIT_S)
    assert not round_e.is_alive()
    let_go(sched, worker)
    assert tokens(a) == [TOKEN] * 40 and tokens(b) == [TOKEN] * 5 and tokens(c) == [TOKEN] * 3
    assert sorted(worker.released) == ["a", "b", "c"] and sched.stats["extends_ahead"] == 2


@pytest.mark.parametrize("loop", ["queued", "just-in-time"], indirect=True)
def test_a_request_waiting_when_the_round_begins_is_sent_before_the_extend_ahead_of_the_decode_answers(loop):
    """As above, but c arrives between two rounds: the round that applies b's extend takes it at its start.
    It is admitted at once and its extend sent after b's, ahead of N+1. Before, it waited in the queue until b's
    reply (the drain admitted only later arrivals), then for the chain's admission."""
    sched, worker, submit = loop
    a = submit("a", list(range(10, 30)), 40)
    assert sched.step()  # extend of a
    worker.hold_decode = True
    assert sched.step()  # decode N of a, reply held
    n_seq = worker.sent[-1][0]
    worker.hold_extend = True
    round_n = threading.Thread(target=sched.step)
    round_n.start()
    b = submit("b", list(range(40, 52)), 5)  # arrives while N runs: its extend runs after N, before N+1
    worker.wait_sent(3)
    worker.pending[n_seq].release()
    round_n.join(WAIT_S)
    assert not round_n.is_alive()
    worker.wait_sent(4)
    (eb_seq,) = [seq for seq, _, items in worker.sent if [it.request_id for it in items] == ["b"]]
    (nxt_seq,) = [seq for seq, _, items in worker.sent[2:] if kind(items) == "decode"]
    c = submit("c", list(range(60, 75)), 3)  # waiting when the next round begins

    round_e = threading.Thread(target=sched.step)  # the round that applies b's extend
    round_e.start()
    worker.wait_sent(5)  # b's reply is still held
    ec_seq, ec_after, ec_items = worker.sent[4]
    assert (kind(ec_items), [it.request_id for it in ec_items], ec_after) == ("extend", ["c"], eb_seq)
    assert worker.before[ec_seq] == nxt_seq
    assert [f.seq for f in sched.pipeline.inflight] == [eb_seq, ec_seq, nxt_seq]
    worker.hold_decode = worker.hold_extend = False
    for held in list(worker.pending.values()):
        held.release()
    round_e.join(WAIT_S)
    assert not round_e.is_alive()
    let_go(sched, worker)
    assert tokens(a) == [TOKEN] * 40 and tokens(b) == [TOKEN] * 5 and tokens(c) == [TOKEN] * 3
    assert sorted(worker.released) == ["a", "b", "c"] and sched.stats["extends_ahead"] == 2


@pytest.mark.parametrize("loop", ["queued"], indirect=True)
def test_what_is_deferred_is_sent_while_the_loop_waits_with_nothing_to_admit(loop):
    """x ends in decode N: its cache insert is deferred (it rides on the loop's next cache call). b's extend was
    sent ahead of N+1 while N ran; the next round waits for b's reply with nothing arriving: it sends x's insert
    then (the worker runs meanwhile), so the next arrival's Match carries nothing. Before, it waited in the cache
    client until the next Match or Allocate: on an arrival's admission round trip."""
    sched, worker, submit = loop
    a = submit("a", list(range(10, 30)), 40)
    x = submit("x", list(range(40, 52)), 9)  # 1 token from its extend, 8 from decode N
    assert sched.step()  # extend of a and x
    worker.hold_decode = True
    assert sched.step()  # decode N of a and x, reply held
    n_seq = worker.sent[-1][0]
    worker.hold_extend = True
    round_n = threading.Thread(target=sched.step)  # N+1 (a only) sent at once; b admitted while N runs
    round_n.start()
    worker.wait_sent(3)
    b = submit("b", list(range(60, 72)), 5)
    worker.wait_sent(4)
    worker.pending[n_seq].release()
    round_n.join(WAIT_S)
    assert not round_n.is_alive()
    assert tokens(x) == [TOKEN] * 9 and sched.cache.deferred_ends == 1  # x's insert waits for a cache call
    (eb_seq,) = [seq for seq, _, items in worker.sent if [it.request_id for it in items] == ["b"]]
    assert sched.pipeline.head().seq == eb_seq and len(sched.pipeline) == 2

    round_e = threading.Thread(target=sched.step)  # waits for b's extend (held), nothing arrives
    round_e.start()
    deadline = time.monotonic() + WAIT_S
    while sched.cache.deferred_ends and time.monotonic() < deadline:
        time.sleep(0.001)
    assert sched.cache.deferred_ends == 0 and sched.cache.get_pool().requests == 2  # a and b; x is cached
    assert round_e.is_alive()  # still waiting for b's reply
    worker.hold_decode = worker.hold_extend = False
    for held in list(worker.pending.values()):
        held.release()
    round_e.join(WAIT_S)
    assert not round_e.is_alive()
    let_go(sched, worker)
    assert tokens(a) == [TOKEN] * 40 and tokens(b) == [TOKEN] * 5
    assert sorted(worker.released) == ["a", "b", "x"]


@pytest.mark.parametrize("loop", ["queued"], indirect=True)
def test_a_waiting_request_aborted_before_the_round_is_not_admitted_by_the_drain(loop):
    """A request aborted while it waits (the typist's previous keystroke) ends in the round's abort pass: the
    admission that ``_drain_extends`` makes ahead of the extend in flight does not Match, allocate and send it
    (review of session 10: it did, since that admission ran before the abort pass)."""

    sched, worker, submit = loop
    submit("a", list(range(10, 30)), 40)
    assert sched.step()
    worker.hold_decode = True
    assert sched.step()
    n_seq = worker.sent[-1][0]
    worker.hold_extend = True
    round_n = threading.Thread(target=sched.step)
    round_n.start()
    submit("b", list(range(40, 52)), 5)
    worker.wait_sent(3)
    worker.pending[n_seq].release()
    round_n.join(WAIT_S)
    worker.wait_sent(4)
    submit("c", list(range(60, 75)), 3)
    assert sched.abort("c")  # before the next round begins
    round_e = threading.Thread(target=sched.step)
    round_e.start()
    time.sleep(1.0)  # the round's admissions are sent while the extend ahead is held
    sent_c = [seq for seq, _, items in worker.sent if "c" in [it.request_id for it in items]]
    worker.hold_decode = worker.hold_extend = False
    for held in list(worker.pending.values()):
        held.release()
    round_e.join(WAIT_S)
    let_go(sched, worker)
    assert sent_c == []
