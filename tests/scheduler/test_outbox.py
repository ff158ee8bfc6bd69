"""The outbox (``scheduler_svc/outbox.py``): a chained decode Forward's stream messages reach their streams once the
next Forward is sent, not while it is built; items keep their order; a failure lets what was held go first.

The loop runs against the real cache service (in-process) and ``test_arrival_order``'s recording worker; the rounds
are stepped by hand, so "when Forward N+2 is sent" is a point in the test, not a timing."""

from __future__ import annotations

import queue
import threading

import pytest
import structlog

from codeserve.v1 import scheduler_pb2
from scheduler_svc.outbox import Outbox
from scheduler_svc.output import OutputStream
from scheduler_svc.scheduler import Scheduler, SchedulerConfig
from scheduler_svc.validate import build_request
from tests.scheduler.cache_service import cache_service
from tests.scheduler.test_arrival_order import TOKEN, RecordingWorker, kind, let_go, tokens


def test_items_put_while_holding_go_out_at_the_release_in_put_order():
    box, a, b = Outbox(), queue.SimpleQueue(), queue.SimpleQueue()
    box.put(a, 1)
    assert a.get_nowait() == 1 and not box.holding
    box.hold()
    box.put(a, 2)
    box.put(b, 3)
    threading.Thread(target=box.put, args=(a, 4)).start()  # another thread's put while holding is kept too
    for _ in range(100):
        if len(box._held) == 3:
            break
        threading.Event().wait(0.01)
    assert a.empty() and b.empty()
    assert box.release() == 3 and not box.holding
    assert [a.get_nowait(), a.get_nowait(), b.get_nowait()] == [2, 4, 3]
    assert box.release() == 0


def test_a_failure_inside_released_on_error_lets_the_held_items_go_first():
    box, q = Outbox(), queue.SimpleQueue()
    box.hold()
    box.put(q, "held")
    with pytest.raises(RuntimeError):
        with box.released_on_error():
            raise RuntimeError("loop failure")
    assert q.get_nowait() == "held" and not box.holding


@pytest.fixture(params=[True, False], ids=["deliver-after-send", "deliver-at-once"])
def loop(tokenizer, request):
    with cache_service() as (_, cache):
        worker = RecordingWorker()
        sched = Scheduler(cache, worker, SchedulerConfig(decode_steps=8, overlap=True, overlap_mode="queued",
                                                         deliver_after_send=request.param), structlog.get_logger())
        sched.connect()
        yield sched, worker, request.param


def test_a_chained_decodes_messages_reach_the_stream_once_the_next_forward_is_sent(loop, tokenizer):
    sched, worker, after_send = loop
    req = build_request(scheduler_pb2.GenerateRequest(request_id="a", input_ids=scheduler_pb2.TokenIds(ids=list(range(10, 30))),
                                                      max_new_tokens=40, ignore_eos=True), tokenizer, sched.info,
                        sched.capacity)
    req.stream = OutputStream(req, tokenizer, sched.info.eos_token_id, outbox=sched.outbox)
    sched.submit(req)
    seen_at_send: dict[int, int] = {}  # seq of each decode Forward sent -> tokens the stream held at that moment
    streamed: list[int] = []
    send = worker.send

    def send_and_look(request):
        while not req.out.empty():  # what the stream thread would have read by now
            streamed.extend(req.out.get_nowait().token_ids)
        if kind(request.items) == "decode":
            seen_at_send[request.seq] = len(streamed)
        return send(request)

    worker.send = send_and_look
    assert sched.step()  # the extend: its first token goes out at once (only a chain's decode is held)
    assert sched.step()  # decode N sent, not waited for
    assert sched.step()  # the chain: N+1 sent, N's reply applied (its 8 tokens held with the outbox)
    assert sched.step()  # the chain: N+2 sent, then N's message released; N+1 applied
    decodes = sorted(seen_at_send)
    assert len(decodes) >= 3
    # when N+2 was sent the stream had the extend's token, and N's 8 tokens only without the outbox
    assert seen_at_send[decodes[2]] == (1 if after_send else 9), seen_at_send
    assert sched.outbox.holding == after_send  # N+1's tokens wait for N+3's send
    let_go(sched, worker)
    assert streamed + tokens(req) == [TOKEN] * 40 and not sched.outbox.holding


def test_the_messages_of_a_decode_with_nothing_chained_behind_it_go_out_as_it_is_applied(loop, tokenizer):
    """H100 run 20 call 1 (hop trace, 1B c64): when a wave of requests ended in one decode Forward, their last
    messages were held while it was applied and released by the next round only, ~20 ms after they were built, and
    the next wave's requests (sent by the clients on those messages) reached the worker that much later. Nothing is
    chained behind such a Forward, so nothing is built while its messages are held: they go out at once."""
    sched, worker, after_send = loop
    req = build_request(scheduler_pb2.GenerateRequest(request_id="a", input_ids=scheduler_pb2.TokenIds(ids=list(range(10, 30))),
                                                      max_new_tokens=17, ignore_eos=True), tokenizer, sched.info,
                        sched.capacity)
    req.stream = OutputStream(req, tokenizer, sched.info.eos_token_id, outbox=sched.outbox)
    sched.submit(req)
    assert sched.step()  # the extend: token 1
    assert sched.step()  # decode N (tokens 2..9) sent
    assert sched.step()  # the chain: N+1 (tokens 10..17, the last) sent, N applied
    assert sched.step()  # the chain: nothing to chain behind N+1 (the request ends there); N+1 applied
    assert not sched.outbox.holding
    assert tokens(req) == [TOKEN] * 17  # the stream ended without another round


def test_a_failure_while_messages_are_held_sends_them_then_the_error(tokenizer):
    """Review of session 15: a stall or an outage noticed at the top of the loop, between the chain's apply (messages
    held) and the next round's send, failed the streams behind the held messages, which then waited for a round
    that does not come while the worker is silent. ``OutputStream.fail`` now lets the outbox go first."""
    import grpc

    from scheduler_svc.request import StreamEnd

    with cache_service() as (_, cache):
        worker = RecordingWorker()
        sched = Scheduler(cache, worker, SchedulerConfig(decode_steps=8, overlap=True, overlap_mode="queued"),
                          structlog.get_logger())
        sched.connect()
        req = build_request(scheduler_pb2.GenerateRequest(request_id="a", input_ids=scheduler_pb2.TokenIds(ids=list(range(10, 30))),
                                                          max_new_tokens=400, ignore_eos=True), tokenizer, sched.info,
                            sched.capacity)
        req.stream = OutputStream(req, tokenizer, sched.info.eos_token_id, outbox=sched.outbox)
        sched.submit(req)
        for _ in range(3):  # extend, decode N, the chain: N's 8 tokens held
            assert sched.step()
        assert sched.outbox.holding
        sched.recovery.fail_all(grpc.StatusCode.UNAVAILABLE, "worker stalled")  # what a stall at the loop's top does
        got = []
        while not req.out.empty():
            got.append(req.out.get_nowait())
        assert [len(m.token_ids) for m in got[:-1]] == [1, 8] and isinstance(got[-1], StreamEnd)
        assert got[-1].code == grpc.StatusCode.UNAVAILABLE and not sched.outbox.holding
