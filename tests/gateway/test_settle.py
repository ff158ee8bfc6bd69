"""A finished call is never cancelled by the gateway (``GenerationStream``): once a message with a finish_reason other
than "abort" was read, ``cancel()`` (the answer ending: the client gone, a sibling failing, the response done) awaits
the call's status in the background instead, also when ``messages()`` never resumed after that message (the first
message, read by ``open_streams``, was the last; the client left while the last event was sent). A call cancelled
before its last message is cancelled. Found by the review of session 30 (red before its fix)."""

from __future__ import annotations

import asyncio

from codeserve.v1 import scheduler_pb2
from gateway.generation import GenerationStream


class FakeCall:
    """A grpc.aio call: ``read()`` hands out the scripted messages, ``code()`` waits for ``status``."""

    def __init__(self, msgs):
        self.msgs, self.cancelled = list(msgs), False
        self.status = asyncio.get_running_loop().create_future()

    async def read(self):
        return self.msgs.pop(0)

    async def code(self):
        return await self.status

    def cancel(self):
        self.cancelled = True


class FakeClient:
    def __init__(self, call):
        self.call, self.streams = call, set()

    def start_generate(self, request, timeout_s):
        return self.call


def _stream(msgs) -> tuple[GenerationStream, FakeCall]:
    call = FakeCall(msgs)
    return GenerationStream(FakeClient(call), scheduler_pb2.GenerateRequest(request_id="r"), 1), call


async def test_a_stream_whose_last_message_was_read_is_not_cancelled_and_its_status_is_awaited():
    last = scheduler_pb2.GenerateResponse(request_id="r", token_ids=[5], finish_reason="length")
    stream, call = _stream([last])
    assert (await stream.next()).finish_reason == "length" and stream.finished
    stream.cancel()  # before messages() resumed
    assert not call.cancelled
    call.status.set_result(0)
    await asyncio.sleep(0)
    await stream._settling
    assert not call.cancelled


async def test_a_stream_cancelled_before_its_last_message_is_cancelled():
    stream, call = _stream([scheduler_pb2.GenerateResponse(request_id="r", token_ids=[5])])
    assert (await stream.next()).token_ids == [5] and not stream.finished
    stream.cancel()
    assert call.cancelled
