"""The request table on its own (no cache service, no worker): where a request stands after each transition,
what is released where, and the counts derived from it. The cache and the worker are one recording stand-in
(this test is about the table's calls, not about the services)."""

import pytest
import structlog

from codeserve.v1 import common_pb2
from scheduler_svc.intake import Intake
from scheduler_svc.output import OutputStream
from scheduler_svc.request import Finish, Params, Req, State, StreamEnd
from scheduler_svc.requests import RequestTable, Stance

EOS = 0


class Recorder:
    """Stands in for CacheClient and WorkerClient: records (call, argument); ``fail`` names a call that raises."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.fail = ""

    def _call(self, name: str, arg) -> None:
        self.calls.append((name, arg))
        if name == self.fail:
            raise ConnectionError(f"{name} failed")

    def defer_release(self, rids):
        if rids:
            self.release_requests(rids)

    def defer_cache(self, items):
        if items:
            self.cache_requests(items)

    deferred_ends = 0  # its defer_* send at once

    def flush_deferred(self) -> None:
        pass

    def release_requests(self, rids):
        self._call("cache.release", list(rids))

    def cache_requests(self, items):
        self._call("cache.cache", [(it.request_id, list(it.token_ids)) for it in items])

    def release(self, rids):
        self._call("worker.release", list(rids))


@pytest.fixture
def parts(tokenizer):
    rec, intake = Recorder(), Intake(16)
    table = RequestTable(rec, rec, intake, structlog.get_logger())

    def new(rid: str, prompt=(5, 6, 7), max_new: int = 4) -> Req:
        req = Req(rid=rid, prompt_ids=list(prompt), params=Params(
            max_new_tokens=max_new, asked_max_new_tokens=max_new, sampling=common_pb2.SamplingParams(), ignore_eos=True))
        req.stream = OutputStream(req, tokenizer, EOS)
        intake.submit(req, len(table.waiting))
        return req

    return table, rec, intake, new


def ends(req: Req) -> list:
    out = []
    while not req.out.empty():
        out.append(req.out.get_nowait())
    return out


def test_a_request_moves_through_the_table_and_is_released_once(parts):
    table, rec, intake, new = parts
    a = new("a")
    assert table.where(a) is None and table.take_new() == 1 and table.where(a) == Stance.WAITING
    assert table.snapshot == (0, 1, 3)
    table.admit(a, 0, [])
    assert table.where(a) == Stance.PREFILLING and a.state == State.PREFILL and a.kv_len == 0
    table.prefill_done(a)
    assert table.where(a) == Stance.DECODING and a.state == State.DECODE
    a.kv_len, a.worker_knows = 3, True
    a.stream.on_token(9, 0.0, None)
    a.stream.finish_without_token(Finish.LENGTH)  # finished now; still in a Forward in flight
    table.finish([a], lambda: {"a"})
    assert table.where(a) == Stance.FINISHING and rec.calls == [] and intake.busy()
    table.publish()
    assert table.snapshot == (1, 0, 0) and table.held() == 1
    table.finish([], set)  # the Forward that held it was applied
    assert rec.calls == [("cache.cache", [("a", [5, 6, 7])])] and table.releases.pending == ["a"]  # on the next Forward
    assert table.flush_releases() == 1  # or, idle, with one Release RPC
    assert rec.calls[-1] == ("worker.release", ["a"]) and table.releases.pending == [] and table.flush_releases() == 0
    assert table.where(a) is None and table.held() == 0 and not intake.busy()
    assert isinstance(ends(a)[-1], StreamEnd)


def test_a_finish_calls_nothing_and_the_resync_releases_what_no_forward_carried(parts):
    """finish defers its cache insert (to the cache client's next call) and queues the worker release (for the next
    Forward): it raises nothing and answers at once. When the call that would carry them fails, the resync releases
    the request at the worker (its new session frees the cache's slots)."""
    table, rec, intake, new = parts
    a = new("a")
    table.take_new()
    table.admit(a, 0, [])
    a.kv_len, a.worker_knows = 3, True
    a.stream.finish_without_token(Finish.LENGTH)
    rec.calls = []
    table.finish([a], set)
    assert [c for c in rec.calls if c[0] == "worker.release"] == [] and table.releases.pending == ["a"]
    assert table.where(a) is None and not intake.busy()
    assert ends(a)[-1] == StreamEnd()  # answered at once
    rec.calls = []
    assert table.resynced(table.worker_held_ids()) == 0
    assert rec.calls == [("worker.release", ["a"])] and table.held() == 0 and table.releases.pending == []


def test_retract_caches_the_written_prefix_and_puts_the_request_first(parts):
    table, rec, _, new = parts
    a, b = new("a"), new("b")
    table.take_new()
    table.admit(a, 0, [])
    a.kv_len, a.worker_knows = 2, True
    table.retract(a, cache_prefix=True)
    assert list(table.waiting) == [a, b] and a.state == State.WAITING and a.retractions == 1 and a.kv_len == 0
    assert rec.calls == [("cache.cache", [("a", [5, 6])])] and table.releases.take(7) == ["a"]  # on Forward 7
    rec.calls = []
    table.admit(a, 0, [])  # the worker does not know it now: released at the cache only
    table.retract(a, cache_prefix=False)
    assert rec.calls == [("cache.release", ["a"])] and table.releases.pending == []


def test_aborts_end_waiting_requests_and_release_running_ones_without_caching(parts):
    table, rec, intake, new = parts
    a, b = new("a"), new("b")
    table.take_new()
    table.admit(a, 0, [])
    a.worker_knows = True
    assert intake.abort("a", "test") and intake.abort("b", "test")  # flagged as Scheduler.abort flags them
    table.abort(held={"a"})  # a Forward in flight holds a
    assert table.where(a) == Stance.PREFILLING and table.where(b) is None and rec.calls == []
    table.abort()
    assert table.where(a) is None and rec.calls == [("cache.release", ["a"])] and table.releases.pending == ["a"]
    assert a.finish == Finish.ABORT and b.finish == Finish.ABORT and not intake.busy()


def test_fail_all_answers_finished_ones_fails_the_rest_and_orphans_the_running(parts):
    table, rec, intake, new = parts
    a, b = new("a"), new("b")
    table.take_new()
    table.admit(a, 0, [])
    c = new("c")  # still in the intake
    table.fail_all("UNAVAILABLE", "down")
    assert [e for e in ends(b)] == [StreamEnd("UNAVAILABLE", "down")] == ends(c)
    assert ends(a) == [StreamEnd("UNAVAILABLE", "down")]
    assert table.orphans == ["a"] and table.held() == 1 and table.snapshot == (1, 0, 0) and not intake.busy()
    assert rec.calls == []


def test_an_aborted_running_request_caches_what_was_written(parts):
    """An editor aborts most completions mid-prefill; the written part of the prompt stays in the radix tree
    (evictable) for the next keystroke's request, as a retract keeps it; a request with nothing written yet is
    released."""
    table, rec, intake, new = parts
    a, b = new("a", prompt=(5, 6, 7, 8, 9)), new("b")
    table.take_new()
    table.admit(a, 0, [])
    table.admit(b, 0, [])
    a.kv_len, a.worker_knows = 3, True  # one chunk of 3 tokens applied, 2 still to prefill
    assert intake.abort("a", "client disconnected") and intake.abort("b", "client disconnected")
    table.abort()
    assert rec.calls == [("cache.cache", [("a", [5, 6, 7])]), ("cache.release", ["b"])]
    assert table.releases.pending == ["a"]  # at the worker: on the next Forward
    assert table.where(a) is None and table.where(b) is None and a.finish == Finish.ABORT


def test_the_resync_releases_what_no_forward_was_seen_to_release(parts):
    """Worker releases pending (on no Forward yet) and carried by a Forward that never answered OK are not lost:
    the resync releases them with the orphans and the running ones; one carried by a Forward that answered is
    not sent again."""
    table, rec, intake, new = parts
    reqs = {rid: new(rid) for rid in "abcd"}
    table.take_new()
    for req in reqs.values():
        table.admit(req, 0, [])
        req.kv_len, req.worker_knows = 3, True
        req.stream.finish_without_token(Finish.LENGTH)
    table.finish([reqs["a"]], set)
    assert table.releases.take(11) == ["a"]  # carried by Forward 11, which answers OK
    table.releases.answered(11)
    table.finish([reqs["b"]], set)
    assert table.releases.take(12) == ["b"]  # carried by Forward 12, which fails
    table.finish([reqs["c"]], set)  # pending
    rec.calls = []
    table.fail_all("UNAVAILABLE", "down")  # d was running: orphaned
    assert sorted(table.worker_held_ids()) == ["b", "c", "d"]
    table.resynced(table.worker_held_ids())
    assert [(n, sorted(ids)) for n, ids in rec.calls] == [("worker.release", ["b", "c", "d"])]
    assert table.releases.outstanding() == [] and table.worker_held_ids() == []
