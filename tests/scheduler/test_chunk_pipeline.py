"""Chunked prefill pipelined (issue 15, technique 4): chunk k+1 of a long prompt is allocated and sent while
chunk k runs (``after_seq`` = chunk k), so the worker never idles between the chunks of one prompt.

The scheduler runs in this process against the real cache service (in-process gRPC server) and a worker that
records each Forward and holds its reply until the test lets it go: "while chunk k runs" is a state, not a
timing (no test here measures time).

- Chunk k+1 reaches the worker before chunk k's reply was applied, at the predicted position, without the
  prefix (the worker knows the request from chunk k), and never more than two Forwards are in flight.
- The same for the extend of an arrival waiting with room behind an extend of whole prompts.
- Chunk k fails (the worker unreachable) after chunk k+1 was allocated and sent (the worker answers it ABORTED,
  as ``worker_svc/ordering.py`` does): after the resync and the recompute nothing is held at the cache
  (available == capacity after a flush, integrity clean) and the output is complete.
- An abort while chunks are in flight: no chunk is sent after the abort is seen, the request ends "abort",
  and the cache and the worker hold nothing of it.
- With ``mixed_chunk`` a decoding request rides in the pipelined chunk as an ``input_from_last_sample`` entry at
  its predicted position (its token of chunk k is not known when chunk k+1 is sent).
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest
import structlog

from cache_svc.core import CacheCore
from codeserve.v1 import worker_pb2
from scheduler_svc.request import StreamEnd
from scheduler_svc.scheduler import Scheduler, SchedulerConfig
from tests.scheduler.cache_service import cache_service
from tests.scheduler.fake_worker import LaterReply, RpcFailure, forward_response
from tests.scheduler.test_arrival_order import submitter

TOKEN = 77
WAIT_S = 30.0  # upper bound for a condition that holds at once in a correct scheduler (not a measured time)
CHUNK = 16
CAPACITY = 4096


class ChunkWorker:
    """Stands in for WorkerClient: records every ForwardRequest, answers TOKEN for each sampled position, and
    (``hold``) keeps each reply until ``answer(seq)``. ``fail(seq)`` answers Forward ``seq`` UNAVAILABLE and
    every Forward sent after it with ``after_seq`` on it ABORTED (the real worker's ordering). ``in_flight_max``:
    the most Forwards sent and not yet answered at once."""

    def __init__(self) -> None:
        self.epoch = ""
        self.hold = True
        self.sent: list[worker_pb2.ForwardRequest] = []
        self.replies: dict[int, LaterReply] = {}
        self.answered: set[int] = set()
        self.failed: set[int] = set()
        self.released: list[str] = []
        self.in_flight_max = 0
        self.changed = threading.Condition()

    def info(self) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(worker_id="w0", epoch="e1", model_name="chunks", n_positions=2048,
                                     vocab_size=1000, eos_token_id=0, capacity_tokens=CAPACITY, page_size=1,
                                     pool_slots=CAPACITY + 1)

    def prepare(self, items, seq: int, after_seq: int = 0, before_seq: int = 0) -> worker_pb2.ForwardRequest:
        return worker_pb2.ForwardRequest(expected_epoch=self.epoch, items=items, seq=seq, after_seq=after_seq,
                                         before_seq=before_seq)

    def send(self, request: worker_pb2.ForwardRequest) -> LaterReply:
        reply = LaterReply()
        with self.changed:
            self.sent.append(request)
            self.replies[request.seq] = reply
            self.in_flight_max = max(self.in_flight_max, len(self.replies) - len(self.answered))
            self.changed.notify_all()
            hold = self.hold
        if request.after_seq in self.failed:
            self._fail(request.seq, grpc.StatusCode.ABORTED, f"runs after seq {request.after_seq}, which failed")
        elif not hold:
            self.answer(request.seq)
        return reply

    def answer(self, seq: int) -> None:
        request = next(r for r in self.sent if r.seq == seq)
        with self.changed:
            self.answered.add(seq)
            self.released.extend(request.release_request_ids)
        self.replies[seq].answer(forward_response(request.items, TOKEN))

    def fail(self, seq: int) -> None:
        self._fail(seq, grpc.StatusCode.UNAVAILABLE, "worker went away")
        for r in list(self.sent):  # sent after it, behind it: aborted at the worker
            if r.after_seq == seq:
                self._fail(r.seq, grpc.StatusCode.ABORTED, f"runs after seq {seq}, which failed")

    def _fail(self, seq: int, code: grpc.StatusCode, details: str) -> None:
        with self.changed:
            self.answered.add(seq)
            self.failed.add(seq)
        self.replies[seq].future.set_exception(RpcFailure(code, details))

    def release(self, request_ids) -> int:
        with self.changed:
            self.released.extend(request_ids)
        return len(request_ids)

    def wait_sent(self, n: int) -> list[worker_pb2.ForwardRequest]:
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.sent) >= n, WAIT_S):
                raise AssertionError(f"the scheduler sent {len(self.sent)} Forwards, expected at least {n}")
            return list(self.sent)


@pytest.fixture
def loop(tokenizer, request):
    mixed = getattr(request, "param", False)
    with cache_service() as (core, cache):
        worker = ChunkWorker()
        # (the decode chained behind a last chunk is tests/scheduler/test_chain_after_extend.py's: here an extend that
        # ends every prefill is applied before the next round, as these tests' set-ups expect)
        sched = Scheduler(cache, worker, SchedulerConfig(chunk_size=CHUNK, decode_steps=1, mixed_chunk=mixed,
                                                         chain_after_extend=False),
                          structlog.get_logger())
        sched.connect()
        yield sched, worker, submitter(sched, tokenizer), core
        sched.stop("test over")


def ended(req) -> tuple[list[int], str]:
    """(token ids streamed, finish reason) once the request's stream ended successfully."""
    out, reason = [], ""
    while not isinstance(item := req.out.get(timeout=WAIT_S), StreamEnd):
        out.extend(item.token_ids)
        reason = item.finish_reason or reason
    assert item.code is None, item.message
    return out, reason


def settled(sched: Scheduler, core: CacheCore) -> None:
    """The loop holds nothing and, after a flush of the tree, every slot of the pool is available again."""
    deadline = time.monotonic() + WAIT_S
    while (sched.running or sched.waiting or sched.table.held()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not sched.running and not sched.waiting and sched.table.held() == 0
    core.flush("test-flush", "default")
    status = core.pool_status("default")[0]
    assert core.check_integrity("default") == []
    assert status.counters.available == status.counters.capacity, f"leaked slots: {status.counters}"


def extends_of(sent, rid: str) -> list[tuple[int, int, int, bool]]:
    """(seq, after_seq, position_start, has_prefix) of each item of ``rid`` that brings prompt tokens."""
    return [(r.seq, r.after_seq, it.position_start, it.has_prefix) for r in sent for it in r.items
            if it.request_id == rid and len(it.input_ids) > 1]


def test_the_next_chunk_is_sent_while_the_previous_one_runs(loop):
    sched, worker, submit, core = loop
    prompt = list(range(100, 200))  # 100 tokens: 6 chunks of 16, then 4
    a = submit("a", prompt, 3)
    rounds = threading.Thread(target=lambda: [sched.step() for _ in range(2)], daemon=True)
    rounds.start()  # round 1 sends chunk 1; round 2 sends chunk 2 and waits for chunk 1
    sent = worker.wait_sent(2)
    (s1, after1, pos1, prefix1), (s2, after2, pos2, prefix2) = extends_of(sent, "a")
    assert (after1, pos1, prefix1) == (0, 0, True)
    assert (after2, pos2, prefix2) == (s1, CHUNK, False), "chunk 2 runs after chunk 1, where chunk 1 ends"
    assert list(sent[1].items[0].input_ids) == prompt[CHUNK:2 * CHUNK]
    assert a.kv_len == 0 and s1 not in worker.answered, "chunk 2 was sent before chunk 1's reply was applied"
    worker.hold = False
    for seq in list(worker.replies):
        worker.answer(seq)
    rounds.join(WAIT_S)
    threading.Thread(target=sched.run, daemon=True).start()
    assert ended(a) == ([TOKEN] * 3, "length")
    sent = list(worker.sent)
    chunks = extends_of(sent, "a")
    assert [pos for _, _, pos, _ in chunks] == list(range(0, 100, CHUNK))
    assert all(after == prev for (prev, _, _, _), (_, after, _, _) in zip(chunks, chunks[1:]))
    assert worker.in_flight_max == 2 and sched.stats["chunks_ahead"] == len(chunks) - 1
    settled(sched, core)
    assert worker.released == ["a"]


def test_an_arrivals_extend_is_sent_while_the_extend_before_it_runs(loop):
    """Prompts of one chunk each (a burst of arrivals: the H200's c64 phase, 8 whole prompts per 8,192-token
    extend): the extend admitting b is sent behind a's before a's reply is applied; decode follows them."""
    sched, worker, submit, core = loop
    a, b, c = (submit(rid, list(range(base, base + CHUNK)), 2) for rid, base in (("a", 100), ("b", 200), ("c", 300)))
    rounds = threading.Thread(target=lambda: [sched.step() for _ in range(2)], daemon=True)
    rounds.start()
    sent = worker.wait_sent(2)
    assert [[it.request_id for it in r.items] for r in sent[:2]] == [["a"], ["b"]]
    assert sent[1].after_seq == sent[0].seq and a.kv_len == 0 and sent[0].seq not in worker.answered
    worker.hold = False
    for seq in list(worker.replies):
        worker.answer(seq)
    rounds.join(WAIT_S)
    threading.Thread(target=sched.run, daemon=True).start()
    assert [ended(r) for r in (a, b, c)] == [([TOKEN] * 2, "length")] * 3
    assert [[it.request_id for it in r.items] for r in worker.sent[:3]] == [["a"], ["b"], ["c"]]
    assert worker.in_flight_max == 2
    settled(sched, core)


def test_a_failed_chunk_leaves_no_slot_held(loop):
    sched, worker, submit, core = loop
    a = submit("a", list(range(100, 200)), 3)
    threading.Thread(target=sched.run, daemon=True).start()
    worker.wait_sent(2)  # chunk 2 sent behind chunk 1
    worker.answer(worker.sent[0].seq)
    sent = worker.wait_sent(3)  # chunk 3 allocated and sent behind chunk 2, which is still running
    assert [pos for _, _, pos, _ in extends_of(sent, "a")] == [0, CHUNK, 2 * CHUNK]
    with worker.changed:
        worker.hold = False
    worker.fail(sent[1].seq)  # chunk 2 fails; chunk 3 (after it) is aborted at the worker
    assert ended(a) == ([TOKEN] * 3, "length")  # recomputed from its first token after the resync
    settled(sched, core)
    assert a.retractions == 1 and "a" in worker.released


def test_an_abort_mid_pipeline_releases_everything(loop):
    sched, worker, submit, core = loop
    a = submit("a", list(range(100, 200)), 3)
    threading.Thread(target=sched.run, daemon=True).start()
    worker.wait_sent(2)
    worker.answer(worker.sent[0].seq)
    worker.wait_sent(3)  # chunks 2 and 3 in flight
    assert sched.abort("a")
    with worker.changed:
        worker.hold = False
        pending = [s for s in worker.replies if s not in worker.answered]
    for seq in pending:
        worker.answer(seq)
    assert ended(a)[1] == "abort"
    settled(sched, core)
    assert len(extends_of(worker.sent, "a")) <= 4  # at most the one planned while the abort came in
    assert worker.released == ["a"]


@pytest.mark.parametrize("loop", [True], indirect=True)
def test_a_decoding_request_rides_in_a_pipelined_chunk_from_its_last_sample(loop):
    sched, worker, submit, core = loop
    worker.hold = False
    d = submit("d", list(range(300, 305)), 20)
    assert sched.step() and not sched.pipeline  # d's extend, alone (5 tokens: its first token sampled)
    assert d.kv_len == 5 and len(d.output_ids) == 1
    worker.hold = True
    a = submit("a", list(range(100, 200)), 3)
    before = len(worker.sent)
    rounds = threading.Thread(target=lambda: [sched.step() for _ in range(2)], daemon=True)
    rounds.start()  # chunk 1 of a with d riding; then chunk 2 with d from its last sample
    sent = worker.wait_sent(before + 2)
    first, second = sent[-2], sent[-1]
    riders = [it for it in first.items if it.request_id == "d"]
    assert len(riders) == 1 and not riders[0].input_from_last_sample
    ahead = [it for it in second.items if it.request_id == "d"]
    assert second.after_seq == first.seq
    assert len(ahead) == 1 and ahead[0].input_from_last_sample and ahead[0].sample
    assert ahead[0].position_start == riders[0].position_start + 1 and not ahead[0].input_ids
    worker.hold = False
    for seq in [s for s in worker.replies if s not in worker.answered]:
        worker.answer(seq)
    rounds.join(WAIT_S)
    threading.Thread(target=sched.run, daemon=True).start()
    assert ended(a) == ([TOKEN] * 3, "length")
    assert ended(d) == ([TOKEN] * 20, "length")
    settled(sched, core)


def test_a_pool_that_cannot_fund_the_chunk_behind_sends_nothing_behind_and_the_request_completes(loop):
    """The next chunk's Allocate fails while chunk 1 runs (another session took every free page): nothing is sent
    behind, chunk 1's reply is applied, and once pages are free again the request completes with nothing held."""
    from cache_svc.items import MatchItem

    sched, worker, submit, core = loop
    a = submit("a", list(range(100, 200)), 3)
    sched.step()  # chunk 1 sent, not waited for
    assert len(worker.wait_sent(1)) == 1
    sid = core.open_session("other").session_id
    core.match("o-match", sid, "default", [MatchItem("hog", "", (1,), True)])
    free = core.pool_status("default")[0].counters.available
    core.allocate("o-alloc", sid, "default", [("hog", free)])
    worker.answer(worker.sent[0].seq)
    sched.step()  # the chunk behind cannot be funded: chunk 1's reply is applied, nothing else sent
    assert len(worker.sent) == 1 and a.kv_len == CHUNK and sched.stats["chunks_ahead"] == 0
    core.release_requests("o-release", sid, "default", ["hog"])
    worker.hold = False
    threading.Thread(target=sched.run, daemon=True).start()
    assert ended(a) == ([TOKEN] * 3, "length")
    settled(sched, core)


def test_a_failed_extend_ahead_while_an_arrival_is_admitted_behind_it_leaves_no_slot_held(loop):
    """Steady decode of a (overlapped, queued): b arrives while decode N runs (its extend runs after N, ahead of
    N+1); N is applied and, while b's extend runs, c arrives and its extend is sent behind b's (the loop admits
    arrivals while it applies the extends ahead of a decode, ``Scheduler._drain_extends``). b's extend fails:
    what is in flight is dropped, the resync requeues everyone, every request still ends with its tokens."""
    sched, worker, submit, core = loop
    a = submit("a", list(range(100, 110)), 30)
    threading.Thread(target=sched.run, daemon=True).start()
    worker.answer(worker.wait_sent(1)[0].seq)  # a's extend
    sent = worker.wait_sent(3)  # decode N, and N+1 queued behind it
    n, nxt = sent[1], sent[2]
    assert nxt.after_seq == n.seq
    b = submit("b", list(range(200, 210)), 3)
    eb = worker.wait_sent(4)[3]
    assert [it.request_id for it in eb.items] == ["b"] and eb.before_seq == nxt.seq
    worker.answer(n.seq)  # N applied; the loop now applies b's extend (held), admitting arrivals meanwhile
    c = submit("c", list(range(300, 310)), 3)
    ec = worker.wait_sent(5)[4]
    assert ([it.request_id for it in ec.items], ec.after_seq, ec.before_seq) == (["c"], eb.seq, nxt.seq)
    with worker.changed:
        worker.hold = False
    worker.fail(eb.seq)  # and c's extend behind it is aborted
    worker.answer(nxt.seq)  # the stale decode's answer, which the resync waits for
    assert [ended(r) for r in (a, b, c)] == [([TOKEN] * 30, "length"), ([TOKEN] * 3, "length"), ([TOKEN] * 3, "length")]
    settled(sched, core)
    assert b.retractions == 1 and c.retractions == 1


def test_an_abort_of_another_request_does_not_stop_the_pipeline(loop):
    """Keystroke-rate aborts: a decoding request b is aborted while a's chunks are pipelined. b is in no Forward
    in flight, so the loop ends it at once (released at the worker on the next Forward) and a's next chunk is
    still sent behind the one running, not after a drain (before: any abort pending stopped the pipeline)."""
    sched, worker, submit, core = loop
    worker.hold = False
    b = submit("b", list(range(300, 305)), 20)
    assert sched.step() and not sched.pipeline  # b's extend, alone: b decodes next
    worker.hold = True
    a = submit("a", list(range(100, 200)), 3)
    before = len(worker.sent)
    threading.Thread(target=sched.run, daemon=True).start()
    sent = worker.wait_sent(before + 2)  # a's chunks 1 and 2
    c1, c2 = sent[before], sent[before + 1]
    assert c2.after_seq == c1.seq
    assert sched.abort("b")
    worker.answer(c1.seq)
    sent = worker.wait_sent(before + 3)  # chunk 3 behind chunk 2, which is still running
    c3 = sent[before + 2]
    assert c3.after_seq == c2.seq and c2.seq not in worker.answered
    assert [it.request_id for it in c3.items] == ["a"] and "b" in c3.release_request_ids
    assert ended(b)[1] == "abort"
    with worker.changed:
        worker.hold = False
        pending = [s for s in worker.replies if s not in worker.answered]
    for seq in pending:
        worker.answer(seq)
    assert ended(a) == ([TOKEN] * 3, "length")
    settled(sched, core)
    assert sorted(worker.released) == ["a", "b"]
