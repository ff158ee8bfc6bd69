"""FlushCache after a request was answered: what that request cached is flushed too. Its cache insert
(CacheRequests finished=true) is deferred to the loop's next cache call (scheduler_svc/cache_client.py); a FlushCache
sent by the client right after the answer must not be overtaken by it (the tree would hold the answered request's
prompt after the flush, and the next request with that prompt would find it cached), through the real cache, worker
and scheduler. The client's flush sends what is deferred first (CacheClient.flush, under the lock the loop holds
while it sends deferred operations); tests/scheduler/test_deferred_cache_ops.py checks that part deterministically."""

from __future__ import annotations

import threading

import grpc

from codeserve.v1 import scheduler_pb2
from tests.stack import generate, request

PROMPT = "def flush_me_please(a, b):\n    return a * b + 17\n\n\nclass Widget:\n    pass\n"


def test_a_flush_right_after_an_answer_flushes_what_that_request_cached(backend) -> None:
    backend.wait_idle()
    backend.scheduler.FlushCache(scheduler_pb2.FlushCacheRequest(), timeout=10)
    # a long request decoding meanwhile: the finished one's insert then rides on the loop's next Allocate
    background = backend.scheduler.Generate(request(text="import os\n", max_new_tokens=400, ignore_eos=True),
                                            timeout=300)
    def drain() -> None:
        try:
            for _ in background:
                pass
        except grpc.RpcError as err:  # the test cancels it at the end
            assert err.code() == grpc.StatusCode.CANCELLED, err

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        leftovers = []
        for i in range(8):
            prompt = f"# case {i}\n" + PROMPT
            out = generate(backend.scheduler, text=prompt, max_new_tokens=2)
            assert out.finish_reason == "length"
            backend.scheduler.FlushCache(scheduler_pb2.FlushCacheRequest(), timeout=10)
            again = generate(backend.scheduler, text=prompt, max_new_tokens=1)
            leftovers.append(again.cached_tokens)
            backend.scheduler.FlushCache(scheduler_pb2.FlushCacheRequest(), timeout=10)
        assert leftovers == [0] * 8, f"cached tokens found right after a flush: {leftovers}"
    finally:
        background.cancel()
        reader.join(timeout=30)
    backend.idle_check()
